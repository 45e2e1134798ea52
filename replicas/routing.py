"""The routing rule, apart from Ray: which replica is a video's home, and when a request leaves it.

Rendezvous (highest-random-weight) hashing: every replica gets a score from the video's digest and its
own id, and the highest score is the video's home. When a replica leaves, only the videos it was home to
move (each to its runner-up); when one joins, it takes roughly 1/N of the videos from the others. So a
restart costs the caches of one replica's videos, not everyone's.

Load is counted in requests, as the engine counts its queue: a burst about one video travels as one call of
several requests (replicas/client.py), and a replica's room is its engine's `max_queue` less the requests it
has under way.
"""

import hashlib
from collections.abc import Collection, Mapping, Sequence

# Requests under way on the home replica past which a request goes to the replica with the most room instead:
# the engine decodes up to 16 requests together (EngineConfig.max_running), so past that a request would queue
# behind others for a decode slot, and a cold ViT forward and prefill elsewhere is the shorter wait.
DEFAULT_SPILL_AFTER = 16


def media_key(digests: Sequence[str]) -> str:
    """The routing key of a question about these uploads (their sha256 hex digests, in order): one upload's own
    digest, so that its home is the same whether it is asked about alone or first; several uploads' the sha256 of
    their digests in order, so that the same media asked again find the replica holding their caches."""
    if len(digests) == 1:
        return digests[0]
    return hashlib.sha256("/".join(digests).encode()).hexdigest()


def score(digest: str, replica_id: str) -> int:
    """The replica's rendezvous weight for a video: the first 8 bytes of sha256(digest/replica_id)."""
    return int.from_bytes(hashlib.sha256(f"{digest}/{replica_id}".encode()).digest()[:8], "big")


def home_of(digest: str, replica_ids: Sequence[str]) -> str:
    """The replica that holds (or will hold) this video's caches; ties (never seen) break by id."""
    if not replica_ids:
        raise ValueError("no replicas to choose from")
    return max(replica_ids, key=lambda replica_id: (score(digest, replica_id), replica_id))


def goes_home(home_load: int, size: int, capacity: int, spill_after: int) -> bool:
    """Whether a call of `size` requests waits on its video's home replica, which has `home_load` requests
    under way: only while the home is below `spill_after` and has room for the whole call."""
    return home_load < spill_after and home_load + size <= capacity


def ranks(
    digest: str | None,
    loads: Mapping[str, int],
    size: int,
    capacity: int,
    spill_after: int,
    unresponsive: Collection[str] = (),
) -> list[list[str]]:
    """Replica ids in ranks, most preferred first, one replica a rank, for one call of `size` requests.

    loads: every live replica's requests under way; capacity: the requests one replica's engine queues
    (max_queue). The video's home first while it goes_home; then the others, the most room first (ties by
    id), so that a burst the home cannot take goes whole to a replica that can. A call that names no video
    goes to the most room. Replicas that did not answer a probe (unresponsive) come last: a hung replica is
    tried only when no other can be. Ray Serve tries the ranks in order, moving on when a replica is full or
    does not answer.
    """
    by_room = sorted(loads, key=lambda replica_id: (loads[replica_id] - capacity, replica_id))
    order = by_room
    if digest is not None and len(by_room) > 1:
        home = home_of(digest, by_room)
        if goes_home(loads[home], size, capacity, spill_after):
            order = [home, *(replica_id for replica_id in by_room if replica_id != home)]
    order = [r for r in order if r not in unresponsive] + [r for r in order if r in unresponsive]
    return [[replica_id] for replica_id in order]
