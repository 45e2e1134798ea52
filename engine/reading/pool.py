"""A warm pool of isolated reader processes: each upload is read in a child that has already imported
PyAV and numpy (reader_process.py), one file at a time per child.

Isolation is what a fresh child per file gave: a file that hangs the decoder past its timeout, crashes
it, or makes it allocate past its memory cap costs that child and its own request only. The pool kills
that reader in the request's own thread and orders a replacement, which starts in the background; no
other request waits on either. A reader that dies of a SIGKILL the pool did not send (the kernel's
out-of-memory killer, an operator) was not killed by its file: the file goes to one more reader.
Frames come back through the reader's stdout pipe as raw bytes read straight into the array that holds
them (no pickling, no second copy), and a soundtrack, when asked for, as float32 samples after them.

Readers are started by one keeper thread, because Linux's parent-death signal (which each reader asks
for) fires when the thread that started a child ends, not only the process: the keeper lives as long as
the pool. A reader therefore dies with the engine's process even mid-decode, and exits when its stdin
closes. The pool never holds more readers than its size: each of `size` slots is starting, idle or busy.

A video worth splitting (engine/reading/segments.py) comes back from its first reader as its timeline and
keyframe groups (units) instead of frames; the pool hands runs of whole units to that reader and to the
readers idle at that moment, all decoding at once, and the caller puts the frames back in sampled order. The
first segment's reader reads the soundtrack too.

Readers are plain subprocesses, not multiprocessing 'spawn' children: those re-import the parent's main
module (app.py: gradio, torch) and the engine package (torch, transformers), 14-21 s and 860 MB each.
"""

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .pipe import Garbled, ReaderGone, ReaderPipe, unpack_answer
from .segments import SPLIT_MIN_PIXELS, segments
from .soundtrack import Soundtrack

log = logging.getLogger(__name__)

# The reader runs this under a bare `engine` package: argv[1] is the engine folder, argv[2] the pid it
# must die with. Read at every start, so tests can run readers of their own (tests/test_decoder_faults.py).
READER_PROGRAM = """
import sys, types
package = types.ModuleType("engine")
package.__path__ = [sys.argv[1]]
sys.modules["engine"] = package
from engine.reading.reader_process import serve
serve(int(sys.argv[2]))
"""
_ENGINE_DIR = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 120.0  # a reader's start-up (importing PyAV and numpy): ~0.3 s, seconds on a busy host
# The status of an exchange whose reader died of a SIGKILL the pool did not send: the kernel's out-of-memory
# killer or an operator, not the file, so the file gets one more reader before it is called unreadable.
KILLED = "killed"


def start_reader() -> ReaderPipe:
    """A new reader process (READER_PROGRAM), not yet ready: its first line says so. Linux kills it when the
    thread that called this ends, so only a thread that outlives the reader may (OSError when it cannot
    start)."""
    command = [sys.executable, "-c", READER_PROGRAM, str(_ENGINE_DIR), str(os.getpid())]
    return ReaderPipe(subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0))


