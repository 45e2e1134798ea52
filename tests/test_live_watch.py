"""Standing questions on a live session (docs/live.md, "Watches"): each ask is a cold question over the frames up to
it, at the logit level; a still stretch asks nothing, a moving one at most once a group; a noisy still camera stays
below the noise floor; a watch's ask takes an admission slot as a question does, and is dropped while the queue is
full; watches batched with questions and uploads answer as alone; users' questions take a watch's slot; bad input is
one sentence and the session goes on."""

import itertools

import numpy as np
import pytest

from assets.shapes import shape_clip
from engine import Engine, EngineConfig, GenerationParams, InputError
from engine.config import DEFAULT_LIVE_NOISE_FLOOR
from engine.live.session import LiveQuestion
from engine.scheduling.request import Request
from engine.scheduling.scheduler import Scheduler, WorkWeights
from live_helpers import cold_logits
from test_live_window import WINDOW, noise_frames

LOGITS = GenerationParams(pruning_rate=0.5, max_new_tokens=3, ignore_eos=True, return_logits=True)


def push_groups(live, frames: np.ndarray, watches=(), first: int = 0) -> None:
    """Push frames at 2 fps (frame i at (first + i) / 2 s); after each group, wait for it and for the watches'
    asks, so every group that changed is asked about."""
    for index, frame in enumerate(frames):
        live.push(frame, (first + index) / 2)
        if index % 2:
            assert live.wait(60)
            for watch in watches:
                assert watch.wait_idle(live.groups_in_state, 60)


@pytest.fixture(scope="module")
def engine(tiny_cache_dir):
    config = EngineConfig(model="tiny-random", device="cpu", cache_dir=tiny_cache_dir, live_window_tokens=WINDOW)
    with Engine(config) as running:
        yield running


def test_each_ask_of_a_watch_equals_a_cold_question_over_the_frames_up_to_it(engine):
    frames = noise_frames(40, seed=3)
    with engine.open_live(LOGITS) as live:
        watch = live.watch("What changes?")
        push_groups(live, frames, [watch])
        events = watch.poll()
        stats = watch.stats()
    assert stats["asks"] == 20 and stats["answered"] == 20, stats  # every group changed: one ask each
    assert len(events) >= 5 and max(e.group for e in events) >= 10, "asked past the window's first slides"
    for event in events:
        assert event.t_s == event.group + 0.5 and event.stats["generated_tokens"] == 3
        want = cold_logits(engine, frames, event.group + 1, "What changes?", event.logits.argmax(-1), 0.5)
        assert np.abs(event.logits - want).max() < 1e-4, event.group
    assert [e.previous for e in events[1:]] == [e.answer for e in events[:-1]]
    assert all(e.answer != e.previous for e in events)


def test_a_still_stretch_asks_nothing_and_a_moving_one_at_most_once_a_group(engine):
    still = np.repeat(noise_frames(2, seed=4)[:1], 30, axis=0)
    with engine.open_live(GenerationParams(pruning_rate=0.7, max_new_tokens=2)) as live:
        watches = [live.watch("What changes?"), live.watch("Is it red?")]
        push_groups(live, still, watches)
        assert [w.stats()["asks"] for w in watches] == [1, 1]  # the first answer, then nothing changed
        push_groups(live, noise_frames(20, seed=5), watches, first=30)
        assert [w.stats()["asks"] for w in watches] == [11, 11]  # one for each of the 10 groups that moved
        push_groups(live, still[:20], watches, first=50)
        assert [w.stats()["asks"] for w in watches] == [12, 12]  # the cut back to the still picture, then none


def test_a_watchs_ask_takes_an_admission_slot_and_is_dropped_while_the_queue_is_full(engine):
    """A watch's ask takes a queue slot from the engine's admission as a user's question does, and gives it back
    as the scheduler takes it: with every slot held (the engine behind), the changes are dropped, counted, never
    queued; once slots are free again the next group that changed is asked about."""
    frames = noise_frames(8, seed=9)
    admission = engine._admission
    with engine.open_live(GenerationParams(pruning_rate=0.5, max_new_tokens=2)) as live:
        watch = live.watch("What changes?")
        push_groups(live, frames[:2], [watch])
        assert watch.stats()["asks"] == 1 and admission.queued == 0
        held = [admission.take(0) for _ in range(admission.max_queue)]
        try:
            push_groups(live, frames[2:6], [watch], first=2)  # two groups that changed
            stats = watch.stats()
            assert stats["asks"] == 1 and stats["dropped"] == 2, stats
        finally:
            for ticket in held:
                ticket.close()
        push_groups(live, frames[6:], [watch], first=6)
        assert watch.stats()["asks"] == 2 and admission.queued == 0


def test_a_noisy_still_camera_stays_below_the_noise_floor(tiny_cache_dir):
    """A still shapes frame with sensor noise of 4 levels, 30 groups: with the default floor one ask (the first
    answer), the noise kept by causal EVS (tiny-trained declares no floor of its own); with the floor set, one ask
    and no token kept after the first group; with no floor, every group's noise is a change."""
    rng = np.random.default_rng(6)
    frame = shape_clip(7).frames[0].astype(np.float32)
    frames = (frame + rng.normal(0, 4.0, (60, *frame.shape))).round().clip(0, 255).astype(np.uint8)
    for floor, asks, only_first in ((None, 1, False), (DEFAULT_LIVE_NOISE_FLOOR, 1, True), (0.0, 30, False)):
        config = EngineConfig(model="tiny-trained", device="cpu", cache_dir=tiny_cache_dir, live_noise_floor=floor)
        with Engine(config) as engine, engine.open_live(GenerationParams(pruning_rate=0.7)) as live:
            watch = live.watch("What colour is the shape?")
            push_groups(live, frames, [watch])
            assert watch.stats()["asks"] == asks, (floor, watch.stats())
            kept = live.stats()["video_tokens_kept"]
            assert (kept == 4) == only_first, (floor, kept)
    assert DEFAULT_LIVE_NOISE_FLOOR == 0.01


