"""The engine's live sessions: opening one (its settings checked, the limit on how many), a question asked of one
becoming a request for the worker, and ending them all at shutdown (docs/live.md).

The engine's other half of a session is the worker's (engine/worker/live.py); the caller holds the
LiveSession (engine/live/session.py).
"""

import dataclasses
import functools
import itertools
import threading
import time
import weakref

import torch

from .config import DEFAULT_LIVE_NOISE_FLOOR, GenerationParams
from .detokenize import SplitDetokenizer
from .errors import RESTARTING, SHUTTING_DOWN, BusyError, InputError, SessionEnded
from .front.checks import check_live_settings, check_request
from .live.layout import LiveLayout
from .live.session import CLOSED, LiveQuestion, LiveSession
from .live.watch import Watch
from .live.window import span_groups
from .scheduling.request import Request
from .stream import Event, Stream

# How long open_live waits, at the limit, for a closed session's state to be freed (the worker frees it at its next
# step: within milliseconds, unless a long forward is running or the machine is busy) before refusing.
FREEING_WAIT_S = 5.0


class LiveSessions:
    """The live sessions of `engine`: the part of Engine that opens them and asks them, in a module of its own
    (it uses the engine's model, limits, admission queue, checks and worker as Engine.submit does)."""

    def __init__(self, engine):
        self._engine = engine
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._open: list[LiveSession] = []
        self._watch_ids = itertools.count(1)
        # Each watch's tail (its question's tokens after the window) and thinking switch; a watch that ends
        # with its session drops out with it (weak keys)
        self._watch_tails: weakref.WeakKeyDictionary[Watch, tuple[torch.Tensor, bool]] = weakref.WeakKeyDictionary()
        self._closed = False

    @property
    def window_tokens(self) -> int:
        """The most tokens a session's state holds, its groups' text counted with their kept video (so that a still
        screen, whose groups keep no video token, is bounded too): EngineConfig.live_window_tokens, else a
        request's planned video tokens."""
        engine = self._engine
        return engine.config.live_window_tokens or engine.planned_video_tokens

    @property
    def max_sessions(self) -> int:
        """EngineConfig.max_live_sessions, or fewer where the memory plan has no room for so many."""
        return self._engine.memory_plan.max_live_sessions

    @property
    def _declared_floor(self) -> float | None:
        """EngineConfig.live_noise_floor, else the checkpoint's declared one, else None."""
        engine = self._engine
        for floor in (engine.config.live_noise_floor, engine.loaded.live_noise_floor):
            if floor is not None:
                return float(floor)
        return None

    @property
    def noise_floor(self) -> float:
        """The sessions' noise floor: EngineConfig.live_noise_floor, else the checkpoint's, else the default."""
        declared = self._declared_floor
        return DEFAULT_LIVE_NOISE_FLOOR if declared is None else declared

    @property
    def evs_floor(self) -> float:
        """The floor causal EVS keeps nothing at or below: EngineConfig.live_noise_floor, else the checkpoint's
        when it declares one (it learned live streams with that floor in its masks, train/tiny_live.py), else 0
        (only exactly unchanged tokens dropped). A checkpoint trained on the offline rule's masks relies on the
        near-still tokens that rule keeps: with the default floor in causal EVS, tiny-trained's live direction
        answers fell from 0.95 to 0.875 on 40 held-out clips at q = 0.7 (docs/live.md, "The noise floor")."""
        declared = self._declared_floor
        return 0.0 if declared is None else declared

    def open(self, params: GenerationParams) -> LiveSession:
        """A new session (Engine.open_live), counted in /metrics as opened, or refused (its InputError or
        BusyError raised); when it ends, as closed by its user or lost (ended by the server)."""
        metrics = self._engine.metrics
        try:
            session = self._open_session(params)
        except InputError:
            metrics.live_session("refused")
            raise
        metrics.live_session("opened")
        return session

    def _open_session(self, params: GenerationParams) -> LiveSession:
        engine = self._engine
        check_live_settings(params, engine.config, engine.frame_sampling_limits)
        sampling = params.frame_sampling or engine.default_frame_sampling
        family, loaded = engine.family, engine.loaded
        layout = LiveLayout.of(loaded, family, engine.system_prompt, sampling.fps)
        deadline = time.monotonic() + FREEING_WAIT_S
        while (session := self._new_session(params, sampling, layout, deadline)) is None:
            # A closed session counts until the worker has freed its state (at its next step): wait for one.
            closing = next((session for session in self._open if session.ended and not session.state_freed), None)
            if closing is not None:
                closing.wait_freed(max(0.0, deadline - time.monotonic()))
        engine._worker.runner.live.open(session, layout)
        return session

    def _new_session(self, params, sampling, layout: LiveLayout, deadline: float) -> LiveSession | None:
        """A new session counted among the open ones, or None where one that is closed has yet to have its state
        freed before `deadline`; BusyError when the engine is shutting down or as many are open as it takes."""
        engine = self._engine
        family, loaded = engine.family, engine.loaded
        with self._lock:
            if self._closed:
                raise BusyError(RESTARTING)
            self._open = [session for session in self._open if not session.state_freed]
            if len(self._open) >= self.max_sessions:
                if any(session.ended for session in self._open) and time.monotonic() < deadline:
                    return None
                raise BusyError(
                    f"This server already has {self.max_sessions} live sessions open, as many as it "
                    "takes; close one or try again later."
                )
            session = LiveSession(
                next(self._ids),
                engine.loaded,
                engine.family,
                params,
                sampling,
                engine.config.max_video_source_pixels,
                self.window_tokens,
                ask=functools.partial(self._ask, layout),
                wake=engine._worker.wake,
                on_end=lambda why: engine.metrics.live_session("closed" if why == CLOSED else "lost"),
                span_groups=span_groups(loaded.live_span_s, sampling.fps, family.temporal_patch),
                noise_floor=self.noise_floor,
                evs_floor=self.evs_floor,
                watch=functools.partial(self._watch, layout),
            )
            self._open.append(session)
            return session

    def _ask(
        self, layout: LiveLayout, session: LiveSession, question: str, history, params: GenerationParams, groups: int
    ) -> Stream:
        """The engine's side of LiveSession.ask: checked as a request is, then to the worker, which forks the
        session's state once its first `groups` groups are in it. The rate, the method (causal EVS) and the frame
        sampling are the session's. Every check comes before the admission slot is taken; the slot is taken and
        the request enqueued under the lock shutdown takes, so that nothing is enqueued after the worker's last
        look at its inbox and nothing raised in between keeps the slot."""
        engine = self._engine
        params = session_params(session, params)
        try:
            session.check_askable(groups)
            history = check_request(
                [f"live session {session.id}"],
                question,
                params,
                history,
                engine.config,
                engine.frame_sampling_limits,
                max_media=1,
            )
            engine._check_text_tokens(question, history)
            thinking = params.enable_thinking and engine._think_end is not None
            tail = layout.tail(question.strip(), history, thinking)
            # its row holds at most the window (every token of the state), the question and the answer
            engine.memory_plan.check_fits(
                session.window_tokens, session.window_tokens + tail.numel(), params.max_new_tokens
            )
            request = self._request(session, question, history, params, groups, tail, thinking)
            with engine._submit_lock:
                if engine._closed:
                    raise SessionEnded(SHUTTING_DOWN)
                if session.ended:
                    raise SessionEnded(session.ended)
                # A queue slot; no bytes: its frames are the session's, which the window bounds.
                request.admission = engine._admission.take(0)
                engine._worker.enqueue(request)  # a put on an unbounded queue: nothing to give the slot back for
        except InputError as error:
            engine.metrics.refused(error)
            raise
        return request.stream

    def _request(
        self,
        session: LiveSession,
        question: str,
        history: list[tuple[str, str]],
        params: GenerationParams,
        groups: int,
        tail: torch.Tensor,
        thinking: bool,
        watch: Watch | None = None,
    ) -> Request:
        """A question asked of session when `groups` groups had formed, for the worker (a watch's ask when watch),
        its stream and stats begun."""
        engine = self._engine
        request = Request(
            stream=Stream(next(engine._ids), on_end=engine.metrics.ended),
            media_paths=[],
            question=question,
            history=history,
            params=params,
            frame_sampling=session.sampling,
            live=LiveQuestion(session.id, groups, tail, watch),
        )
        request.detokenizer = SplitDetokenizer(
            engine.loaded.processor.tokenizer, engine._think_end if thinking else None
        )
        request.generator = torch.Generator().manual_seed(params.seed)
        stats = request.stats
        stats.pruning_rate, stats.sampled_fps = float(params.pruning_rate), session.sampling.fps
        stats.pruning_method = params.pruning_method
        stats.soundtrack = "none" if engine.model_info["hears"] else "unsupported"
        stats.audio_tokens, stats.audio_seconds = 0, 0.0
        stats.read_video_s = stats.read_wait_s = stats.read_s = 0.0
        request.stream.push(Event("status", "waiting for the GPU"))
        return request

    def _watch(self, layout: LiveLayout, session: LiveSession, question: str, params: GenerationParams) -> Watch:
        """The engine's side of LiveSession.watch: the question checked as an ask's (the refusal counted), then held
        by the session; the worker asks it (`watch_ask`) as the stream changes."""
        engine = self._engine
        params = session_params(session, params)
        try:
            if session.ended:
                raise SessionEnded(session.ended)
            check_request(
                [f"live session {session.id}"], question, params, [], engine.config, engine.frame_sampling_limits, 1
            )
            engine._check_text_tokens(question, [])
            thinking = params.enable_thinking and engine._think_end is not None
            tail = layout.tail(question.strip(), [], thinking)
            engine.memory_plan.check_fits(
                session.window_tokens, session.window_tokens + tail.numel(), params.max_new_tokens
            )
            watch = Watch(next(self._watch_ids), question.strip(), params, on_close=session.forget_watch)
            self._watch_tails[watch] = (tail, thinking)
            watch.make_ask = lambda: self.watch_ask(session, watch)
            session.add_watch(watch, engine.config.max_watches_per_session)
        except InputError as error:
            engine.metrics.refused(error)
            raise
        return watch

    def watch_ask(self, session: LiveSession, watch: Watch) -> Request:
        """A watch's next ask, about the stream as it is in the session's state now (the worker's). It goes the way
        a user's live question does: the session's check first (SessionEnded once it has ended), then a queue
        slot from the engine's admission (BusyError when the queue is full: the engine is behind, and the worker
        drops the ask). It is made on the worker's own thread and taken straight into a decode slot there, never
        put in the inbox, so it needs no submit lock: nothing can reach the inbox after the worker's last look.
        Its answer goes to the watch, not to /metrics: a watch's asks are not requests anyone sent."""
        engine = self._engine
        groups = session.groups_in_state
        session.check_askable(groups)
        tail, thinking = self._watch_tails[watch]
        request = self._request(session, watch.question, [], watch.params, groups, tail, thinking, watch)
        request.admission = engine._admission.take(0)  # no bytes: its frames are the session's
        request.stream.on_end = lambda stream: watch.answered(
            stream.answer() if stream.error is None else None,
            request.live_seen,
            session.group_picture(request.live_seen[0]) if request.live_seen else None,
        )
        return request

    def shutdown(self) -> None:
        """End every session: pushing or asking answers the shutdown's sentence."""
        with self._lock:
            self._closed = True
            sessions = list(self._open)
        for session in sessions:
            session.end(SHUTTING_DOWN)


def session_params(session: LiveSession, params: GenerationParams) -> GenerationParams:
    """A question's settings with the session's rate, method (causal EVS) and frame sampling."""
    return dataclasses.replace(
        params,
        pruning_rate=session.params.pruning_rate,
        pruning_method=session.params.pruning_method,
        frame_sampling=session.sampling,
    )
