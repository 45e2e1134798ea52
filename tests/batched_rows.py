"""Rows of different prompts decoded in one batch, as the hybrid-state tests (Qwen3.5's Gated DeltaNet,
Nemotron-H's Mamba-2) compare them with the same requests answered alone."""

import dataclasses

from engine import Answer, Engine


def answered_in_one_batch(engine: Engine, videos, workload, params) -> dict:
    """{workload item: Answer} for a workload submitted in one burst. An item is (video index, q, question),
    or (video index, q, question, max_new_tokens): then `params(q, max_new_tokens)`, else `params(q)`. Checks
    that the rows had prompts of as many lengths as there are rows, decoded together, and gave their state
    back when done."""
    with engine.paused():
        streams = {item: engine.submit(videos[item[0]], item[2], params(item[1], *item[3:])) for item in workload}
    answers = {item: stream.result(120) for item, stream in streams.items()}
    assert engine._worker.runner.batch.cache is None  # every finished row gave its state back
    assert len({answer.stats["prompt_tokens"] for answer in answers.values()}) == len(workload)
    for answer in answers.values():
        assert answer.stats["decode_batch_max"] == len(workload)
    return answers


def staggered(workload, new_tokens) -> list:
    """The workload's items with one max_new_tokens each, all different, so that the rows leave the batch one
    by one and each leave splits the batch's state back into the rows that stay (no two leave together)."""
    assert len(set(new_tokens)) == len(new_tokens) == len(workload)
    return [(*item, tokens) for item, tokens in zip(workload, new_tokens)]


def first_tokens(answer: Answer, count: int) -> Answer:
    """The answer as if it had stopped after `count` tokens: what a greedy request with that max_new_tokens
    gives, so an answer alone of the longest length stands for every shorter one."""
    assert len(answer.token_ids) >= count
    logits = None if answer.logits is None else answer.logits[:count]
    return dataclasses.replace(answer, token_ids=answer.token_ids[:count], logits=logits)
