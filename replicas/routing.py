"""The routing rule, apart from Ray: which replica is a video's home, and when a request leaves it.

Rendezvous (highest-random-weight) hashing: every replica gets a score from the video's digest and its
own id, and the highest score is the video's home. When a replica leaves, only the videos it was home to
move (each to its runner-up); when one joins, it takes roughly 1/N of the videos from the others. So a
restart costs the caches of one replica's videos, not everyone's.
"""

import hashlib
from collections.abc import Sequence

# Requests waiting or running on the home replica (Ray Serve's count of ongoing calls) past which a
# request goes to the least-loaded replica instead: the engine decodes up to 16 requests together
# (EngineConfig.max_running), so past that a request would queue behind others for a decode slot, and a
# cold ViT forward and prefill elsewhere is the shorter wait.
DEFAULT_SPILL_AFTER = 16


def score(digest: str, replica_id: str) -> int:
    """The replica's rendezvous weight for a video: the first 8 bytes of sha256(digest/replica_id)."""
    return int.from_bytes(hashlib.sha256(f"{digest}/{replica_id}".encode()).digest()[:8], "big")


def home_of(digest: str, replica_ids: Sequence[str]) -> str:
    """The replica that holds (or will hold) this video's caches; ties (never seen) break by id."""
    if not replica_ids:
        raise ValueError("no replicas to choose from")
    return max(replica_ids, key=lambda replica_id: (score(digest, replica_id), replica_id))


def goes_home(home_queue: int | None, spill_after: int) -> bool:
    """Whether a request waits on its video's home replica, given the home's ongoing requests (None:
    not known, which happens only when the replica is idle long enough for Ray's cache to expire)."""
    return home_queue is None or home_queue < spill_after


def ranks(digest: str | None, replica_ids: Sequence[str], home_queue: int | None, spill_after: int) -> list[list[str]]:
    """Replica ids in ranks, most preferred first, for one request; home_queue: the ongoing requests of
    the video's home replica (home_of), or None where not known.

    The home replica first while its queue is short, then everyone; everyone at once (where the least
    loaded wins) once the home is past `spill_after`, or when the request names no video. Ray Serve sends
    the request to the shortest queue within a rank, and moves to the next rank only when every replica
    of the rank is full (max_ongoing_requests).
    """
    everyone = sorted(replica_ids)
    if digest is None or len(everyone) <= 1:
        return [everyone]
    if goes_home(home_queue, spill_after):
        return [[home_of(digest, everyone)], everyone]
    return [everyone]
