"""One GPU, many users: batched equals alone, dedup, caches, cancellation, the ViT patch budget."""

import dataclasses
import shutil
import time

import pytest
import torch

from app_harness import wait_until
from engine import Engine, EngineConfig, GenerationParams
from engine.config import FrameSampling

FRAME_SAMPLING = FrameSampling(fps=4.0, max_frames=8, max_pixels_per_frame=160 * 128)
KINDS = ("moving_object", "pan", "scene_cut")
# (video, q) pairs: every video twice, q = 0 included.
WORKLOAD = [(0, 0.0), (0, 0.7), (1, 0.5), (1, 0.0), (2, 0.3), (2, 0.9)]


def make_engine(tiny_cache_dir, **overrides) -> Engine:
    return Engine(
        EngineConfig(
            model="tiny-random", device="cpu", cache_dir=tiny_cache_dir, frame_sampling=FRAME_SAMPLING, **overrides
        )
    )


def params(q: float, tokens: int = 12) -> GenerationParams:
    return GenerationParams(pruning_rate=q, max_new_tokens=tokens, ignore_eos=True, return_logits=True)


def assert_same_answer(got, want, what) -> None:
    """Same tokens and, at every step, the same distribution: a random model's greedy tokens survive
    small errors in a reused or batched KV entry that the logits show. float32 sums in another order
    when the batch shape changes: measured up to 1.1e-5 after 12 steps, where one corrupted key vector
    moves them by 1e-3 and more."""
    assert got.token_ids == want.token_ids, what
    torch.testing.assert_close(torch.from_numpy(got.logits), torch.from_numpy(want.logits), atol=2e-5, rtol=0, msg=what)


@pytest.fixture(scope="module")
def videos(clip):
    return [clip(kind, seconds=2.0) for kind in KINDS]


@pytest.fixture(scope="module")
def alone(tiny_cache_dir, videos):
    """The answer to each workload item, run one at a time on a fresh engine each."""
    answers = {}
    for video, q in WORKLOAD:
        with make_engine(tiny_cache_dir) as engine:
            answers[(video, q)] = engine.submit(videos[video], "What happens?", params(q)).result(120)
    return answers


def test_batched_equals_alone(tiny_cache_dir, videos, alone):
    with make_engine(tiny_cache_dir) as engine:
        with engine.paused():
            streams = {item: engine.submit(videos[item[0]], "What happens?", params(item[1])) for item in WORKLOAD}
        answers = {item: stream.result(120) for item, stream in streams.items()}
        assert engine.vision.forwards == 1  # three distinct videos, one forward
    for item, answer in answers.items():
        assert_same_answer(answer, alone[item], item)
        assert answer.stats["vit_batch_requests"] == len(WORKLOAD)
        assert answer.stats["decode_batch_max"] == len(WORKLOAD)
    kept = {item: answers[item].stats["video_tokens_kept"] for item in WORKLOAD}
    assert kept[(0, 0.7)] < kept[(0, 0.0)] and kept[(2, 0.9)] < kept[(2, 0.3)]


def test_identical_bytes_are_encoded_once(tiny_cache_dir, videos, tmp_path):
    copy = shutil.copy(videos[0], tmp_path / "same-bytes-other-name.mp4")
    with make_engine(tiny_cache_dir) as engine:
        with engine.paused():
            first = engine.submit(videos[0], "What happens?", params(0.5))
            second = engine.submit(copy, "Is there a square?", params(0.2))
        a, b = first.result(120), second.result(120)
        assert engine.vision.forwards == 1
    assert a.stats["vit_batch_requests"] == b.stats["vit_batch_requests"] == 2


def test_follow_up_hits_both_caches_and_matches_cold(tiny_cache_dir, videos):
    history = [("What happens?", "A square moves.")]
    with make_engine(tiny_cache_dir) as warm:
        first = warm.submit(videos[0], "What happens?", params(0.6)).result(120)
        follow = warm.submit(videos[0], "Which colour is it?", params(0.6), history=history).result(120)
    with make_engine(tiny_cache_dir) as cold_engine:
        cold = cold_engine.submit(videos[0], "Which colour is it?", params(0.6), history=history).result(120)
    assert not first.stats["vit_cache_hit"] and not first.stats["prefix_cache_hit"]
    assert follow.stats["vit_cache_hit"] and follow.stats["prefix_cache_hit"]
    assert not cold.stats["prefix_cache_hit"]
    assert_same_answer(follow, cold, "follow-up against cold")
    assert follow.stats["prompt_tokens"] == cold.stats["prompt_tokens"]


