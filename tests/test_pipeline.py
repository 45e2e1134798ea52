"""Pipelined admission through a real engine: a burst's first tokens arrive between its vision forwards,
shortest work first, with every answer what it is alone (tests/test_serving.py checks the logits)."""

import threading

import pytest

from app_harness import wait_until
from engine import Engine, EngineConfig, GenerationParams, Stream
from engine.config import FrameSampling

FRAME_SAMPLING = FrameSampling(fps=4.0, max_frames=8, max_pixels_per_frame=160 * 128)


@pytest.fixture
def pushes(monkeypatch):
    """Every event the worker pushes, in the order it pushed them: (request id, kind, text)."""
    log, lock = [], threading.Lock()
    push = Stream.push

    def recording(stream, event):
        with lock:
            log.append((stream.request_id, event.kind, event.text))
        push(stream, event)

    monkeypatch.setattr(Stream, "push", recording)
    return log


def burst(tiny_cache_dir, paths, pushes, **config) -> tuple[list, list[Stream], int]:
    """Answers to one burst (queued in the order of paths), its streams and the vision forwards run."""
    engine = Engine(
        EngineConfig(
            model="tiny-random", device="cpu", cache_dir=tiny_cache_dir, frame_sampling=FRAME_SAMPLING, **config
        )
    )
    params = GenerationParams(pruning_rate=0.5, max_new_tokens=6, ignore_eos=True)
    with engine:
        with engine.paused():
            streams = []
            for path in paths:
                streams.append(engine.submit(path, "What happens?", params))
                queued = (streams[-1].request_id, "status", "waiting for the GPU")
                assert wait_until(lambda queued=queued: queued in pushes, timeout_s=60)
        answers = [stream.result(120) for stream in streams]
        return answers, streams, engine.vision.forwards


def first_index(log, request_id, kind, prefix="") -> int:
    return next(
        i for i, (rid, k, text) in enumerate(log) if rid == request_id and k == kind and text.startswith(prefix)
    )


def test_first_tokens_arrive_between_the_vision_forwards(tiny_cache_dir, clip, pushes):
    paths = [clip(kind, seconds=2.0) for kind in ("moving_object", "pan", "scene_cut")]
    answers, streams, forwards = burst(tiny_cache_dir, paths, pushes, vit_patch_budget=1)  # one video per forward
    assert forwards == 3
    encoded = sorted(streams, key=lambda s: first_index(pushes, s.request_id, "status", "encoding"))
    starts = [first_index(pushes, s.request_id, "status", "encoding") for s in encoded]
    first_tokens = [first_index(pushes, s.request_id, "evs") for s in encoded]
    # Each video's EVS picture (and its prefill) comes before the next video's forward starts.
    assert first_tokens[0] < starts[1] and first_tokens[1] < starts[2]
    assert all(a.stats["generated_tokens"] == 6 for a in answers)
    ttfts = [a.stats["ttft_s"] for a in sorted(answers, key=lambda a: a.stats["ttft_s"])]
    assert ttfts[0] < ttfts[-1]


def test_the_shorter_video_of_a_burst_goes_first(tiny_cache_dir, clip, pushes):
    long, short = clip("pan", seconds=2.0), clip("pan", seconds=1.0)  # 8 frames against 4
    answers, streams, _ = burst(tiny_cache_dir, [long, short], pushes, vit_patch_budget=1)
    long_start, short_start = (first_index(pushes, s.request_id, "status", "encoding") for s in streams)
    assert short_start < long_start
    assert answers[1].stats["ttft_s"] < answers[0].stats["ttft_s"]


def test_overlapping_pauses_hold_admission_until_the_last_ends(tiny_cache_dir, clip):
    """Two bursts at once (two users sweeping) must not end each other's hold early."""
    engine = Engine(
        EngineConfig(model="tiny-random", device="cpu", cache_dir=tiny_cache_dir, frame_sampling=FRAME_SAMPLING)
    )
    with engine:
        outer = engine.paused()
        outer.__enter__()
        with engine.paused():
            pass
        assert not engine._worker.admitting.is_set()
        outer.__exit__(None, None, None)
        assert engine._worker.admitting.is_set()