def test_watches_questions_and_uploads_in_one_burst_answer_as_alone(engine, clip):
    """Two sessions with two watches each, a question on each and an upload, all under way at once: every watch
    ask and every live answer equals a cold prefill of its window, and the upload's answer equals its own alone."""
    upload = clip("moving_object", seconds=2.0, size=(64, 64))
    alone = engine.submit(upload, "What moves?", LOGITS).result(60)
    frames = [noise_frames(24, seed=10 + s) for s in range(2)]
    with engine.open_live(LOGITS) as one, engine.open_live(LOGITS) as two:
        sessions = [one, two]
        watches = [[live.watch("What changes?"), live.watch("Where?")] for live in sessions]
        answers = []
        for index in range(24):
            for live, mine in zip(sessions, frames):
                live.push(mine[index], index / 2)
            if index % 6 == 5:
                for live in sessions:
                    live.wait(60)
                answers += [
                    (live, mine, index // 2 + 1, live.ask("What is it?")) for live, mine in zip(sessions, frames)
                ]
                answers.append((None, None, 0, engine.submit(upload, "What moves?", LOGITS)))
        for live, mine, groups, stream in answers:
            answer = stream.result(60)
            if live is None:
                assert np.abs(answer.logits - alone.logits).max() < 1e-4
            else:
                want = cold_logits(engine, mine, groups, "What is it?", answer.token_ids, 0.5)
                assert np.abs(answer.logits - want).max() < 1e-4
        for live, mine, pair in zip(sessions, frames, watches):
            for watch in pair:
                assert watch.wait_idle(live.groups_in_state, 60)
                assert watch.stats()["asks"] >= 2
                for event in watch.poll():
                    want = cold_logits(engine, mine, event.group + 1, watch.question, event.logits.argmax(-1), 0.5)
                    assert np.abs(event.logits - want).max() < 1e-4


REQUEST_IDS = itertools.count(1)


def request(live_watch=None) -> Request:
    """A bare request for the scheduler, with an id of its own (the scheduler keys its slots by id): a live
    question, or a watch's ask when live_watch."""
    import torch

    from engine.config import FrameSampling
    from engine.stream import Stream

    return Request(
        Stream(next(REQUEST_IDS)),
        [],
        "q",
        [],
        GenerationParams(),
        FrameSampling(),
        live=LiveQuestion(1, 1, torch.zeros(3, dtype=torch.long), live_watch),
    )


def test_a_users_question_takes_a_watchs_slot_at_once():
    scheduler = Scheduler(2, 1000, 1000, WorkWeights(), missing=lambda request: {})
    asks = [request(live_watch=object()) for _ in range(2)]
    assert all(scheduler.take_background(ask) for ask in asks)
    assert not scheduler.take_background(request(live_watch=object())), "no slot: dropped, not queued"
    for ask in asks:
        scheduler.decoding(ask)
    user = request()
    scheduler.add(user)
    assert scheduler.admit() == [user]
    assert scheduler.preempted == [asks[1]] and list(scheduler.running.values()) == [asks[0]]
    scheduler.add(other := request())
    assert not scheduler.take_background(request(live_watch=object())), "a user's question waits: no ask"
    assert scheduler.admit() == [other] and scheduler.preempted == [asks[1], asks[0]]


def test_bad_watches_are_one_sentence_each_and_the_session_goes_on(tiny_cache_dir):
    config = EngineConfig(model="tiny-random", device="cpu", cache_dir=tiny_cache_dir, max_watches_per_session=2)
    frames = noise_frames(4, seed=8)
    with Engine(config) as engine:
        with engine.open_live(GenerationParams(max_new_tokens=2)) as live:
            push_groups(live, frames[:2])
            sentences = []
            for question in ("", "   ", "x" * 5000):
                with pytest.raises(InputError) as refused:
                    live.watch(question)
                sentences.append(str(refused.value))
            first, second = live.watch("What changes?"), live.watch("Is it red?")
            with pytest.raises(InputError) as refused:
                live.watch("One more?")
            sentences.append(str(refused.value))
            assert "already has 2 watches" in sentences[-1]
            first.close()
            first.close()  # closing twice is harmless
            third = live.watch("One more?")  # a closed watch frees its place
            push_groups(live, frames[2:], [second, third], first=2)
            assert live.ask("Still there?").result(60).stats["generated_tokens"] >= 1
            assert first.stats()["closed"] and not second.stats()["closed"]
        with pytest.raises(InputError) as refused:
            live.watch("After close?")
        sentences.append(str(refused.value))
        assert sentences[-1] == "This live session is closed; open a new one to go on."
        assert list(second) == second.poll()  # the session's close ended its watches: iterating ends
        assert second.stats()["closed"] and third.stats()["closed"]
    for sentence in sentences:
        assert sentence.endswith(".") and sentence.count(". ") <= 1 and "Traceback" not in sentence, sentence
