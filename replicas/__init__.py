"""Engine replicas on Ray Serve, for serving past one GPU: `python app.py --replicas N`.

Layering: app -> ui -> replicas -> engine. The UI never imports this package; the app builds a
`ReplicatedEngine` instead of an `Engine` when asked for more than one replica, and the UI uses it
through the same interface. Importing this package imports Ray; the single-engine path never does.

    client.py      ReplicatedEngine: submit -> engine.stream.Stream, fed from the deployment handle
    calls.py       one call read into its streams: cancel noticed at once, a silent replica at the deadline
    cluster.py     reaching Ray and deploying, each within a bounded time, or one sentence
    deployment.py  the Serve deployment: one Engine per replica, events streamed as plain data, live sessions
    live.py        a live session held by one replica (every call pinned to it)
    router.py      the Ray Serve request router, keyed by the video's content digest, counting requests
    routing.py     the routing rule itself (rendezvous hashing, room in requests, the spill threshold), without Ray
    videos.py      a video's way to its replica: the path on one machine, bytes in the object store across
    wire.py        events and errors as plain picklable data
"""

from engine.errors import LIVE_SESSION_LOST, SessionLost

from .calls import REPLICA_LOST, Placement, ReplicaLost
from .client import ReplicatedEngine
from .cluster import ReplicasUnavailable
from .live import RemoteLiveSession

__all__ = [
    "LIVE_SESSION_LOST",
    "REPLICA_LOST",
    "Placement",
    "RemoteLiveSession",
    "ReplicaLost",
    "ReplicasUnavailable",
    "ReplicatedEngine",
    "SessionLost",
]
