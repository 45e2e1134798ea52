"""A stream URL (RTSP, RTMP, SRT, HLS, MPEG-TS over HTTP) read as a live feed: frames sampled by capture
time at the frame sampling's fps, resized as uploads are, each with its capture time t_s in seconds from
the feed's start, for a live session's `push` (docs/live.md).

Each connection is read by a reader process of its own (the uploads' program, engine/reading/reader_process.py,
its "stream" op; engine/reading/decoders/pyav_stream.py decodes), under the uploads' memory cap; one that sends
nothing for twice the timeout is killed. The warm pool is not used: a stream holds its reader for as long as
it plays, and would take it from the uploads. When a stream drops after it played, the feed says so in a
status line and connects again, up to `reconnects` times in a row, waiting longer each time; a connection
that gives frames again starts the count over. It ends with one sentence when it cannot go on: the first
connection failed, the tries ran out, the frames are too large, or the feed reached the longest video
allowed. Times keep increasing across reconnections: a new connection's frames start where the wall clock
says the feed has got to.

A recording on disk is read the same way (`LiveStream.of_file`, for a file played as live): no reconnections,
and a reader that waits for its consumer instead of dropping frames, since a file, unlike a camera, can wait.

No torch or PyAV here: the engine's process only starts readers and reads their pipes.
"""

import ipaddress
import math
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from engine.config import EngineConfig, FrameSampling
from engine.errors import InputError

from .pipe import ReaderGone, ReaderPipe
from .pool import READY_TIMEOUT_S, start_reader
from .video import duration_pair, too_many_pixels

STREAM_SCHEMES = ("rtsp", "rtsps", "rtmp", "rtmps", "srt", "http", "https")
RECONNECTS = 3  # tries in a row after a drop
RETRY_S = 1.0  # the first try's wait; each next one waits twice as long
QUEUE_FRAMES = 32  # frames held for a consumer that falls behind; past it the oldest is dropped
STREAM_TIMEOUT_S = 10.0  # the longest a feed under an engine's limits waits for its server (opening, each read)
STALL_FACTOR = 2.0  # a reader that sends nothing for this many timeouts is hung: FFmpeg's own timeout did not fire

STREAM_ENDED = "The stream ended."  # a feed that does not reconnect (reconnects=0), as a file played as live
NOT_A_STREAM_URL = (
    "A stream URL must start with rtsp://, rtsps://, rtmp://, rtmps://, srt://, http:// or https:// "
    "and name a host, e.g. rtsp://camera.example.com/live."
)


def check_stream_url(url) -> str:
    """`url` stripped, when it is a URL of a scheme a feed reads, with a host; InputError otherwise."""
    if not isinstance(url, str):
        raise InputError(NOT_A_STREAM_URL)
    url = url.strip()
    try:
        parts = urlsplit(url)
        host = parts.hostname
        _ = parts.port  # a port that is not a number raises here
    except ValueError:
        raise InputError(NOT_A_STREAM_URL) from None
    if parts.scheme.lower() not in STREAM_SCHEMES or not host or any(c.isspace() for c in url):
        raise InputError(NOT_A_STREAM_URL)
    return url


def is_public_address(address: str) -> bool:
    """True for an address on the public internet (not loopback, private, link-local, reserved, ...)."""
    try:
        return ipaddress.ip_address(address).is_global
    except ValueError:
        return False


def public_stream_url(url) -> str:
    """`url` when it is a stream URL (check_stream_url) whose host resolves to public addresses only, every one of
    them: the rule a server with --live-urls applies (ui/live_urls.py); InputError with one sentence otherwise."""
    url = check_stream_url(url)
    parts = urlsplit(url)
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise InputError(f"The stream URL's host {parts.hostname} could not be found.") from None
    if not infos or not all(is_public_address(info[4][0]) for info in infos):
        raise InputError("Only streams at public internet addresses are read.")
    return url


def recording_path(path) -> Path:
    """`path` as a Path when a file is there; InputError otherwise."""
    if not Path(path).is_file():
        raise InputError(f"There is no file at {path}.")
    return Path(path)


@dataclass(frozen=True)
class LiveFrame:
    """One frame of a feed: (H, W, 3) uint8 RGB, resized as an upload's; t_s, its capture time in seconds
    from the feed's start (increasing)."""

    frame: np.ndarray
    t_s: float


