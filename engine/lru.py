"""A least-recently-used map bounded in bytes (feature cache, prefix KV cache)."""

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any


class ByteLRU:
    """Entries carry their own size; inserting evicts the oldest until the total fits.

    An entry larger than the whole bound is not stored at all.
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes_used = 0
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[Hashable]:
        """The keys held, least recently used first."""
        return list(self._entries)

    def get(self, key: Hashable) -> Any | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: Hashable, value: Any, nbytes: int) -> bool:
        """Store value; returns False when it is too large to keep."""
        self.pop(key)
        if nbytes > self.max_bytes:
            return False
        while self.bytes_used + nbytes > self.max_bytes:
            _, (_, old_bytes) = self._entries.popitem(last=False)
            self.bytes_used -= old_bytes
        self._entries[key] = (value, nbytes)
        self.bytes_used += nbytes
        return True

    def pop(self, key: Hashable) -> Any | None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self.bytes_used -= entry[1]
        return entry[0]