def test_follow_up_quoting_the_answer_reuses_the_whole_conversation(tiny_cache_dir, videos):
    with make_engine(tiny_cache_dir) as engine:
        first = engine.submit(videos[2], "What happens?", params(0.5)).result(120)
        history = [("What happens?", engine.loaded.processor.tokenizer.decode(first.token_ids))]
        follow = engine.submit(videos[2], "Why?", params(0.5), history=history).result(120)
    assert first.stats["prefill_tokens"] == first.stats["prompt_tokens"]
    # The whole first prompt and the answer's leading tokens come from the cache, not just [system + video].
    # (The tiny model's random bytes do not survive decode -> encode, so the reuse stops inside the answer.)
    assert follow.stats["prefix_cache_hit"]
    assert follow.stats["prefill_tokens"] < follow.stats["prompt_tokens"] - first.stats["prompt_tokens"]


def test_other_rate_misses_the_prefix_cache(tiny_cache_dir, videos):
    with make_engine(tiny_cache_dir) as engine:
        engine.submit(videos[1], "What happens?", params(0.6)).result(120)
        other = engine.submit(videos[1], "What happens?", params(0.3)).result(120)
    assert other.stats["vit_cache_hit"] and not other.stats["prefix_cache_hit"]


def test_other_method_misses_the_prefix_cache_and_answers_as_cold(tiny_cache_dir, videos):
    """Two methods at one rate keep as many tokens, but not the same ones: the conversation state of one must
    not serve the other. On Qwen2.5-VL the video is one run of identical ids (no text between its groups, as
    Qwen3-VL's timestamps), so both prompts have the very same ids and only the key tells them apart."""
    vidcom2 = dataclasses.replace(params(0.5), pruning_method="vidcom2")

    def qwen25_engine():
        return Engine(
            EngineConfig(
                model="tiny-random-qwen2.5-vl", device="cpu", cache_dir=tiny_cache_dir, frame_sampling=FRAME_SAMPLING
            )
        )

    with qwen25_engine() as engine:
        evs = engine.submit(videos[1], "What happens?", params(0.5)).result(120)
        other = engine.submit(videos[1], "What happens?", vidcom2).result(120)
        again = engine.submit(videos[1], "What happens?", vidcom2).result(120)
    with qwen25_engine() as cold_engine:
        cold = cold_engine.submit(videos[1], "What happens?", vidcom2).result(120)
    assert evs.stats["prompt_tokens"] == other.stats["prompt_tokens"]
    assert other.stats["vit_cache_hit"] and not other.stats["prefix_cache_hit"] and again.stats["prefix_cache_hit"]
    assert (evs.stats["pruning_method"], other.stats["pruning_method"]) == ("evs", "vidcom2")
    assert_same_answer(other, cold, "vidcom2 after evs against cold")


def test_the_methods_on_one_question_batched_equal_alone(tiny_cache_dir, videos):
    """The page's compare view: one question, every method at one rate, one vision forward, decoding together."""
    methods = [dataclasses.replace(params(0.7), pruning_method=method) for method in ("evs", "vidcom2", "uniform")]
    with make_engine(tiny_cache_dir) as engine:
        with engine.paused():
            streams = [engine.submit(videos[0], "What happens?", p) for p in methods]
        answers = [stream.result(120) for stream in streams]
        assert engine.vision.forwards == 1
    for p, answer in zip(methods, answers):
        with make_engine(tiny_cache_dir) as fresh:
            assert_same_answer(answer, fresh.submit(videos[0], "What happens?", p).result(120), p.pruning_method)
        assert answer.stats["decode_batch_max"] == 3 and answer.stats["pruning_method"] == p.pruning_method


