"""A live session behind the replicas (docs/live.md, "Past one GPU"): `ReplicatedEngine.open_live` opens it on
one replica, and every later call names it, so the router sends it to that replica alone (replicas/router.py):
its state lives there. Frames travel in the call's arguments, through Ray's object store as an upload's bytes
do; a question streams back as an upload's answer does. When the replica is lost, the session ends: the next
call, or the question under way, says so in one sentence (SessionLost, a BusyError)."""

import logging

from ray.exceptions import RayActorError

from engine.errors import LIVE_SESSION_LOST, SessionEnded, SessionLost
from engine.live.frames import check_frame
from engine.live.session import CLOSED
from engine.stream import Stream

from .wire import ERROR, error_from_wire

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 60.0  # a push or a stats call; a replica that does not answer in this is taken as lost
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
        seen = 0
        while True:
            events, seen = self.events_after(seen)
            if not events and self._closed:
                return
            yield from events

    def stats(self) -> dict:
        return self._session._call("live_watch_events", watch=self.id, seen=1 << 62, timeout_s=0)["stats"]

    def close(self) -> None:
        """Watch.close on the replica; closing twice is harmless here too."""
        if not self._closed:
            self._session._call("live_unwatch", watch=self.id)
        self._closed = True