def default_size() -> int:
    """Readers for this host: one per core this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


@dataclass
class Read:
    """One upload's answer from the pool.

    header: the reader's answer ("status" and, when "ok", total_frames, duration_s, wanted, work), or
    {"status": "too_slow"} past the timeout, {"status": "unreadable"} when a reader died or answered
    garbage. parts: (entries, (K, H, W, 3) uint8 frames or None) per segment, in order, for
    video_segments.assemble. wait_s: seconds waiting for a free reader; read_s: seconds from handing it
    the file to the last frame back. readers: how many read it at once. soundtrack: the file's, when the
    request asked for it and the file has one; soundtrack_status: "ok", "none" (no audio stream) or
    "unreadable" when it was asked for and the frames were read, else None.
    """

    header: dict
    parts: list[tuple[list[dict], np.ndarray | None]]
    wait_s: float
    read_s: float
    readers: int
    soundtrack: Soundtrack | None = None
    soundtrack_status: str | None = None


class ReaderPool:
    """`size` reader processes, started at once in the background; `read` hands a file to a free one.

    split_min_pixels: a video whose keyframe groups would decode at least this many pixels is split
    among the readers idle when it arrives (tests lower it to split small files).
    """

    def __init__(self, size: int, *, split_min_pixels: int = SPLIT_MIN_PIXELS):
        if size < 1:
            raise ValueError("a reader pool needs at least one reader")
        self.size = size
        self.split_min_pixels = split_min_pixels
        self._lock = threading.Condition()
        self._idle: deque[ReaderPipe] = deque()
        self._readers: set[ReaderPipe] = set()  # every reader started and not yet killed
        self._closed = False
        self._freed_at = time.monotonic()  # when a reader last came free (or the pool started)
        self._failures = 0  # starts in a row that never became ready: the retry waits longer each time
        self._ordered = threading.Semaphore(size)  # readers to start: every slot at first, then each replacement
        self._segments = ThreadPoolExecutor(max_workers=size, thread_name_prefix="evs-segment")
        self._keeper = threading.Thread(target=self._keep, name="evs-reader-keeper", daemon=True)
        self._keeper.start()

    def read(self, request: dict, timeout_s: float, *, count_wait: bool = False) -> Read:
        """Read one upload: `request` is engine/reading/reader_process.py's "read" request but for op and parts.
        timeout_s bounds the reading, from handing the file to a reader; with count_wait it also bounds the
        wait for a free reader (a pool started for one file: its reader's start). Past it the answer is
        "too_slow". Without count_wait the wait lasts while the pool makes progress: it ends "too_slow" only
        once no reader has come free for timeout_s + READY_TIMEOUT_S, longer than any read or start takes,
        so the pool has stalled (readers that fail to start), not merely busy."""
        asked = time.perf_counter()
        first = self._take(time.monotonic() + timeout_s if count_wait else None, timeout_s + READY_TIMEOUT_S)
        started = time.perf_counter()
        if first is None:
            return Read({"status": "too_slow"}, [], started - asked, 0.0, 0)
        deadline = time.monotonic() + timeout_s - (started - asked if count_wait else 0.0)
        readers = [first]
        try:
            header, body, soundtrack = self._ask_to_read(first, request, deadline)
            if header["status"] == KILLED and (second := self._take(None, timeout_s + READY_TIMEOUT_S)):
                # waiting for it as for the first reader, then the file's whole timeout again
                readers, deadline = [second], time.monotonic() + timeout_s
                header, body, soundtrack = self._ask_to_read(second, request, deadline)
            found = [(header.get("entries"), body)]
            if header["status"] == "split":
                readers += self._take_idle(len(header["units"]) - 1)
                header, found, soundtrack = self._read_segments(readers, request, header, body, deadline)
        finally:
            for reader in readers:
                self._give_back(reader)
        if header["status"] == KILLED:
            header, found = {"status": "unreadable"}, []
        soundtrack_status = (header.get("soundtrack") or {}).get("status") if header["status"] == "ok" else None
        return Read(
            header, found, started - asked, time.perf_counter() - started, len(readers), soundtrack, soundtrack_status
        )

    def _ask_to_read(
        self, reader: ReaderPipe, request: dict, deadline: float
    ) -> tuple[dict, np.ndarray | None, Soundtrack | None]:
        with self._lock:
            parts = 1 + len(self._idle)
        return self._ask(
            reader,
            {
                **request,
                "op": "read",
                "parts": parts,
                "threads": self._decoder_threads(),
                "split_min_pixels": self.split_min_pixels,
            },
            None,
            deadline,
        )

    def _decoder_threads(self) -> int:
        """Decoder threads for a reader about to decode: the cores shared among the readers reading now (the
        ones just taken included, and any still starting), or 0 (one per core) for a reader reading alone.
        A thread per core each would make them take turns, and frame threads cost CPU of their own: one
        thread decodes a half of bench/decoding.py's 1080p H.264 file in 13% less CPU than two."""
        with self._lock:
            reading = len(self._readers) - len(self._idle)
        return max(1, default_size() // reading) if reading > 1 else 0

    def _read_segments(
        self, readers: list[ReaderPipe], request: dict, header: dict, timeline_bytes: np.ndarray, deadline: float
    ) -> tuple[dict, list, Soundtrack | None]:
        """One segment per reader, all at once (more segments, taken in turns, measured slower: each costs
        its reader opening the file and decoder again); the first failure is the answer. The first segment's
        reader reads the soundtrack as well, while the others decode."""
        pieces = segments(header["units"], len(readers))
        threads = self._decoder_threads()

        def one(reader: ReaderPipe, targets: list[int], soundtrack: dict | None = None):
            return self._ask(
                reader,
                {
                    "op": "segment",
                    "path": request["path"],
                    "memory_bytes": request["memory_bytes"],
                    "plan": header["plan"],
                    "targets": targets,
                    "threads": threads,
                    "soundtrack": soundtrack,
                },
                timeline_bytes,
                deadline,
            )

        helpers = [self._segments.submit(one, reader, targets) for reader, targets in zip(readers[1:], pieces[1:])]
        answers = [one(readers[0], pieces[0], request.get("soundtrack"))] + [future.result() for future in helpers]
        for answer, _, _ in answers:
            if answer["status"] != "ok":
                return answer, [], None
        work = {
            "frames_decoded": sum(a["work"]["frames_decoded"] for a, _, _ in answers),
            "seeks": sum(a["work"]["seeks"] for a, _, _ in answers),
            "in_order": any(a["work"]["in_order"] for a, _, _ in answers),
        }
        decoded = [a["work"]["decoded_size"] for a, _, _ in answers if "decoded_size" in a["work"]]
        if decoded:
            work["decoded_size"] = decoded[-1]
        first, _, soundtrack = answers[0]
        carried = {"soundtrack": first["soundtrack"]} if "soundtrack" in first else {}
        return (
            {**header, "status": "ok", "work": work, "segments": len(answers), **carried},
            [(answer["entries"], frames) for answer, frames, _ in answers],
            soundtrack,
        )

    def _ask(
        self, reader: ReaderPipe, request: dict, payload, deadline: float
    ) -> tuple[dict, np.ndarray | None, Soundtrack | None]:
        """One exchange with a reader: (header, frames or the split's timeline bytes, soundtrack). A reader that
        times out, dies or answers garbage is killed here and replaced; the answer then says "too_slow" or
        "unreadable"."""
        try:
            reader.send(request, payload)
            header, body = reader.receive(deadline)
            soundtrack = None
            if header.get("status") == "ok":
                body, soundtrack = unpack_answer(header, body)
        except TimeoutError:
            self._discard(reader)
            return {"status": "too_slow"}, None, None
        except Garbled:
            self._discard(reader)
            return {"status": "unreadable"}, None, None
        except (OSError, ValueError, ReaderGone):  # ValueError: a pipe closed under it by shutdown
            killed = self._killed_from_outside(reader)
            self._discard(reader)
            return {"status": KILLED if killed else "unreadable"}, None, None
        if not isinstance(header.get("status"), str):
            self._discard(reader)
            return {"status": "unreadable"}, None, None
        if header.get("retire"):
            self._discard(reader)
        return header, body, soundtrack

    def _killed_from_outside(self, reader: ReaderPipe) -> bool:
        """Whether a reader whose pipe failed died of a SIGKILL the pool did not send. A decoder that dies
        on a malformed file aborts or faults (SIGABRT, SIGSEGV); a pipe that failed on a reader still running
        a second later (closed by something else) is the file's fault too."""
        try:
            code = reader.process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return False
        with self._lock:
            return code == -signal.SIGKILL and not reader.gone and not self._closed

    def _take(self, deadline: float | None, stall_s: float) -> ReaderPipe | None:
        """A free reader, waiting for one until `deadline` (time.monotonic(); None: no end) or until no
        reader has come free for stall_s; None then."""
        while True:
            with self._lock:
                while not self._idle and not self._closed:
                    end = self._freed_at + stall_s if deadline is None else min(deadline, self._freed_at + stall_s)
                    if time.monotonic() >= end:
                        return None
                    self._lock.wait(end - time.monotonic())
                if self._closed:
                    raise RuntimeError("the reader pool is shut down")
                reader = self._idle.popleft()
            if self._alive(reader):
                return reader

    def _take_idle(self, most: int) -> list[ReaderPipe]:
        with self._lock:
            taken = [self._idle.popleft() for _ in range(min(most, len(self._idle)))]
        return [reader for reader in taken if self._alive(reader)]

    def _alive(self, reader: ReaderPipe) -> bool:
        """Whether a free reader still runs; one that died while idle (killed from outside: the kernel's
        out-of-memory killer, an operator) is replaced here, so that no file is blamed for it."""
        if reader.process.poll() is None:
            return True
        self._discard(reader)
        return False

    def _give_back(self, reader: ReaderPipe) -> None:
        with self._lock:
            if reader.gone:
                return
            if self._closed:
                reader.kill()
                return
            self._idle.append(reader)
            self._freed_at = time.monotonic()
            self._lock.notify()

    def _discard(self, reader: ReaderPipe, retry_after_s: float = 0.0) -> None:
        """Kill a reader (in the caller's thread: SIGKILL and reaping take milliseconds) and order a new one."""
        reader.kill()
        with self._lock:
            self._readers.discard(reader)
            closed = self._closed
        if closed:
            return
        if retry_after_s:
            timer = threading.Timer(retry_after_s, self._order)
            timer.daemon = True
            timer.start()
        else:
            self._order()

    def _order(self) -> None:
        with self._lock:
            if self._closed:
                return
        self._ordered.release()

    def _keep(self) -> None:
        """The keeper thread: starts every reader, so the readers' parent-death signal fires only when the
        pool ends (or the process dies); each start warms up in a thread of its own."""
        while True:
            self._ordered.acquire()
            with self._lock:
                if self._closed:
                    return
            try:
                reader = start_reader()
            except OSError:
                log.exception("could not start a video reader")
                timer = threading.Timer(self._retry_delay_s(), self._order)
                timer.daemon = True
                timer.start()
                continue
            with self._lock:
                if self._closed:
                    reader.kill()
                    return
                self._readers.add(reader)
            threading.Thread(target=self._warm, args=(reader,), name="evs-reader-warm", daemon=True).start()

    def _warm(self, reader: ReaderPipe) -> None:
        """Wait for a new reader's ready line, then make it idle; one that never gets ready is replaced,
        after a pause that doubles with each failure in a row (up to 5 s)."""
        try:
            header, _ = reader.receive(time.monotonic() + READY_TIMEOUT_S)
            ready = header.get("status") == "ready"
        except (TimeoutError, OSError, ValueError, ReaderGone):
            ready = False
        if not ready:
            log.warning("a video reader (pid %d) failed to start; starting another", reader.pid)
            self._discard(reader, retry_after_s=self._retry_delay_s())
            return
        with self._lock:
            self._failures = 0
        self._give_back(reader)

    def _retry_delay_s(self) -> float:
        with self._lock:
            self._failures += 1
            return min(5.0, 0.1 * 2**self._failures)

    @property
    def idle(self) -> int:
        """Readers started, warm and free now."""
        with self._lock:
            return len(self._idle)

    def pids(self) -> set[int]:
        """Process ids of every reader started and not yet killed."""
        with self._lock:
            return {reader.pid for reader in self._readers}

    def shutdown(self) -> None:
        """Kill every reader and wait for each; the pool takes no more reads. Safe to call twice."""
        with self._lock:
            self._closed = True
            readers = list(self._readers)
            self._readers.clear()
            self._idle.clear()
            self._lock.notify_all()
        self._ordered.release()  # wakes the keeper, which sees the pool closed
        self._keeper.join(timeout=10)
        for reader in readers:
            reader.kill()
        self._segments.shutdown(wait=True)

    def __enter__(self) -> "ReaderPool":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
