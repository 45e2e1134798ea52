"""The live path's races, each made deterministic by holding one thread in its window with an event (docs/live.md):
a question asked while its session closes and another opens, or while the engine shuts down (before or after the
sessions are ended), gives its admission slot back and gets the sentence for the case; questions admitted but not
yet forked when their session closes end with theirs; a closed session counts against max_live_sessions until the
worker has freed its state, and shows no picture after its close; two pushers' groups enter the state in the
stream's order."""

import threading

import pytest

from engine import BusyError, Engine, EngineConfig, GenerationParams
from engine.errors import SHUTTING_DOWN, SessionEnded
from engine.live.session import CLOSED, LiveSession
from engine.worker.live import LiveRunner
from engine.worker.runner import ModelRunner
from live_helpers import clip_frames, play

Q = GenerationParams(pruning_rate=0.5, max_new_tokens=4, ignore_eos=True)
ENDED = "The live session ended before the question could be answered."
FRAMES = clip_frames(1_000_060, fps=2)[:4]  # two groups
HOLD_S = 60.0  # how long a held thread waits for its release at most (a failing test, not a slow machine)


def config(tiny_cache_dir, **limits) -> EngineConfig:
    return EngineConfig(model="tiny-random", device="cpu", cache_dir=tiny_cache_dir, **limits)


def free_slots(engine: Engine) -> int:
    """The admission queue slots free now."""
    admission = engine._admission
    return admission.max_queue - admission.queued


class Held:
    """Holds the thread that calls `method` with `first == word` until released: `entered` is set once it is in."""

    def __init__(self, word: str):
        self.word, self.entered, self.released = word, threading.Event(), threading.Event()

    def around(self, method):
        def holding(first, *rest):
            if first == self.word:
                self.entered.set()
                assert self.released.wait(HOLD_S)
            return method(first, *rest)

        return holding


def asked_in_a_thread(live, question: str) -> tuple[threading.Thread, dict]:
    """live.ask(question) on a thread of its own; the dict gets its "stream" or its "error"."""
    outcome = {}

    def ask():
        try:
            outcome["stream"] = live.ask(question)
        except Exception as error:
            outcome["error"] = error

    thread = threading.Thread(target=ask)
    thread.start()
    return thread, outcome


def held_question(engine: Engine, monkeypatch):
    """A live session of `engine` with two groups in, and a question asked of it in a thread that is held once it
    is past the session's checks (in `_check_text_tokens`), before its slot is taken: (live, held, thread,
    outcome), the thread already held."""
    held = Held("held question")
    monkeypatch.setattr(engine, "_check_text_tokens", held.around(engine._check_text_tokens))
    live = engine.open_live(Q)
    play(live, FRAMES, fps=2)
    thread, outcome = asked_in_a_thread(live, "held question")
    assert held.entered.wait(HOLD_S)
    return live, held, thread, outcome


def test_a_question_held_while_its_session_closes_and_another_opens_gives_its_slot_back(tiny_cache_dir, monkeypatch):
    """The asking thread is held past the session's "ended" check, before its slot is taken: the session closes and
    another opens (which rebuilt the engine's layouts, so the lookup raised KeyError with the slot taken: after
    max_queue of them every request was refused as busy on an idle engine)."""
    with Engine(config(tiny_cache_dir, max_live_sessions=2, max_queue=4)) as engine:
        live, held, thread, outcome = held_question(engine, monkeypatch)
        live.close()
        with engine.open_live(Q) as other:
            held.released.set()
            thread.join(HOLD_S)
            assert isinstance(outcome.get("error"), SessionEnded) and str(outcome["error"]) == CLOSED, outcome
            assert free_slots(engine) == 4
            play(other, FRAMES, fps=2)
            assert other.ask("What moves?").result(60).stats["generated_tokens"] == 4
        assert free_slots(engine) == 4


def test_a_question_held_while_the_engine_shuts_down_is_told_so_and_gives_its_slot_back(tiny_cache_dir, monkeypatch):
    """The asking thread is held before its slot is taken while the engine shuts down: it was then enqueued after
    the worker's last look at its inbox, its result() never returned and its slot was never given back."""
    engine = Engine(config(tiny_cache_dir, max_queue=4))
    live, held, thread, outcome = held_question(engine, monkeypatch)
    engine.shutdown()
    assert not engine._worker.is_alive()
    held.released.set()
    thread.join(HOLD_S)
    assert isinstance(outcome.get("error"), SessionEnded) and str(outcome["error"]) == SHUTTING_DOWN, outcome
    assert free_slots(engine) == 4


def test_a_question_asked_once_shutdown_has_begun_but_before_its_session_ended_is_told_so(tiny_cache_dir, monkeypatch):
    """Shutdown is held after it has closed the engine, before it ends the live sessions: a question asked then finds
    its session still open, and only the engine's closed flag, read under the lock shutdown took, refuses it."""
    engine = Engine(config(tiny_cache_dir, max_queue=4))
    live = engine.open_live(Q)
    play(live, FRAMES, fps=2)
    entered, released = threading.Event(), threading.Event()
    end_sessions = engine._live.shutdown

    def held_shutdown():
        entered.set()
        assert released.wait(HOLD_S)
        end_sessions()

    monkeypatch.setattr(engine._live, "shutdown", held_shutdown)
    shutting_down = threading.Thread(target=engine.shutdown)
    shutting_down.start()
    try:
        assert entered.wait(HOLD_S) and not live.ended
        with pytest.raises(SessionEnded, match=SHUTTING_DOWN):
            live.ask("What moves?")
        assert free_slots(engine) == 4
    finally:
        released.set()
        shutting_down.join(HOLD_S)


