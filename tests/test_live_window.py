"""A live session's window (docs/live.md): a stream many times longer than it keeps at most its window of tokens
(the groups' text counted with their kept video) in the state, answers go on coming, positions are never used twice;
an hour of frames leaves memory flat, and so does half an hour of a still screen, whose groups keep no video."""

import numpy as np
import pytest
import torch

from engine import Engine, EngineConfig, FrameSampling, GenerationParams
from engine.state.lm_state import ATTENTION, LINEAR, drop_slots, new_cache, state_of
from engine.worker.runner import ModelRunner
from live_helpers import play

# Tokens: the tiny models' prefix (44) and about three groups of 2x2, each with some 15 tokens of `<t seconds>` and
# markers.
WINDOW = 100


def noise_frames(count: int, seed: int = 0) -> np.ndarray:
    """(count, 64, 64, 3) uint8 frames of noise: every token changes, so q = 0.5 keeps half of every group."""
    return np.random.default_rng(seed).integers(0, 256, (count, 64, 64, 3), dtype=np.uint8)


@pytest.mark.parametrize("name", ["tiny-random", "tiny-random-qwen3.5"])
def test_a_stream_many_times_its_window_holds_at_most_it_and_answers_with_fresh_positions(
    name, tiny_cache_dir, monkeypatch
):
    asked = []
    prefill = ModelRunner.prefill

    def question(self, request):
        logits = prefill(self, request)
        asked.append(request.pruned)
        return logits

    monkeypatch.setattr(ModelRunner, "prefill", question)
    config = EngineConfig(model=name, device="cpu", cache_dir=tiny_cache_dir, live_window_tokens=WINDOW)
    with (
        Engine(config) as engine,
        engine.open_live(GenerationParams(pruning_rate=0.5, max_new_tokens=4, ignore_eos=True)) as live,
    ):
        stream = engine._worker.runner.live.streams
        frames = noise_frames(80)
        for start in range(0, 80, 20):  # 40 groups of 4 tokens, about half of them kept: some seven windows
            play(live, frames[start : start + 20], fps=2, first=start)
            stats = live.stats()
            assert 0 < stats["video_tokens_held"] < stats["kv_tokens_held"] <= WINDOW == stats["window_tokens"]
            session = stream[live.id]
            assert state_of(session.cache).tokens == session.tokens == stats["kv_tokens_held"]  # no slot left behind
            assert len(session.held) <= 3
            assert live.ask("What changes?").result(60).stats["generated_tokens"] == 4
        assert stats["video_tokens_total"] == 40 * 4 and stats["video_tokens_kept"] >= 10 * stats["video_tokens_held"]
    for pruned in asked:
        assert pruned.prefix_len <= WINDOW  # the stream's part of the question's prompt, then its tail
        triples = pruned.positions[1:].T.tolist()
        assert len(set(map(tuple, triples))) == len(triples)  # no two tokens at one position
        assert torch.equal(pruned.positions[0], torch.arange(pruned.positions.shape[1]))
    later_video = [p.positions[1:, p.visual_mask].min() for p in asked]
    assert all(a < b for a, b in zip(later_video, later_video[1:]))  # the window moves on, never back


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def test_an_hour_of_frames_pushed_as_fast_as_they_go_leaves_memory_flat(tiny_cache_dir):
    """3,600 s of 8 fps frames pushed as fast as the engine takes them, sampled at 0.1 fps: 180 groups through a
    window of about six, every other frame never due. Resident memory after the first ten minutes of the stream
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
    (225 groups, some five windows, waited for): the state never holds more than the default window (the planned
    video tokens of a request, 784 here) and keeps the screen's picture (its first group), a question's prompt is
    that and its own tail, and resident memory after the first ten minutes grows by less than 30 MB to the end.
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
        assert window == 784 and window - 20 < stats["kv_tokens_held"] <= window
        assert grown < 30 << 20, grown


def test_slots_taken_out_of_the_kv_leave_the_others_in_order_and_room_to_grow():
    cache = new_cache((ATTENTION, LINEAR))
    keys, values = torch.randn(1, 2, 10, 4), torch.randn(1, 2, 10, 4)
    cache.layers[0].update(keys, values)
    drop_slots(cache, 3, 7)
    kept = [0, 1, 2, 7, 8, 9]
    assert torch.equal(cache.layers[0].keys, keys[:, :, kept]) and torch.equal(
        cache.layers[0].values, values[:, :, kept]
    )
    more = torch.randn(1, 2, 1, 4)
    cache.layers[0].update(more, more)  # appends after the kept slots, in place
    assert torch.equal(cache.layers[0].keys[:, :, -1:], more) and cache.get_seq_length() == 7
