"""A live session's window (docs/live.md, "The window"): a stream many times longer than it holds at most its groups,
opened by a whole key group, its state exactly a cold prefill of the window (its answers' logits are) and never more
than its window of tokens (the groups' text counted with their video), its positions bounded however long the
stream; an hour of frames leaves memory flat, and so does half an hour of a still screen, whose groups keep no
video."""

import numpy as np
import pytest
import torch

from engine import Engine, EngineConfig, FrameSampling, GenerationParams
from engine.live.window import LiveWindow
from engine.state.lm_state import state_of
from engine.worker.runner import ModelRunner
from live_helpers import cold_logits, play

# Tokens: the tiny models' prefix (44) and three whole groups of 2x2, each counted at its most text (25 tokens: the
# `<t seconds>` the latest time a stream can reach writes, and the markers).
WINDOW = 44 + 3 * 29


def noise_frames(count: int, seed: int = 0) -> np.ndarray:
    """(count, 64, 64, 3) uint8 frames of noise: every token changes, so q = 0.5 keeps half of every group."""
    return np.random.default_rng(seed).integers(0, 256, (count, 64, 64, 3), dtype=np.uint8)


def test_the_window_slides_a_key_group_at_a_time_and_starts_at_one():
    window = LiveWindow.of(None, 64 * 196, 196)  # a GPU's default: 64 whole groups of 14x14, sliding 8 at a time
    assert (window.groups, window.key_every) == (64, 8)
    assert [window.start(n) for n in (1, 64, 65, 72, 73)] == [0, 0, 8, 8, 16]
    assert all(window.is_key(window.start(n)) and n - window.start(n) <= 64 for n in range(1, 500))
    assert LiveWindow.of(8, 784, 4) == LiveWindow(8, 1)  # the offline models' 8-s span: one group at a time


