"""The Ray Serve request router: a video's requests go to the replica holding its caches, while it has room.

It runs inside the client's deployment handle (the app process). Ray Serve calls `choose_replicas` for each
call with the live replicas; it answers in ranks (replicas/routing.py): the video's home first while it has
room, then the others, the most room first. Load is the requests each replica has under way, booked here as
calls are routed (a burst is one call of several requests) and given back when Ray reports the call ended:
Ray's own count is of calls, which would let a replica whose engine queue is full look free. No FIFO mixin:
that one hands a replica found for one request to the oldest waiting request, which would send a video to
another video's home.

A replica that does not answer a probe in time (a stopped or hung process) goes last, so that its videos'
questions go to the others until Serve's health check replaces it; Ray's cache of its queue length, which
every send refreshes, would otherwise keep sending them there.
"""

import asyncio
import logging
import threading

from ray.exceptions import ActorDiedError
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from .routing import DEFAULT_SPILL_AFTER, ranks

log = logging.getLogger(__name__)

# The handle call's keyword argument that names the video (the upload's sha256 hex digest).
DIGEST_KWARG = "digest"
# The keyword argument that holds a call's requests (EngineReplica.answer): its length is the call's size.
REQUESTS_KWARG = "requests"
# The keyword argument that names a live session, "<replica id>/<session>": its calls go to that replica alone.
SESSION_KWARG = "session"
# A live session's question is one request; its other calls (frames, stats) take no queue slot.
LIVE_ASK = "live_ask"
DEFAULT_CAPACITY = 64  # EngineConfig.max_queue's default
# A replica that has not answered a probe in this long (seconds) is taken as unresponsive for this call.
PROBE_DEADLINE_S = 1.0


def call_size(pending_request: PendingRequest | None) -> int:
    """The engine requests a call brings to its replica: a burst's length, 1 for a live question, else 0."""
    if pending_request is None:
        return 0
    requests = pending_request.kwargs.get(REQUESTS_KWARG)
    if requests is not None:
        return len(requests)
    return 1 if pending_request.metadata.call_method == LIVE_ASK else 0


class VideoAffinityRouter(RequestRouter):
    """Routes by the `digest` keyword of the call and the requests each replica has under way. spill_after
    (request_router_kwargs): the home's requests under way past which another replica takes the call;
    capacity: one replica's engine queue (max_queue). A call about a live session (the `session` keyword) goes
    to the replica holding its state and nowhere else; when that replica is gone, to any, which answers that it
    does not hold the session."""

    def __init__(self, *args, **kwargs):
        self.spill_after, self.capacity = DEFAULT_SPILL_AFTER, DEFAULT_CAPACITY
        self._booked: dict[str, tuple[str, int]] = {}  # calls routed, not ended: Ray's request id -> (replica, size)
        self._booking_lock = threading.Lock()  # Ray reports a call's end from the handle's own thread
        super().__init__(*args, **kwargs)

    def initialize_state(self, spill_after: int = DEFAULT_SPILL_AFTER, capacity: int = DEFAULT_CAPACITY, **_) -> None:
        self.spill_after, self.capacity = int(spill_after), int(capacity)

    def loads(self, replica_ids) -> dict[str, int]:
        """Requests under way on each of `replica_ids`, as booked here."""
        with self._booking_lock:
            calls = list(self._booked.values())
        loads = dict.fromkeys(replica_ids, 0)
        for replica_id, size in calls:
            if replica_id in loads:
                loads[replica_id] += size
        return loads

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        by_id = {replica.replica_id.unique_id: replica for replica in candidate_replicas}
        kwargs = pending_request.kwargs if pending_request is not None else {}
        session = kwargs.get(SESSION_KWARG)
        if session is not None:
            holder = by_id.get(session.split("/")[0])
            return [[holder]] if holder is not None else [list(by_id.values())]
        digest, size = kwargs.get(DIGEST_KWARG), call_size(pending_request)
        spill_after, capacity = self.spill_after, self.capacity
        unresponsive: set[str] = set()
        # Booked before the probe's await, so that a call routed meanwhile sees this one's requests.
        order = ranks(digest, self.loads(by_id), size, capacity, spill_after)
        self._book(pending_request, order[0][0], size)
        if len(by_id) > 1:
            first = by_id[order[0][0]]
            answer = await self._probe(first)
            if answer is _DEAD:  # a replica Ray has not yet told us about: route among the rest
                del by_id[order[0][0]]
            elif answer is None:
                unresponsive.add(order[0][0])
            if answer is _DEAD or answer is None:
                order = ranks(digest, self.loads(by_id), size, capacity, spill_after, unresponsive)
                self._book(pending_request, order[0][0], size)
        return [[by_id[replica_id] for replica_id in rank] for rank in order]

    def _book(self, pending_request: PendingRequest | None, replica_id: str, size: int) -> None:
        """Count the call's requests on the replica it is offered to first; when Ray settles on a replica the
        booking follows it, and a call cancelled before it was sent gives its booking back."""
        if pending_request is None or not size:
            return
        key, booked = pending_request.metadata.internal_request_id, self._booked
        with self._booking_lock:
            booked[key] = (replica_id, size)

        def settled(future: asyncio.Future) -> None:
            with self._booking_lock:
                if future.cancelled() or future.exception() is not None:
                    booked.pop(key, None)
                elif key in booked:
                    booked[key] = (future.result().replica_id.unique_id, size)

        pending_request.future.add_done_callback(settled)

    def on_request_completed(self, replica_id, internal_request_id: str) -> None:
        """The call has ended on its replica (answered, failed, cancelled, or its replica died)."""
        with self._booking_lock:
            booking = self._booked.get(internal_request_id)
            if booking is not None and booking[0] == replica_id.unique_id:
                del self._booked[internal_request_id]

    async def _probe(self, replica: RunningReplica):
        """The replica's ongoing calls, asked of the replica itself (Ray's cache is refreshed by every send, so
        it would vouch for a stopped replica); None when it does not answer within PROBE_DEADLINE_S (then Ray's
        cache of it is dropped, so that Ray probes it before it sends anything there); _DEAD when its actor is
        gone."""
        try:
            queue = await asyncio.wait_for(replica.get_queue_len(deadline_s=PROBE_DEADLINE_S), PROBE_DEADLINE_S)
        except ActorDiedError:
            self.on_replica_actor_died(replica.replica_id)
            return _DEAD
        except Exception:  # stopped, hung, or unreachable for now
            log.warning("replica %s did not answer a probe in %g s", replica.replica_id.unique_id, PROBE_DEADLINE_S)
            self.on_replica_actor_unavailable(replica.replica_id)
            return None
        self.replica_queue_len_cache.update(replica.replica_id, queue)
        return queue


_DEAD = object()
