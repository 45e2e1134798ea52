"""How an upload reaches the replica that answers: its path on one machine, its bytes across machines.

Client side (`VideoSender`): the routing key is the file's sha256 (engine.reading.video.file_sha256), computed
once per (path, size, modification time). Across machines a path means nothing on the replica's node,
so the bytes go through Ray's object store, put once per digest and kept in a byte-bounded LRU so a
follow-up question does not upload the video again; the upload limit bounds each put.
Replica side (`VideoFiles`): bytes become a file in the replica's own temp folder (the engine reads
files), shared by the requests on it and deleted when the last one ends.
"""

import asyncio
import os
import shutil
import tempfile
import threading
from pathlib import Path

import ray

from engine.errors import NO_VIDEO, InputError
from engine.lru import ByteLRU
from engine.reading.video import file_sha256, size_pair


class VideoSender:
    """Client side. ship_bytes: send bytes through the object store (else the path);
    max_file_bytes: the upload limit; cache_bytes: most bytes of videos kept in the object store."""

    def __init__(self, ship_bytes: bool, max_file_bytes: int, cache_bytes: int):
        self.ship_bytes = ship_bytes
        self.max_file_bytes = max_file_bytes
        self._digests: dict[tuple, str] = {}  # (path, size, mtime_ns) -> sha256 hex
        self._refs = ByteLRU(cache_bytes)  # sha256 hex -> ObjectRef of the file's bytes
        self._lock = threading.Lock()

    def digest(self, path: str) -> str:
        """The upload's sha256 hex digest. Blocks (reads the file): run it off the event loop.

        Raises InputError with the engine's own sentences for a missing file or one over the limit
        (hashing a file the engine would refuse anyway is wasted work).
        """
        file = Path(path)
        if not file.is_file():
            raise InputError(NO_VIDEO)
        info = file.stat()
        if info.st_size > self.max_file_bytes:
            size_text, limit_text = size_pair(info.st_size, self.max_file_bytes)
            raise InputError(f"The video is {size_text}; the limit is {limit_text}.")
        key = (str(file.resolve()), info.st_size, info.st_mtime_ns)
        with self._lock:
            known = self._digests.get(key)
        if known is None:
            known = file_sha256(file)
            with self._lock:
                if len(self._digests) > 4096:  # uploads are short-lived; forget the oldest paths
                    self._digests.pop(next(iter(self._digests)))
                self._digests[key] = known
        return known

    def payload(self, path: str, digest: str) -> dict:
        """What the replica gets: {"path": str}, or {"ref": ObjectRef, "suffix": ".mp4"} with the bytes.
        Blocks (reads and puts the file) in bytes mode: run it off the event loop."""
        if not self.ship_bytes:
            return {"path": str(path)}
        with self._lock:
            ref = self._refs.get(digest)
        if ref is None:
            data = Path(path).read_bytes()
            ref = ray.put(data)
            with self._lock:
                self._refs.put(digest, ref, len(data))
        return {"ref": ref, "suffix": Path(path).suffix or ".mp4"}


class VideoFiles:
    """Replica side: the file the engine reads for each call, with reference counts on shipped bytes.
    Each call holds its video first, then acquires its path, and releases it when it ends."""

    def __init__(self):
        self._folder: Path | None = None  # made on the first shipped video (most replicas never see one)
        self._users: dict[str, int] = {}  # digest -> calls holding its file
        self._lock = threading.Lock()

    def hold(self, digest: str, payload: dict) -> None:
        """Count the call as a user of the video's file (before anything can fail or be cancelled)."""
        if "path" not in payload:
            with self._lock:
                self._users[digest] = self._users.get(digest, 0) + 1

    async def acquire(self, digest: str, payload: dict) -> str:
        """The local path of the call's video, written from the object store when it is not here yet."""
        if "path" in payload:
            return payload["path"]
        with self._lock:
            if self._folder is None:
                self._folder = Path(tempfile.mkdtemp(prefix="evs-replica-videos-"))
            target = self._folder / f"{digest}{payload['suffix']}"
            present = target.exists()
        if not present:
            data = await payload["ref"]
            # Written under a private name and renamed, so a concurrent call never reads half a file.
            partial = target.with_name(f".{digest}.{os.getpid()}.{id(payload)}.part")
            await asyncio.to_thread(partial.write_bytes, data)
            os.replace(partial, target)
        return str(target)

    def release(self, digest: str, payload: dict) -> None:
        if "path" in payload:
            return
        with self._lock:
            self._users[digest] -= 1
            if self._users[digest]:
                return
            del self._users[digest]
            # Under the lock, so a call arriving now writes the file again rather than finding it gone.
            # The engine has its sampled frames (and may still have the file open: unlinking is fine).
            if self._folder is not None:
                for file in self._folder.glob(f"{digest}.*"):
                    file.unlink(missing_ok=True)

    def close(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