@pytest.mark.parametrize("name", ["tiny-random", "tiny-random-qwen3.5"])
def test_a_stream_many_times_its_window_answers_as_a_cold_prefill_of_the_window(name, tiny_cache_dir, monkeypatch):
    asked = []
    prefill = ModelRunner.prefill

    def question(self, request):
        logits = prefill(self, request)
        asked.append(request.pruned)
        return logits

    monkeypatch.setattr(ModelRunner, "prefill", question)
    config = EngineConfig(model=name, device="cpu", cache_dir=tiny_cache_dir, live_window_tokens=WINDOW)
    params = GenerationParams(pruning_rate=0.5, max_new_tokens=3, ignore_eos=True, return_logits=True)
    frames = noise_frames(80)
    with Engine(config) as engine, engine.open_live(params) as live:
        streams = engine._worker.runner.live.streams
        for start in range(0, 80, 20):  # 40 groups of 4 tokens: the window of 3 slides 37 times
            play(live, frames[start : start + 20], fps=2, first=start)
            stats = live.stats()
            session = streams[live.id]
            assert [held.index for held in session.held] == list(range(start // 2 + 7, start // 2 + 10))
            assert 0 < stats["video_tokens_held"] < stats["kv_tokens_held"] <= WINDOW == stats["window_tokens"]
            # the state is the window, nothing else
            assert state_of(session.cache).tokens == session.tokens == stats["kv_tokens_held"]
            answer = live.ask("What changes?").result(60)
            groups = start // 2 + 10
            want = cold_logits(engine, frames, groups, "What changes?", answer.token_ids, 0.5)
            assert np.abs(answer.logits - want).max() < 1e-4
        assert stats["video_tokens_total"] == 40 * 4 and stats["video_tokens_held"] <= WINDOW
    for pruned in asked:
        assert pruned.retention[0][:4].all(), "the window opens with its key group whole"
        assert pruned.prefix_len <= WINDOW  # the stream's part of the question's prompt, then its tail
        triples = pruned.positions[1:].T.tolist()
        assert len(set(map(tuple, triples))) == len(triples)  # no two tokens at one position
        assert torch.equal(pruned.positions[0], torch.arange(pruned.positions.shape[1]))
    assert len({int(p.positions[1:].max()) for p in asked[1:]}) == 1, "positions do not grow with the stream"


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def test_an_hour_of_frames_pushed_as_fast_as_they_go_leaves_memory_flat(tiny_cache_dir):
    """3,600 s of 8 fps frames pushed as fast as the engine takes them, sampled at 0.1 fps: 180 groups through a
    window of three, every other frame never due. Resident memory after the first ten minutes of the stream
    grows by less than 30 MB to the end."""
    frames = noise_frames(15, seed=1)
    config = EngineConfig(model="tiny-random", device="cpu", cache_dir=tiny_cache_dir, live_window_tokens=WINDOW)
    sampling = FrameSampling(fps=0.1)
    with (
        Engine(config) as engine,
        engine.open_live(GenerationParams(pruning_rate=0.5, frame_sampling=sampling)) as live,
    ):
        for index in range(3600 * 8):
            live.push(frames[index % 15], index / 8)
            if index % 160 == 80:  # a group formed: wait for the engine rather than drop
                assert live.wait(60)
            if index == 600 * 8:
                early = resident_bytes()
        assert live.wait(60)
        grown = resident_bytes() - early
        stats = live.stats()
        assert stats["frames_received"] == 3600 * 8 and stats["frames_sampled"] == 360
        assert stats["video_tokens_total"] == 180 * 4 and stats["video_tokens_kept"] > 180
        assert stats["kv_tokens_held"] <= WINDOW
        assert grown < 30 << 20, grown


def test_half_an_hour_of_a_still_screen_holds_no_more_than_the_window_and_leaves_memory_flat(tiny_cache_dir):
    """A shared screen nobody touches: every frame the same, so at q = 0.7 each group after the first keeps no video
    token, yet each brings its `<t seconds>` and markers. 30 minutes of capture time at 1 fps, sampled at 0.25 fps
    (225 groups, some nine windows, waited for): the state never holds more than the default window (the planned
    video tokens of a request, 784 here), every token counted, and keeps the screen's picture (its key group, whole),
    a question's prompt is that and its own tail, and resident memory after the first ten minutes grows by less than
    30 MB to the end.
    Before the window counted text, the state held 16,938 tokens after 1,000 groups of 2 fps while
    video_tokens_held said 4."""
    screen = np.full((64, 64, 3), 200, np.uint8)
    screen[20:40, 10:50] = (30, 60, 220)  # a window on the desktop
    config = EngineConfig(model="tiny-random", device="cpu", cache_dir=tiny_cache_dir)
    sampling = FrameSampling(fps=0.25)
    with (
        Engine(config) as engine,
        engine.open_live(GenerationParams(pruning_rate=0.7, max_new_tokens=2, frame_sampling=sampling)) as live,
    ):
        window = live.stats()["window_tokens"]
        for second in range(30 * 60):
            live.push(screen, float(second))
            if second % 8 == 4:  # a group formed: wait for the engine rather than drop
                assert live.wait(60)
            if second == 10 * 60:
                early = resident_bytes()
            if second % 600 == 599:
                stats = live.stats()
                assert stats["video_tokens_held"] == 4 and stats["kv_tokens_held"] <= window, stats
                answer = live.ask("What is on the screen?").result(60).stats
                assert answer["prompt_tokens"] - answer["prefill_tokens"] == stats["kv_tokens_held"]
        assert live.wait(60)
        grown = resident_bytes() - early
        stats = live.stats()
        assert stats["frames_sampled"] == 450 and stats["video_tokens_kept"] == 4 and stats["frames_dropped"] == 0
        session = engine._worker.runner.live.streams[live.id]
        # the prefix (44) and 25 groups at their most text (29 tokens each) fit 784; the window slides 3 at a time
        assert window == 784 and stats["kv_tokens_held"] <= window and session.window == LiveWindow(25, 3)
        assert 25 - 3 < len(session.held) <= 25
        assert session.held[0].video_tokens == 4  # the screen's picture: the key group, whole
        assert grown < 30 << 20, grown
