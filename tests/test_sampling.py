"""Token choice and incremental detokenization."""

import torch

from engine.checkpoints.tokenizer import build_tokenizer
from engine.detokenize import Detokenizer
from engine.worker.token_choice import next_token


def test_streamed_pieces_add_up_to_the_full_text_across_split_characters():
    tokenizer = build_tokenizer()
    text = "Ein Würfel → rollt 🎲 nach links."
    ids = tokenizer.encode(text)  # byte-level: multi-byte characters span several tokens
    decoder = Detokenizer(tokenizer)
    pieces = [decoder.add(i) for i in ids]
    assert "".join(pieces) + decoder.flush() == text
    assert all("\ufffd" not in piece for piece in pieces)
    assert len([p for p in pieces if p]) > 10  # it streams, not one blob at the end


def test_flush_returns_an_incomplete_tail():
    tokenizer = build_tokenizer()
    decoder = Detokenizer(tokenizer)
    ids = tokenizer.encode("ok 🎲")
    pieces = [decoder.add(i) for i in ids[:-1]]  # the last byte of the emoji never comes
    assert "".join(pieces) == "ok "
    assert decoder.flush() == tokenizer.decode(ids[:-1])[len("ok ") :]


def test_greedy_and_nucleus():
    logits = torch.tensor([0.0, 3.0, 2.9, -5.0])
    assert next_token(logits, 0.0, 1.0, None) == 1
    generator = torch.Generator().manual_seed(0)
    draws = {next_token(logits, 1.0, 0.5, generator) for _ in range(50)}
    assert draws == {1}  # top-p 0.5 keeps only the most likely token here
    draws = {next_token(logits, 1.0, 1.0, generator) for _ in range(200)}
    assert {1, 2} <= draws
