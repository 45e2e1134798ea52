"""The engine's half of the reader protocol (docs/architecture.md, "The reader protocol"): one JSON line and
raw bytes each way per message, read with a deadline, and an answer's bytes checked against its line."""

import json
import os
import select
import subprocess
import time

import numpy as np

from .soundtrack import SAMPLE_DTYPE, Soundtrack, soundtrack_from_message


class ReaderGone(Exception):
    """A reader's pipe closed or its answer made no sense."""


class Garbled(ReaderGone):
    """A reader answered, but not as the protocol says: it lives on, so nothing killed it."""


class ReaderPipe:
    """The engine's end of one reader: the process and its two pipes (stdin for requests, stdout for answers)."""

    def __init__(self, process: subprocess.Popen):
        self.process = process
        self.pid = process.pid
        self.gone = False
        # Bytes read past the last answer: the start of the next. A stream's reader answers frame after frame, and
        # one read of the pipe may hold several.
        self._ahead = b""

    def send(self, header: dict, payload=None) -> None:
        data = memoryview(payload if payload is not None else b"")
        message = json.dumps({**header, "payload_bytes": data.nbytes}).encode() + b"\n"
        fd = self.process.stdin.fileno()
        for chunk in (memoryview(message), data):
            while chunk.nbytes:
                chunk = chunk[os.write(fd, chunk) :]

    def receive(self, deadline: float) -> tuple[dict, np.ndarray | None]:
        """(header, payload) of the next answer, the payload flat uint8 (unpack_answer splits an "ok" one).
        TimeoutError past `deadline` (time.monotonic()), ReaderGone when the pipe ends or the header is not
        JSON."""
        fd = self.process.stdout.fileno()
        received = bytearray(self._ahead)
        self._ahead = b""
        while b"\n" not in received:
            chunk = self._read(fd, 1 << 16, deadline)
            received += chunk
        line, _, start = bytes(received).partition(b"\n")
        try:
            header = json.loads(line)
            size = int(header.get("payload_bytes", 0))
        except (ValueError, TypeError, AttributeError):
            raise Garbled("the reader's answer is not a JSON object") from None
        self._ahead = start[size:]
        if not size:
            return header, None
        payload = np.empty(size, np.uint8)
        view = memoryview(payload)
        filled = min(len(start), size)
        view[:filled] = start[:filled]
        while filled < size:
            count = self._read_into(fd, view[filled:], deadline)
            filled += count
        return header, payload

    def _wait_readable(self, fd: int, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            raise TimeoutError

    def _read(self, fd: int, size: int, deadline: float) -> bytes:
        self._wait_readable(fd, deadline)
        chunk = os.read(fd, size)
        if not chunk:
            raise ReaderGone("the reader's pipe ended")
        return chunk

    def _read_into(self, fd: int, view: memoryview, deadline: float) -> int:
        self._wait_readable(fd, deadline)
        count = self.process.stdout.readinto(view)
        if not count:
            raise ReaderGone("the reader's pipe ended")
        return count

    def kill(self) -> None:
        self.gone = True
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()  # reaped: no zombie; the pipes close with the object, after any reader thread


def unpack_answer(header: dict, payload: np.ndarray | None) -> tuple[np.ndarray | None, Soundtrack | None]:
    """An "ok" answer's payload as ((K, H, W, 3) frames or None, Soundtrack or None): the frames' bytes
    (header["shape"]), then the samples' when header["soundtrack"] says "ok". ReaderGone when the bytes are not
    exactly those, or the frames not as many as the entries."""
    try:
        shape = header.get("shape")
        frame_bytes = int(np.prod(shape)) if shape else 0
        described = header.get("soundtrack") or {}
        heard = described.get("status") == "ok"
        sample_bytes = int(described["samples"]) * SAMPLE_DTYPE.itemsize if heard else 0
        size = 0 if payload is None else payload.nbytes
        if size != frame_bytes + sample_bytes or len(header.get("entries", ())) != (shape[0] if shape else 0):
            raise Garbled("the reader's bytes do not match what its answer says they hold")
        frames = payload[:frame_bytes].reshape(shape) if shape else None
        soundtrack = soundtrack_from_message(described, payload[frame_bytes:]) if heard else None
    except (ValueError, TypeError, KeyError, AttributeError):
        raise Garbled("the reader's answer does not describe its bytes") from None
    return frames, soundtrack
