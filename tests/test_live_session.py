"""A live session's life: every mistake a sentence with the others unaffected, frames dropped and counted when the
engine is behind, state freed on close and cancel (the hybrid model's too), shutdown, and live groups sharing the
vision forward with uploads without either starving. docs/live.md."""

import dataclasses
import math
import threading
import time

import numpy as np
import pytest

from engine import BusyError, Engine, EngineConfig, GenerationParams, InputError
from engine.live import group as live_group
from engine.live.session import RECENT_GROUPS
from engine.worker.vision import VisionEncoder
from live_helpers import clip_frames, play, write_lossless

Q = GenerationParams(pruning_rate=0.5, max_new_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def two_sessions_engine(tiny_cache_dir):
    with Engine(
        EngineConfig(model="tiny-random", device="cpu", cache_dir=tiny_cache_dir, max_live_sessions=2)
    ) as running:
        yield running


FRAME = clip_frames(1_000_020, fps=2)[0]


@pytest.mark.parametrize(
    "frame, t_s, sentence",
    [
        (FRAME[..., :2], 1.0, "an \\(height, width, 3\\) RGB array"),
        (FRAME.astype(np.float32), 1.0, "uint8 pixels"),
        ([[0, 0, 0]], 1.0, "an \\(height, width, 3\\) RGB array"),
        (FRAME, math.nan, "finite number of seconds"),
        (FRAME, "1.0", "finite number of seconds"),
        (FRAME, 0.5, "capture order"),
        (np.zeros((1, 20_000, 3), np.uint8), 1.0, "longer side may be at most 200 times"),
        (np.zeros((5000, 5000, 3), np.uint8), 1.0, "pixels this server takes"),
        (np.zeros((32, 48, 3), np.uint8), 1.0, "open a new session for another size"),
        (np.zeros((1, 1, 3), np.uint8), 1.0, "The frame is 1x1 pixels; this model reads pictures with each side at"),
    ],
)
def test_a_bad_frame_gets_one_sentence_and_the_session_goes_on(two_sessions_engine, frame, t_s, sentence):
    with two_sessions_engine.open_live(Q) as live:
        live.push(FRAME, 0.5)
        with pytest.raises(InputError, match=sentence) as refused:
            live.push(frame, t_s)
        assert "\n" not in str(refused.value) and str(refused.value).endswith(".")
        play(live, clip_frames(1_000_020, fps=2)[1:4], fps=2, first=2)
        assert live.ask("What moves?").result(60).stats["generated_tokens"] == 6


@pytest.mark.parametrize("huge_s", [1e200, 1e308, 9e307])
def test_a_time_past_what_the_clock_and_the_prompt_carry_is_one_sentence_and_the_next_good_frame_is_taken(
    two_sessions_engine, huge_s
):
    """After a frame at 0, a time of 1e308 or 9e307 overflowed the capture clock's tick count after push had
    recorded it (every later frame then out of order), and 1e200 wrote a 200-digit `<t seconds>`: each is refused
    before anything is recorded, and the session goes on from the next good frame."""
    frames = clip_frames(1_000_029, fps=2)[:4]
    with two_sessions_engine.open_live(Q) as live:
        live.push(frames[0], 0.0)
        with pytest.raises(
            InputError, match="^A frame's capture time must be within 10,000,000,000 seconds"
        ) as refused:
            live.push(frames[1], huge_s)
        assert "\n" not in str(refused.value) and str(refused.value).endswith(".")
        play(live, frames[1:], fps=2, first=1)
        stats = live.stats()
        assert (stats["frames_received"], stats["frames_sampled"], stats["video_tokens_total"]) == (4, 4, 2 * 4)
        answer = live.ask("What moves?").result(60)
        assert answer.stats["media"][0]["timestamps_s"] == [0.25, 1.25]


def test_a_request_answered_at_its_first_token_leaves_the_live_prefill_its_budget(two_sessions_engine, clip):
    """The live groups' prefill budget is what the iteration's prompts left; a request that ends at its first
    token has let go of its prompt by then, so the budget is counted before the prompts are prefilled."""
    engine = two_sessions_engine
    with engine.open_live(Q) as live:
        play(live, clip_frames(1_000_027, fps=2)[:4], fps=2)
        decoding = engine.submit(
            clip("pan", seconds=2.0), "What moves?", GenerationParams(max_new_tokens=300, ignore_eos=True)
        )
        next(event for event in decoding if event.kind == "text")
        answer = engine.submit(clip("scene_cut", seconds=2.0), "What moves?", GenerationParams(max_new_tokens=1))
        assert answer.result(60).stats["generated_tokens"] == 1
        assert decoding.result(60).stats["generated_tokens"] == 300  # its iteration went on
        assert live.ask("What moves?").result(60).stats["generated_tokens"] == 6


def test_too_many_sessions_a_closed_session_and_an_early_question_each_get_a_sentence(two_sessions_engine, clip):
    engine = two_sessions_engine
    first, second = engine.open_live(Q), engine.open_live(Q)
    with pytest.raises(BusyError, match="already has 2 live sessions open"):
        engine.open_live(Q)
    with pytest.raises(InputError, match="no video yet"):
        first.ask("What moves?")
    upload = engine.submit(clip("moving_object", seconds=2.0), "What moves?", Q)  # others go on meanwhile
    play(second, clip_frames(1_000_021, fps=2)[:4], fps=2)
    second.close()
    for call in (lambda: second.push(FRAME, 9.0), lambda: second.ask("What moves?")):
        with pytest.raises(InputError, match="closed"):
            call()
    third = engine.open_live(Q)  # a closed session's place is free again
    play(third, clip_frames(1_000_022, fps=2)[:4], fps=2)
    # a question's method is the session's (causal EVS), whatever its params say, as its rate is
    answer = third.ask("What moves?", params=dataclasses.replace(Q, pruning_method="uniform")).result(60)
    assert (answer.stats["generated_tokens"], answer.stats["pruning_method"]) == (6, "evs")
    assert upload.result(60).stats["generated_tokens"] == 6
    first.close(), third.close()
    with pytest.raises(InputError, match="pruning rate"):
        engine.open_live(GenerationParams(pruning_rate=1.5))
    for method in ("vidcom2", "uniform"):  # no causal form: refused at the door, not pruned another way
        with pytest.raises(InputError, match=f"^A live session prunes with causal EVS only .*'{method}'\\.$"):
            engine.open_live(dataclasses.replace(Q, pruning_method=method))
    with pytest.raises(InputError, match="The pruning method must be evs, vidcom2 or uniform"):
        engine.open_live(dataclasses.replace(Q, pruning_method="fastvid"))


def test_frames_pushed_faster_than_the_engine_takes_them_are_dropped_and_counted(two_sessions_engine):
    frames = clip_frames(1_000_023, fps=8)
    with two_sessions_engine.open_live(Q) as live:
        for _ in range(3):  # 3 x 8 s of 8 fps frames, pushed at once: 48 are due at 2 fps
            for frame in frames:
                live.push(frame, live.stats()["frames_received"] / 8)
        stats = live.stats()
        assert stats["frames_received"] == 3 * len(frames)
        assert stats["frames_sampled"] + stats["frames_dropped"] == 48 and stats["frames_dropped"] > 0
        assert live.wait(60)
        stats = live.stats()
        assert stats["video_tokens_total"] == stats["frames_sampled"] // 2 * 4
        assert 0 < stats["lag_s"]["p50"] <= stats["lag_s"]["p95"]


def test_the_lag_counts_the_processor_on_the_pushing_thread(two_sessions_engine, monkeypatch):
    """A group's lag runs from the `push` call of its last frame, so the HF processor's time on the pushing thread is
    part of it: held here half a second longer than it takes, every lag is at least that."""
    real = live_group.processor_inputs

    def slower(*args, **kwargs):
        time.sleep(0.5)
        return real(*args, **kwargs)

    monkeypatch.setattr(live_group, "processor_inputs", slower)
    with two_sessions_engine.open_live(Q) as live:
        play(live, clip_frames(1_000_029, fps=2)[:4], fps=2)  # two groups, each waited for
        assert live.stats()["lag_s"]["p50"] >= 0.5


def test_the_recent_picture_is_the_newest_groups_as_the_model_saw_and_kept_them(two_sessions_engine):
    """LiveSession.recent_picture, the Live tab's pruning picture: the newest RECENT_GROUPS groups, each one's first
    frame (64x64: not scaled at the CPU's sampling), its centre time, and the tokens causal EVS kept of it, as the
    answer's own stats count them from the state."""
    frames = clip_frames(1_000_028, fps=2)[:12]  # 6 groups: the shape moves in them
    with two_sessions_engine.open_live(Q) as live:
        assert live.recent_picture() is None
        play(live, frames, fps=2)
        picture = live.recent_picture()
        stats = live.ask("What moves?").result(60).stats
    assert picture.grid_thw == (RECENT_GROUPS, 2, 2) and picture.kept_mask.dtype == bool
    np.testing.assert_array_equal(picture.frames, frames[-2 * RECENT_GROUPS :: 2])
    assert picture.timestamps_s == stats["media"][0]["timestamps_s"][-RECENT_GROUPS:] == [2.25, 3.25, 4.25, 5.25]
    assert (
        picture.kept_mask.reshape(RECENT_GROUPS, -1).sum(1).tolist() == stats["tokens_kept_per_frame"][-RECENT_GROUPS:]
    )
    assert 0 < picture.kept_mask.sum() < picture.kept_mask.size  # some kept, some dropped at q = 0.5
    assert picture.dissimilarity.shape == (RECENT_GROUPS, 2, 2)
    assert live.recent_picture() is None  # closed: nothing kept


def test_the_recent_picture_marks_the_tokens_where_the_picture_changed(two_sessions_engine):
    """Only the top-right quarter (one of the 2x2 tokens) changes from group to group: at q = 0.75, a token a group,
    it is the one kept, in its place in the picture's (h, w) mask."""
    noise = np.random.default_rng(0).integers(0, 256, (8, 32, 32, 3), dtype=np.uint8)
    frames = np.full((8, 64, 64, 3), 90, np.uint8)
    frames[:, :32, 32:] = noise
    with two_sessions_engine.open_live(dataclasses.replace(Q, pruning_rate=0.75)) as live:
        play(live, frames, fps=2)
        picture = live.recent_picture()
    assert picture.kept_mask[1:].tolist() == [[[False, True], [False, False]]] * 3


@pytest.mark.parametrize("name", ["tiny-random", "tiny-random-qwen3.5"])
def test_close_and_cancel_free_the_state(name, tiny_cache_dir):
    with Engine(EngineConfig(model=name, device="cpu", cache_dir=tiny_cache_dir)) as engine:
        runner = engine._worker.runner
        live = engine.open_live(Q)
        play(live, clip_frames(1_000_024, fps=2)[:6], fps=2)
        assert runner.live.streams[live.id].cache is not None
        asked = live.ask("What moves?", params=GenerationParams(max_new_tokens=2000, ignore_eos=True))
        next(event for event in asked if event.kind == "text")
        asked.cancel()
        assert asked.result(60).cancelled
        live.close()  # the worker's next step drops the session's state: an upload's steps show it
        engine.submit(
            write_lossless(tiny_cache_dir / "one.mkv", clip_frames(1_000_025, fps=2)[:4], 2), "What moves?", Q
        ).result(60)
        assert runner.live.streams == {} and runner.batch.cache is None


def test_shutdown_ends_every_session_with_a_sentence(tiny_cache_dir):
    engine = Engine(EngineConfig(model="tiny-random", device="cpu", cache_dir=tiny_cache_dir))
    live = engine.open_live(Q)
    play(live, clip_frames(1_000_026, fps=2)[:2], fps=2)
    engine.shutdown()
    with pytest.raises(InputError, match="shutting down"):
        live.push(FRAME, 5.0)
    assert live.stats()["closed"]


def test_live_groups_and_uploads_share_the_vision_forward_and_neither_starves(tiny_cache_dir, monkeypatch):
    """A burst of uploads needing many forwards and a session pushing all the while: forwards carry both, the
    live groups within half the budget, and each side gets on while the other has work: groups enter the
    session's state before the burst is answered, and uploads are answered before the session's last group."""
    forwards = []
    original = VisionEncoder._forward

    def counted(self, misses, on_batch, live):
        forwards.append((len(misses), len(live)))
        return original(self, misses, on_batch, live)

    monkeypatch.setattr(VisionEncoder, "_forward", counted)
    # 8 groups of 2x2 tokens, 16 patches each: 128 patches a clip; a forward of 144 takes one clip, and live
    # groups within 72 while uploads wait
    config = EngineConfig(model="tiny-random", device="cpu", cache_dir=tiny_cache_dir, vit_patch_budget=144)
    with Engine(config) as engine, engine.open_live(Q) as live:
        paths = [
            write_lossless(tiny_cache_dir / f"burst{seed}.mkv", clip_frames(seed, fps=2), 2)
            for seed in range(1_000_030, 1_000_036)
        ]
        entered = []

        def push_all():
            for index, frame in enumerate(clip_frames(1_000_029, fps=2)):
                live.push(frame, index / 2)
                assert live.wait(60)
                if index % 2:  # the group this frame closed is in the state
                    entered.append(time.perf_counter())

        with engine.paused():
            streams = [engine.submit(path, "What moves?", Q) for path in paths]
        pushing = threading.Thread(target=push_all)
        pushing.start()
        answered = []
        for stream in streams:
            assert stream.result(120).stats["generated_tokens"] == 6
            answered.append(time.perf_counter())
        pushing.join(120)
        assert live.stats()["video_tokens_total"] == 8 * 4
    both = [(uploads, groups) for uploads, groups in forwards if uploads and groups]
    assert both and all(groups * 16 <= 72 for _, groups in both)
    assert sum(uploads for uploads, _ in forwards) == len(paths)
    assert sum(t < answered[-1] for t in entered) >= 2 and sum(t < entered[-1] for t in answered) >= 1
