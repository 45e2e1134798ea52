"""A live session's window (docs/live.md): a stream many times longer than it keeps at most its window of video
tokens in the state, answers go on coming, positions are never used twice; an hour of frames leaves memory flat."""

import numpy as np
import pytest
import torch

from engine import Engine, EngineConfig, FrameSampling, GenerationParams
from engine.state.lm_state import ATTENTION, LINEAR, drop_slots, new_cache, state_of
from engine.worker.runner import ModelRunner
from live_helpers import play

WINDOW = 12  # video tokens: three groups of 2x2 at q = 0


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
            assert 0 < stats["video_tokens_held"] <= WINDOW == stats["window_tokens"]
            session = stream[live.id]
            assert state_of(session.cache).tokens == session.tokens  # no slot left behind
            assert live.ask("What changes?").result(60).stats["generated_tokens"] == 4
        assert stats["video_tokens_total"] == 40 * 4 and stats["video_tokens_kept"] >= 6 * WINDOW
    for pruned in asked:
        assert pruned.visual_mask.sum() <= WINDOW
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
        assert stats["video_tokens_total"] == 180 * 4 and stats["video_tokens_kept"] > 20 * WINDOW
        assert stats["video_tokens_held"] <= WINDOW
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
