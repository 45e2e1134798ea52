"""The engine's live sessions: opening one (its settings checked, the limit on how many), a question asked of one
becoming a request for the worker, and ending them all at shutdown (docs/live.md).

The engine's other half of a session is the worker's (engine/worker/live.py); the caller holds the
LiveSession (engine/live/session.py).
"""

import dataclasses
import itertools
import threading
import weakref

import torch

from .config import DEFAULT_LIVE_NOISE_FLOOR, GenerationParams
from .detokenize import SplitDetokenizer
from .errors import QUEUE_FULL, RESTARTING, SHUTTING_DOWN, BusyError, InputError
from .front.checks import check_live_settings, check_request
from .live.layout import LiveLayout
from .live.session import LiveQuestion, LiveSession
from .live.watch import Watch
from .live.window import span_groups
from .scheduling.request import Request
from .stream import Event, Stream


class LiveSessions:
    """The live sessions of `engine`: the part of Engine that opens them and asks them, in a module of its own
    (it uses the engine's model, limits, admission queue, checks and worker as Engine.submit does)."""

    def __init__(self, engine):
        self._engine = engine
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._open: list[LiveSession] = []
        self._layouts: dict[int, LiveLayout] = {}
        self._watch_ids = itertools.count(1)
        # Each watch's tail (its question's tokens after the window) and thinking switch; a watch that ends with its
        # session drops out with it (weak keys)
        self._watch_tails: weakref.WeakKeyDictionary[Watch, tuple[torch.Tensor, bool]] = weakref.WeakKeyDictionary()
        self._closed = False

    @property
    def window_tokens(self) -> int:
        """The most kept video tokens a session's state holds: EngineConfig.live_window_tokens, else a request's
        planned video tokens."""
        engine = self._engine
        return engine.config.live_window_tokens or engine.planned_video_tokens

    @property
    def max_sessions(self) -> int:
        """EngineConfig.max_live_sessions, or fewer where the memory plan has no room for so many."""
        return self._engine.memory_plan.max_live_sessions

    @property
    def noise_floor(self) -> float:
        """The sessions' noise floor: EngineConfig.live_noise_floor, else the checkpoint's, else the default."""
        engine = self._engine
        for floor in (engine.config.live_noise_floor, engine.loaded.live_noise_floor):
            if floor is not None:
                return float(floor)
        return DEFAULT_LIVE_NOISE_FLOOR

    def open(self, params: GenerationParams) -> LiveSession:
        engine = self._engine
        check_live_settings(params, engine.config, engine.frame_sampling_limits)
        sampling = params.frame_sampling or engine.default_frame_sampling
        family, loaded = engine.family, engine.loaded
        layout = LiveLayout.of(loaded, family, engine.system_prompt, sampling.fps)
        with self._lock:
            if self._closed:
                raise BusyError(RESTARTING)
            self._open = [session for session in self._open if not session.ended]
            if len(self._open) >= self.max_sessions:
                engine.metrics.refused()
                raise BusyError(
                    f"This server already has {self.max_sessions} live sessions open, as many as it "
                    "takes; close one or try again later."
                )
            session = LiveSession(
                next(self._ids),
                loaded,
                family,
                params,
                sampling,
                engine.config.max_video_source_pixels,
                self.window_tokens,
                ask=self._ask,
                wake=engine._worker.wake,
                span_groups=span_groups(loaded.live_span_s, sampling.fps, family.temporal_patch),
                noise_floor=self.noise_floor,
                watch=self._watch,
            )
            self._open.append(session)
            self._layouts = {s.id: self._layouts[s.id] for s in self._open if s.id in self._layouts}
            self._layouts[session.id] = layout
        engine._worker.runner.live.open(session, layout)
        return session

    def _ask(self, session: LiveSession, question: str, history, params: GenerationParams, groups: int) -> Stream:
        """The engine's side of LiveSession.ask: checked as a request is, then to the worker, which forks the
        session's state once its first `groups` groups are in it. The rate, the method (causal EVS) and the frame
        sampling are the session's."""
        engine = self._engine
        params = session_params(session, params)
        try:
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
            if not engine._admission.acquire(blocking=False):
                raise BusyError(QUEUE_FULL)
        except InputError:
            engine.metrics.refused()
            raise
        thinking = params.enable_thinking and engine._think_end is not None
        tail = self._layouts[session.id].tail(question.strip(), history, thinking)
        try:  # its row holds at most the window, the question and the answer (the plan counts it as a request)
            engine.memory_plan.check_fits(
                session.window_tokens, session.window_tokens + tail.numel(), params.max_new_tokens
            )
        except InputError:
            engine._admission.release()
            engine.metrics.refused()
            raise
        request = self._request(session, question.strip(), history, params, groups, tail, thinking)
        request.admission = engine._admission
        request.stream.on_end = engine.metrics.ended
        engine._worker.enqueue(request)
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
        """A question asked of session when `groups` groups had formed, for the worker (a watch's ask when watch)."""
        engine = self._engine
        stream = Stream(next(engine._ids))
        request = Request(
            stream=stream,
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
        stream.push(Event("status", "waiting for the GPU"))
        return request

    def _watch(self, session: LiveSession, question: str, params: GenerationParams) -> Watch:
        """The engine's side of LiveSession.watch: the question checked as an ask's, then held by the session; the
        worker asks it (`watch_ask`) as the stream changes."""
        engine = self._engine
        params = session_params(session, params)
        try:
            check_request(
                [f"live session {session.id}"], question, params, [], engine.config, engine.frame_sampling_limits, 1
            )
            engine._check_text_tokens(question, [])
            thinking = params.enable_thinking and engine._think_end is not None
            tail = self._layouts[session.id].tail(question.strip(), [], thinking)
            engine.memory_plan.check_fits(
                session.window_tokens, session.window_tokens + tail.numel(), params.max_new_tokens
            )
        except InputError:
            engine.metrics.refused()
            raise
        watch = Watch(next(self._watch_ids), question.strip(), params, on_close=session.forget_watch)
        self._watch_tails[watch] = (tail, thinking)
        watch.make_ask = lambda: self.watch_ask(session, watch)
        session.add_watch(watch, engine.config.max_watches_per_session)
        return watch

    def watch_ask(self, session: LiveSession, watch: Watch) -> Request:
        """A watch's next ask, about the stream as it is in the session's state now (the worker's)."""
        tail, thinking = self._watch_tails[watch]
        question, params = watch.question, watch.params
        request = self._request(session, question, [], params, session.groups_in_state, tail, thinking, watch)
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
