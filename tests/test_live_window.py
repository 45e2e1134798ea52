"""A live session's window (docs/live.md, "The window"): a stream many times longer than it holds at most its groups,
opened by a whole key group, its state exactly a cold prefill of the window (its answers' logits are), its positions
bounded however long the stream; an hour of frames leaves memory flat."""

import numpy as np
import pytest

from engine import Engine, EngineConfig, FrameSampling, GenerationParams
from engine.live.window import LiveWindow
from engine.state.lm_state import state_of
from engine.worker.runner import ModelRunner
from live_helpers import cold_logits, play

WINDOW = 12  # video tokens: three whole groups of 2x2


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
            assert state_of(session.cache).tokens == session.tokens  # the state is the window, nothing else
            answer = live.ask("What changes?").result(60)
            groups = start // 2 + 10
            want = cold_logits(engine, frames, groups, "What changes?", answer.token_ids, 0.5)
            assert np.abs(answer.logits - want).max() < 1e-4
        assert stats["video_tokens_total"] == 40 * 4 and stats["video_tokens_held"] <= WINDOW
    for pruned in asked:
        assert pruned.retention[0][:4].all(), "the window opens with its key group whole"
        assert pruned.visual_mask.sum() <= WINDOW
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
        assert stats["video_tokens_total"] == 180 * 4 and stats["video_tokens_kept"] > 20 * WINDOW
        assert stats["video_tokens_held"] <= WINDOW
        assert grown < 30 << 20, grown