def test_caches_stay_within_their_byte_bounds(tiny_cache_dir, videos):
    with make_engine(tiny_cache_dir) as probe:
        probe.submit(videos[0], "What happens?", params(0.5)).result(120)
        feature_bytes = probe.vision.cache.bytes_used
        prefix_bytes = probe.prefix_cache.lru.bytes_used
    # room for one entry of each, not two
    bounds = dict(feature_cache_bytes=int(feature_bytes * 1.5), prefix_cache_bytes=int(prefix_bytes * 1.5))
    with make_engine(tiny_cache_dir, **bounds) as engine:
        for video in videos:
            engine.submit(video, "What happens?", params(0.5)).result(120)
            assert engine.vision.cache.bytes_used <= bounds["feature_cache_bytes"]
            assert engine.prefix_cache.lru.bytes_used <= bounds["prefix_cache_bytes"]
        # The worker stores a finished conversation just after its "done" event, which result() returns on:
        # a later request is always admitted after that store, but a look from this thread may come first.
        assert wait_until(lambda: len(engine.prefix_cache.lru) == 1, timeout_s=10)
        assert len(engine.vision.cache) == 1
        again = engine.submit(videos[0], "What happens?", params(0.5)).result(120)
        assert not again.stats["vit_cache_hit"]  # evicted by the later videos
        last = engine.submit(videos[2], "What happens?", params(0.5)).result(120)
        assert not last.stats["vit_cache_hit"]


def test_cancel_mid_stream_leaves_the_others_unchanged(tiny_cache_dir, videos, alone):
    with make_engine(tiny_cache_dir) as engine:
        with engine.paused():
            victim = engine.submit(
                videos[1], "What happens?", GenerationParams(pruning_rate=0.5, max_new_tokens=400, ignore_eos=True)
            )
            others = {item: engine.submit(videos[item[0]], "What happens?", params(item[1])) for item in WORKLOAD[:2]}
        for event in victim:
            if event.kind == "text":
                victim.cancel()
                break
        answer = victim.result(120)
        results = {item: stream.result(120) for item, stream in others.items()}
        deadline = time.monotonic() + 10
        while engine.running_requests and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.running_requests == 0
        assert len(engine._worker.runner.batch) == 0 and engine._worker.runner.batch.cache is None
    assert answer.cancelled and answer.stats["generated_tokens"] < 400
    for item, result in results.items():
        assert_same_answer(result, alone[item], item)


def test_the_patch_budget_splits_the_vit_forward(tiny_cache_dir, videos, alone):
    with make_engine(tiny_cache_dir, vit_patch_budget=1) as engine:
        with engine.paused():
            streams = {item: engine.submit(videos[item[0]], "What happens?", params(item[1])) for item in WORKLOAD}
        answers = {item: stream.result(120) for item, stream in streams.items()}
        assert engine.vision.forwards == len(KINDS)
    for item, answer in answers.items():
        assert_same_answer(answer, alone[item], item)
        assert answer.stats["vit_batch_requests"] == 2  # the two requests on each video share its forward


def test_a_failing_vision_forward_fails_its_requests_and_the_engine_keeps_serving(tiny_cache_dir, videos, monkeypatch):
    with make_engine(tiny_cache_dir) as engine:
        real_encode = engine.family.encode
        calls = []

        def broken_once(*args, **kwargs):
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("simulated device fault")
            return real_encode(*args, **kwargs)

        monkeypatch.setattr(engine.family, "encode", broken_once)
        with pytest.raises(RuntimeError, match="Encoding the video failed"):
            engine.submit(videos[0], "What happens?", params(0.5)).result(60)
        answer = engine.submit(videos[0], "What happens?", params(0.5)).result(60)
    assert answer.stats["generated_tokens"] == 12


def test_prefill_budget_staggers_joins_without_changing_tokens(tiny_cache_dir, videos, alone):
    """With room for one prompt per iteration, requests join the decode batch one by one (a decode step
    for the running ones between two prefills), and every answer is still what it is alone."""
    with make_engine(tiny_cache_dir, prefill_token_budget=1) as engine:
        with engine.paused():
            streams = {item: engine.submit(videos[item[0]], "What happens?", params(item[1])) for item in WORKLOAD[:3]}
        answers = {item: stream.result(120) for item, stream in streams.items()}
    for item, answer in answers.items():
        assert_same_answer(answer, alone[item], item)
        assert answer.stats["vit_batch_requests"] == 3
    assert all(answer.stats["decode_batch_max"] == 3 for answer in answers.values())
