"""A live session behind the replicas (docs/live.md, "Past one GPU"): `ReplicatedEngine.open_live` opens it on
one replica, and every later call names it, so the router sends it to that replica alone (replicas/router.py):
its state lives there. Frames travel in the call's arguments, through Ray's object store as an upload's bytes
do; a question streams back as an upload's answer does. When the replica is lost, the session ends: the next
call, or the question under way, says so in one sentence (SessionLost, a BusyError)."""

import asyncio
import logging
import time

from ray.exceptions import RayActorError

from engine.config import GenerationParams
from engine.errors import (
    LIVE_SESSION_LOST,
    RESTARTING,
    SERVER_FAULT,
    SHUTTING_DOWN,
    BusyError,
    InputError,
    SessionEnded,
    SessionLost,
)
from engine.front.checks import check_live_settings
from engine.live.frames import check_frame
from engine.live.session import CLOSED
from engine.stream import Stream

from .calls import end_cancelled, fail_unfinished, read_call
from .wire import ERROR, error_from_wire

log = logging.getLogger(__name__)

LIVE_OPEN_TIMEOUT_S = 60.0  # opening a session on one replica
CALL_TIMEOUT_S = 60.0  # a push or a stats call; a replica that does not answer in this is taken as lost
IDLE_POLL_S = 0.05  # how often RemoteWatch.wait_idle reads its watch's stats
EVENTS_WAIT_S = 10.0  # the longest a watch's events call waits on the replica (an iterator calls again)