def test_questions_admitted_but_not_forked_when_their_session_closes_end_with_its_sentence(
    tiny_cache_dir, monkeypatch, caplog
):
    """Eight questions admitted in one iteration, prefilled one an iteration (a budget of one token); the first one's
    prefill closes the session. It is answered (its state was forked first); the seven others, admitted and waiting
    for their prefill, ended as "The engine hit an internal error" with a traceback each when the fork found no
    session."""
    prefill = ModelRunner.prefill
    with Engine(config(tiny_cache_dir, prefill_token_budget=1)) as engine:
        live = engine.open_live(Q)
        play(live, FRAMES, fps=2)

        def closing_at_the_first(self, request):
            live.close()
            return prefill(self, request)

        monkeypatch.setattr(ModelRunner, "prefill", closing_at_the_first)
        with engine.paused():
            streams = [live.ask("What moves?") for _ in range(8)]
        outcomes = []
        for stream in streams:
            try:
                outcomes.append(stream.result(60).stats["generated_tokens"])
            except Exception as error:
                outcomes.append(str(error))
        assert outcomes == [4] + [ENDED] * 7
        assert free_slots(engine) == engine.config.max_queue
    assert not [record for record in caplog.records if record.name.startswith("engine.worker")]


class HeldWorker:
    """Holds the worker thread at the start of its next iteration (LiveRunner.refresh) while `holding` is set."""

    def __init__(self, monkeypatch):
        self.holding, self.entered, self.released = threading.Event(), threading.Event(), threading.Event()
        refresh = LiveRunner.refresh

        def held_refresh(runner):
            if self.holding.is_set():
                self.entered.set()
                assert self.released.wait(HOLD_S)
            refresh(runner)

        monkeypatch.setattr(LiveRunner, "refresh", held_refresh)


def test_a_closed_session_counts_until_the_worker_has_freed_its_state(tiny_cache_dir, monkeypatch):
    """At max_live_sessions = 1, with the worker held before it drops a closed session's state, the next session
    is refused (it was opened at once: one session's state more than the memory plan counts); once the worker
    goes on, it opens."""
    worker = HeldWorker(monkeypatch)
    with Engine(config(tiny_cache_dir, max_live_sessions=1)) as engine:
        first = engine.open_live(Q)
        play(first, FRAMES, fps=2)
        worker.holding.set()
        assert worker.entered.wait(HOLD_S)
        first.close()
        assert not first.state_freed
        with pytest.raises(BusyError, match="already has 1 live sessions open"):
            engine.open_live(Q)
        worker.holding.clear()
        worker.released.set()
        with engine.open_live(Q) as second:  # waits for the worker to free the first's state
            assert first.state_freed
            play(second, FRAMES, fps=2)
            assert second.ask("What moves?").result(60).stats["generated_tokens"] == 4


def test_a_session_closed_while_its_group_is_encoded_shows_no_picture_after(tiny_cache_dir, monkeypatch):
    """The session closes during the vision forward of its group: the worker's report of the decided group came
    after close had cleared the picture, and recent_picture() showed it again."""
    encode = ModelRunner.encode
    with Engine(config(tiny_cache_dir)) as engine, engine.open_live(Q) as session:

        def closing_in_the_forward(self, requests, on_forward, live=()):
            if live:
                session.close()
            return encode(self, requests, on_forward, live)

        monkeypatch.setattr(ModelRunner, "encode", closing_in_the_forward)
        session.push(FRAMES[0], 0.0), session.push(FRAMES[1], 0.5)
        assert session.wait(60) and session.ended == CLOSED  # closed, not failed: the forward went on
        engine._worker.wake()
        assert session.wait_freed(60)  # the worker's iteration with the forward is over
        assert session.recent_picture() is None and session.stats()["video_tokens_total"] == 0


def test_two_pushers_groups_enter_the_state_in_the_streams_order(tiny_cache_dir, monkeypatch):
    """One pusher's group 0 is held while its pixels are made (outside the session's lock); the other pusher forms
    group 1 meanwhile and the worker runs two iterations. Group 1 used to be queued first and entered the state
    before group 0 (groups_in_state going from 2 back to 1, and the layout's times out of order)."""
    entered = []
    entered_state = LiveSession.entered_state

    def recording(self, group, *rest):
        entered.append(group.index)
        return entered_state(self, group, *rest)

    monkeypatch.setattr(LiveSession, "entered_state", recording)
    refreshes = threading.Semaphore(0)
    refresh = LiveRunner.refresh

    def counted_refresh(runner):
        refresh(runner)
        refreshes.release()

    monkeypatch.setattr(LiveRunner, "refresh", counted_refresh)
    with Engine(config(tiny_cache_dir)) as engine, engine.open_live(Q) as live:
        held = threading.Event(), threading.Event()  # (in group 0's pixels, released)
        make_group = live._group

        def held_group(index, frames, *rest):
            if index == 0:
                held[0].set()
                assert held[1].wait(HOLD_S)
            return make_group(index, frames, *rest)

        monkeypatch.setattr(live, "_group", held_group)
        first = threading.Thread(target=lambda: (live.push(FRAMES[0], 0.0), live.push(FRAMES[1], 0.5)))
        first.start()
        assert held[0].wait(HOLD_S)
        live.push(FRAMES[2], 1.0), live.push(FRAMES[3], 1.5)  # group 1, made and queued at once
        while refreshes.acquire(blocking=False):  # the iterations before it
            pass
        for _ in range(2):  # an iteration that saw group 1 has begun, then ended
            engine._worker.wake()
            assert refreshes.acquire(timeout=HOLD_S)
        held[1].set()
        first.join(HOLD_S)
        assert live.wait(60)
        assert entered == [0, 1]
        answer = live.ask("What moves?").result(60)
        assert answer.stats["media"][0]["timestamps_s"] == [0.25, 1.25]
