"""The Ray Serve request router: a video's requests go to the replica holding its caches.

It runs inside the client's deployment handle (the app process). Ray Serve calls `choose_replicas` for
each request with the live replicas; it answers in ranks (replicas/routing.py): the video's home first,
then everyone, or everyone at once when the home's queue is past the threshold. Queue lengths are Ray
Serve's own (its per-handle cache of each replica's ongoing requests, refreshed on every send and by
probes); no second load balancer. No FIFO mixin: that one hands a replica found for one request to the
oldest waiting request, which would send a video to another video's home.
"""

import asyncio
import logging

from ray.exceptions import ActorDiedError
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from .routing import DEFAULT_SPILL_AFTER, home_of, ranks

log = logging.getLogger(__name__)

# The handle call's keyword argument that names the video (the upload's sha256 hex digest).
DIGEST_KWARG = "digest"
# The keyword argument that names a live session, "<replica id>/<session>": its calls go to that replica alone.
SESSION_KWARG = "session"


class VideoAffinityRouter(RequestRouter):
    """Routes by the `digest` keyword of the call; `spill_after` (request_router_kwargs) is the home
    replica's ongoing requests past which the least-loaded replica takes the request instead. A call about a
    live session (the `session` keyword) goes to the replica holding its state and nowhere else; when that
    replica is gone, to any, which answers that it does not hold the session."""

    def initialize_state(self, spill_after: int = DEFAULT_SPILL_AFTER, **_) -> None:
        self.spill_after = int(spill_after)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        by_id = {replica.replica_id.unique_id: replica for replica in candidate_replicas}
        kwargs = pending_request.kwargs if pending_request is not None else None
        session = kwargs.get(SESSION_KWARG) if kwargs else None
        if session is not None:
            holder = by_id.get(session.split("/")[0])
            return [[holder]] if holder is not None else [list(by_id.values())]
        digest = kwargs.get(DIGEST_KWARG) if kwargs else None
        home_queue = None
        if digest is not None and len(by_id) > 1:
            home = by_id[home_of(digest, list(by_id))]
            home_queue = await self._queue_len(home)
            if home_queue is _DEAD:  # a replica Ray has not yet told us about: route among the rest
                del by_id[home.replica_id.unique_id]
                home_queue = None
        spill_after = getattr(self, "spill_after", DEFAULT_SPILL_AFTER)
        return [[by_id[i] for i in rank] for rank in ranks(digest, list(by_id), home_queue, spill_after)]

    async def _queue_len(self, replica: RunningReplica):
        """The replica's ongoing requests: Ray's cached count, else a probe; None when it does not answer
        in time (then the request still goes home, and Ray's own check before sending decides); _DEAD
        when its actor is gone."""
        cached = self.replica_queue_len_cache.get(replica.replica_id)
        if cached is not None:
            return cached
        deadline_s = self.queue_len_response_deadline_s
        try:
            queue = await asyncio.wait_for(replica.get_queue_len(deadline_s=deadline_s), deadline_s)
        except ActorDiedError:
            self.on_replica_actor_died(replica.replica_id)
            return _DEAD
        except Exception:  # slow or briefly unreachable: no information
            return None
        self.replica_queue_len_cache.update(replica.replica_id, queue)
        return queue


_DEAD = object()
