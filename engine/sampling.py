"""Choosing the next token, and turning tokens into text as they arrive."""

import torch


def next_token(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None) -> int:
    """logits: (V,) float32. temperature 0 is greedy; otherwise nucleus sampling with top_p."""
    if temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        # keep the smallest prefix whose mass reaches top_p (always at least the top token)
        outside = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= top_p
        sorted_probs[outside] = 0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


class Detokenizer:
    """Incremental detokenizer: returns only the new text each token adds.

    Decodes a short window (from the last emitted boundary) rather than the whole answer on every token.
    Byte-level tokens can end mid-character; such a tail decodes to U+FFFD and is held back until the
    character completes, or until `flush` at the end of the answer.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self._window_start = 0  # the window's text up to _emitted_end was already returned
        self._emitted_end = 0

    def _text(self, start: int, end: int | None = None) -> str:
        return self.tokenizer.decode(self.token_ids[start:end], skip_special_tokens=True)

    def add(self, token_id: int) -> str:
        self.token_ids.append(token_id)
        done = self._text(self._window_start, self._emitted_end)
        text = self._text(self._window_start)
        if len(text) <= len(done) or text.endswith("\ufffd"):
            return ""
        self._window_start, self._emitted_end = self._emitted_end, len(self.token_ids)
        return text[len(done) :]

    def flush(self) -> str:
        """What is still held back (an incomplete character at the very end)."""
        done = self._text(self._window_start, self._emitted_end)
        text = self._text(self._window_start)
        self._window_start = self._emitted_end = len(self.token_ids)
        return text[len(done) :]