class LiveStream:
    """A stream URL's frames, read in the background from the moment it is made. Iterate it for
    `LiveFrame`s and status lines (str) in order; the iteration ends when the stream does, its last item
    then the sentence that says why (`ending`), or when `close()` is called (no sentence).

    sampling: the fps frames are taken at and their size (max_pixels_per_frame); max_frames does not apply
    to a feed. timeout_s: how long opening, and then each read, may wait for the server. memory_bytes: the
    reader's cap, as an upload's. max_source_pixels: the most width * height of the stream's frames.
    max_seconds: the longest a feed runs, as the longest upload. local_file: `url` is a file's path (of_file).
    """

    def __init__(
        self,
        url: str,
        sampling: FrameSampling,
        *,
        timeout_s: float,
        memory_bytes: int,
        max_source_pixels: int,
        max_seconds: float,
        reconnects: int = RECONNECTS,
        retry_s: float = RETRY_S,
        queue_frames: int = QUEUE_FRAMES,
        local_file: bool = False,
    ):
        # A path is never taken from a URL's text: check_stream_url keeps file: out of what a person may name.
        self.url = f"file:{Path(url).resolve()}" if local_file else check_stream_url(url)
        self.host = Path(url).name if local_file else urlsplit(self.url).hostname
        self.source = f"The file {self.host}" if local_file else f"The stream at {self.host}"
        self.waits = local_file  # when the consumer falls behind: a file's reader waits, a stream's frames drop
        self.sampling = sampling
        self.timeout_s = timeout_s
        self.memory_bytes = memory_bytes
        self.max_source_pixels = max_source_pixels
        self.max_seconds = max_seconds
        self.reconnects = reconnects
        self.retry_s = retry_s
        self.queue_frames = queue_frames
        self.ending: str | None = None
        self.frames_dropped = 0  # taken from the stream, then dropped because the consumer fell behind
        self._items: deque = deque()
        self._frames_held = 0
        self._done = False
        self._closed = threading.Event()
        self._changed = threading.Condition()
        self._reader: ReaderPipe | None = None
        self._thread = threading.Thread(target=self._run, name="evs-live-stream", daemon=True)
        self._thread.start()

    @classmethod
    def under_limits(cls, url: str, sampling: FrameSampling, config: EngineConfig) -> "LiveStream":
        """A feed under an engine's limits for uploads: the reader's memory cap, the frame size as sent, the
        longest video; each read waits as long as an upload's, STREAM_TIMEOUT_S at most, since a camera
        that goes quiet that long has dropped."""
        return cls(
            url,
            sampling,
            timeout_s=min(config.read_timeout_s, STREAM_TIMEOUT_S),
            memory_bytes=config.read_memory_bytes,
            max_source_pixels=config.max_video_source_pixels,
            max_seconds=config.max_video_seconds,
        )

    @classmethod
    def of_file(cls, path, sampling: FrameSampling, config: EngineConfig) -> "LiveStream":
        """A recording's frames as a feed under an engine's limits for uploads, read once to its end ("The
        stream ended."), as fast as its consumer takes them. InputError when there is no such file."""
        return cls(
            str(recording_path(path)),
            sampling,
            timeout_s=min(config.read_timeout_s, STREAM_TIMEOUT_S),
            memory_bytes=config.read_memory_bytes,
            max_source_pixels=config.max_video_source_pixels,
            max_seconds=config.max_video_seconds,
            reconnects=0,
            local_file=True,
        )

    def __iter__(self) -> Iterator[LiveFrame | str]:
        while True:
            with self._changed:
                while not self._items and not self._done:
                    self._changed.wait()
                if not self._items:
                    return
                item = self._items.popleft()
                if isinstance(item, LiveFrame):
                    self._frames_held -= 1
                    self._changed.notify_all()  # a file's reader may be waiting for room
            yield item

    def close(self) -> None:
        """Stop reading: the reader is killed, the iteration ends after what it holds. Safe to call twice."""
        self._closed.set()
        with self._changed:
            reader = self._reader
        if reader is not None:
            reader.kill()
        self._thread.join(timeout=10)

    def __enter__(self) -> "LiveStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _put(self, item: LiveFrame | str) -> None:
        with self._changed:
            if isinstance(item, LiveFrame):
                while self.waits and self._frames_held == self.queue_frames and not self._closed.is_set():
                    self._changed.wait(0.1)
                if self._frames_held == self.queue_frames:
                    oldest = next(i for i, held in enumerate(self._items) if isinstance(held, LiveFrame))
                    del self._items[oldest]
                    self._frames_held -= 1
                    self.frames_dropped += 1
                self._frames_held += 1
            self._items.append(item)
            self._changed.notify_all()

    def _end(self, sentence: str | None) -> None:
        with self._changed:
            self.ending = sentence
            if sentence is not None:
                self._items.append(sentence)
            self._done = True
            self._changed.notify_all()

    def _run(self) -> None:
        """The feed's thread: one reader per connection, started here so that it lives as long as this
        thread does (engine/reading/pool.py, start_reader)."""
        started_s, last_t_s, tries, connection = time.monotonic(), None, 0, 0
        while not self._closed.is_set():
            base_s = 0.0 if last_t_s is None else max(last_t_s + 1 / self.sampling.fps, time.monotonic() - started_s)
            last, frames, last_t_s = self._connection(base_s, last_t_s)
            connection += 1
            if self._closed.is_set():
                break
            final = self._final_sentence(last, played=connection > 1 or frames > 0)
            if final is not None:
                self._end(final)
                return
            tries = 1 if frames else tries + 1
            if not self.reconnects:
                self._end(STREAM_ENDED)
                return
            if tries > self.reconnects:
                tried = f"{self.reconnects} {'try' if self.reconnects == 1 else 'tries'}"
                self._end(f"The stream dropped and could not be reached again in {tried}.")
                return
            self._put(f"The stream dropped; reconnecting (try {tries} of {self.reconnects}).")
            if self._closed.wait(self.retry_s * 2 ** (tries - 1)):
                break
        self._end(None)

    def _connection(self, base_s: float, last_t_s: float | None) -> tuple[dict, int, float | None]:
        """One connection, read to its end: (the reader's last header, frames taken, the last frame's t_s).
        Frames' times are base_s + the connection's own."""
        frames = 0
        try:
            reader = start_reader()
        except OSError:
            return {"status": "unreadable"}, 0, last_t_s
        with self._changed:
            self._reader = reader
        try:
            header, _ = reader.receive(time.monotonic() + READY_TIMEOUT_S)
            if header.get("status") != "ready" or self._closed.is_set():
                return {"status": "unreadable"}, 0, last_t_s
            reader.send(
                {
                    "op": "stream",
                    "url": self.url,
                    "fps": self.sampling.fps,
                    "max_pixels_per_frame": self.sampling.max_pixels_per_frame,
                    "max_source_pixels": self.max_source_pixels,
                    "memory_bytes": self.memory_bytes,
                    "timeout_s": self.timeout_s,
                    "threads": 1,
                }
            )
            while True:
                header, payload = reader.receive(time.monotonic() + STALL_FACTOR * self.timeout_s)
                if header.get("status") != "frame":
                    return header, frames, last_t_s
                t_s = base_s + float(header["t_s"])
                if not math.isfinite(t_s) or payload is None or payload.size != math.prod(header["shape"]):
                    return {"status": "unreadable"}, frames, last_t_s
                if t_s > self.max_seconds:
                    return {"status": "too_long"}, frames, last_t_s
                self._put(LiveFrame(payload.reshape(header["shape"]), t_s))
                frames, last_t_s = frames + 1, t_s
        except TimeoutError:
            return {"status": "stalled"}, frames, last_t_s
        except (ReaderGone, OSError, ValueError, KeyError, TypeError):  # killed by close(), or garbled
            return {"status": "unreadable"}, frames, last_t_s
        finally:
            reader.kill()
            with self._changed:
                self._reader = None

    def _final_sentence(self, last: dict, played: bool) -> str | None:
        """The sentence that ends the feed after a connection ended with `last`, or None to reconnect.
        Before the feed ever played, any failure ends it: a URL that does not work now is a mistake to
        tell at once, not a drop to wait out."""
        status = last.get("status")
        if status == "too_many_pixels":
            return too_many_pixels("The stream's frames are", *last["size"], self.max_source_pixels)
        if status == "too_long":
            return f"The stream has played for {duration_pair(self.max_seconds, self.max_seconds)[1]}, the limit."
        if status == "out_of_memory":
            return "Reading the stream needed more memory than the server allows."
        if status == "open_failed" and last.get("reason") == "unsupported":
            return f"This server cannot read {urlsplit(self.url).scheme}:// streams."
        if played:
            return None
        reason = last.get("reason")
        if reason == "refused":
            return f"{self.source} refused the connection."
        if reason == "timed_out" or status == "stalled":
            unit = "second" if self.timeout_s == 1 else "seconds"
            return f"{self.source} did not answer within {self.timeout_s:g} {unit}."
        if reason == "not_found":
            return f"The server at {self.host} has no stream at that address."
        return f"{self.source} could not be read as video."