class RemoteLiveSession:
    """LiveSession's interface (push, ask, stats, wait, close, a context manager) for a session held by a
    replica. engine: the ReplicatedEngine; session: "<replica id>/<its number there>"; replica: where it is;
    params: the session's (the defaults of its questions)."""

    def __init__(self, engine, session: str, replica: str, params, max_source_pixels: int):
        self._engine, self.session, self.replica, self.params = engine, session, replica, params
        self._max_source_pixels = max_source_pixels
        self._lost = self._closed = False

    def _call(self, method: str, deadline_s: float = CALL_TIMEOUT_S, **arguments):
        """One unary call about the session on its replica; its result, or its error raised (SessionLost, and
        the session ended, when the replica is gone)."""
        self._check_open()
        try:
            call = getattr(self._engine.handle, method).remote(session=self.session, **arguments)
            reply = call.result(timeout_s=deadline_s)
        except (RayActorError, TimeoutError):
            reply = {"kind": ERROR, "error": "lost", "message": LIVE_SESSION_LOST}
        if isinstance(reply, dict) and reply.get("kind") == ERROR:
            error = error_from_wire(reply)
            if isinstance(error, SessionLost) and not self._lost:
                self._lost = True
                self._engine.metrics.live_session("lost")
            raise error
        return reply

    def _check_open(self) -> None:
        if self._closed:
            raise SessionEnded(CLOSED)
        if self._lost:
            raise SessionLost(LIVE_SESSION_LOST)

    def push(self, frame, t_s: float) -> None:
        """LiveSession.push: the frame is checked here first, so that a frame refused never travels."""
        check_frame(frame, self._max_source_pixels)
        self._call("live_push", frame=frame, t_s=t_s)

    def ask(self, question: str, history=(), params=None) -> Stream:
        self._check_open()
        return self._engine.ask_live(self.session, question, history, params or self.params)

    def stats(self) -> dict:
        return self._call("live_stats")["stats"]

    def watch(self, question: str, params=None) -> "RemoteWatch":
        """LiveSession.watch: the watch lives on the session's replica (its asks are that engine's)."""
        return RemoteWatch(self, self._call("live_watch", question=question, params=params or self.params)["watch"])

    def recent_picture(self):
        """LiveSession.recent_picture, from the replica: an EvsPicture of the newest groups, or None."""
        return self._call("live_recent")["picture"]

    def wait(self, timeout_s: float | None = None) -> bool:
        deadline_s = (CALL_TIMEOUT_S if timeout_s is None else timeout_s) + CALL_TIMEOUT_S
        return self._call("live_wait", deadline_s, timeout_s=timeout_s)["caught_up"]

    def close(self) -> None:
        """Close it on its replica (nothing to do when the replica is gone); closing twice is harmless, and closing
        never raises: it is called on the way out (a socket's end, a tab's), where a replica that fails to answer
        has lost the session anyway."""
        if not (self._lost or self._closed):
            try:
                self._call("live_close")
            except Exception:
                log.warning("closing live session %s on its replica failed", self.session, exc_info=True)
            else:
                self._engine.metrics.live_session("closed")
        self._closed = True

    def __enter__(self) -> "RemoteLiveSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RemoteWatch:
    """Watch's interface (poll, iteration, events_after, stats, close) for a watch on a session a replica holds.
    session: the RemoteLiveSession; watch_id: the watch's id on its replica."""

    def __init__(self, session: RemoteLiveSession, watch_id: int):
        self._session, self.id = session, watch_id
        self._closed = False

    def events_after(self, seen: int, timeout_s: float | None = None) -> tuple[list, int]:
        """Watch.events_after from the replica: one wait of at most EVENTS_WAIT_S there per call."""
        wait = EVENTS_WAIT_S if timeout_s is None else min(timeout_s, EVENTS_WAIT_S)
        reply = self._session._call(
            "live_watch_events", wait + CALL_TIMEOUT_S, watch=self.id, seen=seen, timeout_s=wait
        )
        self._closed = reply["stats"]["closed"]
        return reply["events"], reply["total"]

    def poll(self) -> list:
        return self.events_after(0, 0)[0]

    def __iter__(self):
        """Watch's iteration: each event as it comes; it ends once the watch or its session has closed."""
        seen = 0
        while True:
            try:
                events, seen = self.events_after(seen)
            except SessionEnded:  # the session closed between two fetches: its watches ended with it
                return
            if not events and self._closed:
                return
            yield from events

    def wait_idle(self, groups: int, timeout_s: float | None = None) -> bool:
        """Watch.wait_idle from the replica: its stats read, IDLE_POLL_S apart, until it has been told of `groups`
        groups with no ask under way, or has closed; False when timeout_s passed first."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            stats = self.stats()
            if stats["closed"] or (stats["groups_seen"] >= groups and not stats["asking"]):
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(IDLE_POLL_S)

    def stats(self) -> dict:
        return self._session._call("live_watch_events", watch=self.id, seen=1 << 62, timeout_s=0)["stats"]

    def close(self) -> None:
        """Watch.close on the replica; closing twice is harmless here too."""
        if not self._closed:
            self._session._call("live_unwatch", watch=self.id)
        self._closed = True


class LiveCalls:
    """ReplicatedEngine's live sessions: opening one on a replica, and a question about it streamed from there.
    Mixed into ReplicatedEngine (replicas/client.py), whose admission, call loop, handle and metrics it uses as
    an upload's request does."""

    def open_live(self, params: GenerationParams | None = None) -> RemoteLiveSession:
        """Engine.open_live's contract: a session on one replica, which every later call of the session reaches.
        The replicas take turns (each holds its own state and its own max_live_sessions); a replica with all its
        sessions open passes to the next. BusyError when every one is full (or the engine is shutting down),
        InputError for bad settings."""
        params = params or GenerationParams()
        try:
            check_live_settings(params, self.config, self.frame_sampling_limits)
            with self._lock:
                if self._closed:
                    raise BusyError(RESTARTING)
            ids = self.replicas()
            first = next(self._live_turn) % max(1, len(ids))
            full = None
            for replica in ids[first:] + ids[:first]:
                # pinned there by the router, as every later call of the session will be
                reply = self.handle.open_live.remote(session=f"{replica}/", params=params).result(
                    timeout_s=LIVE_OPEN_TIMEOUT_S
                )
                if reply.get("kind") != ERROR:
                    break
                error = error_from_wire(reply)
                if not isinstance(error, BusyError):
                    raise error
                full = full if isinstance(error, SessionLost) else error  # SessionLost: that replica is gone
            else:
                raise full or BusyError(RESTARTING)
        except (InputError, BusyError):
            self.metrics.live_session("refused")
            raise
        self.metrics.live_session("opened")
        return RemoteLiveSession(self, reply["session"], reply["replica"], params, self.config.max_video_source_pixels)

    def ask_live(self, session: str, question: str, history=(), params: GenerationParams | None = None) -> Stream:
        """A question about a live session, streamed from its replica as an upload's answer (LiveSession.ask)."""
        _, params, history, _ = self._admit(f"live session {session}", question, params, history)
        try:
            stream = Stream(next(self._ids), on_end=self.metrics.ended)
            asyncio.run_coroutine_threadsafe(
                self._serve_live(session, question.strip(), history, params, stream), self._loop
            )
        except BaseException:  # nothing was sent: the slot taken for it goes back
            self._admission.release()
            raise
        return stream

    async def _serve_live(self, session: str, question: str, history, params, stream: Stream) -> None:
        task = asyncio.current_task()
        self._open[task] = 1
        try:
            response = self._calls.live_ask.remote(session=session, question=question, history=history, params=params)
            if not await read_call(
                response, [stream], self.deadline_s, self._placed([stream])
            ):  # failed before its replica said hello: that one is gone
                fail_unfinished([stream], SessionLost(LIVE_SESSION_LOST))
        except asyncio.CancelledError:  # shutdown
            fail_unfinished([stream], RuntimeError(SHUTTING_DOWN))
            raise
        except Exception:
            log.exception("a live question failed")
            fail_unfinished([stream], RuntimeError(SERVER_FAULT))
        finally:
            self._admission.release()  # before the call stops counting, as in _serve
            self._open.pop(task, None)
            end_cancelled([stream])
