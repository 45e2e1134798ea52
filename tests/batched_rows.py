"""Rows of different prompts decoded in one batch, as the hybrid-state tests (Qwen3.5's Gated DeltaNet,
Nemotron-H's Mamba-2) compare them with the same requests answered alone."""

from engine import Engine


def answered_in_one_batch(engine: Engine, videos, workload, params) -> dict:
    """{(video index, q, question): Answer} for a workload submitted in one burst. Checks that the rows had
    prompts of as many lengths as there are rows, decoded together, and gave their state back when done."""
    with engine.paused():
        streams = {item: engine.submit(videos[item[0]], item[2], params(item[1])) for item in workload}
    answers = {item: stream.result(120) for item, stream in streams.items()}
    assert engine._worker.runner.batch.cache is None  # every finished row gave its state back
    assert len({answer.stats["prompt_tokens"] for answer in answers.values()}) == len(workload)
    for answer in answers.values():
        assert answer.stats["decode_batch_max"] == len(workload)
    return answers
