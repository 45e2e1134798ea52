"""The reader process: a long-lived child of the engine that reads one upload at a time with PyAV
(engine/reading/decoders/pyav_video.py, and engine/reading/decoders/pyav_soundtrack.py for its soundtrack).
engine/reading/pool.py starts it as `python -c READER_PROGRAM`, under a bare `engine` package, so engine/__init__.py
(torch, transformers) never loads here: PyAV and numpy are its whole start-up cost, paid once, before its first file.

Every message, both ways, is one JSON line, then `payload_bytes` raw bytes (none when absent). The reader
answers each request on its stdout pipe; anything the native decoder prints goes to stderr.
- At start, once PyAV and numpy are imported: {"status": "ready", "pid"}.
- {"op": "read", path, frame_sampling, max_seconds, patch, max_source_pixels, max_picture_pixels, memory_bytes,
  parts, split_min_pixels, threads, soundtrack}: a file Pillow reads is a picture
  (engine/reading/decoders/pillow_picture.py): a still one answers {"status": "ok", "kind": "image", size, entries,
  shape, work} and its (1, H, W, 3) pixels, an animated one is read as a video with "kind": "video" in its answer. Any
  other file: its checks and timeline, then its frames, decoded by `threads` decoder threads (0: one per core):
  {"status": "ok", total_frames, duration_s, wanted, entries, shape, work} and the (K, H, W, 3) uint8 frames
  (engine/reading/segments.assemble puts them in sampled order).
  When parts > 1 and the read is worth splitting, {"status": "split", ..., units, plan} instead, with
  the timeline's bytes: the pool hands the units out as segments to `parts` readers at most.
- {"op": "segment", path, memory_bytes, plan, targets, threads, soundtrack} with the timeline's bytes:
  {"status": "ok", entries, shape, work} and the frames at those targets, decoded by `threads` decoder threads
  (0: one per core).
- soundtrack: null, or {"rate_hz", "max_seconds"}: the file's soundtrack is read too, after the frames, and an
  "ok" answer then says {"soundtrack": {"status": "ok", "samples", "rate_hz", "cut"}} with the samples' bytes
  after the frames' (engine/reading/soundtrack.py; payload_bytes counts both), or {"soundtrack": {"status": "none"}}
  (no audio stream) or {"status": "unreadable"} (it did not decode: the frames are answered all the same). A
  split read's soundtrack is asked of the first segment, which reads it while the other readers decode theirs.
- Statuses that end a read: "too_long", "too_many_pixels", "out_of_memory", "unreadable".
- {"op": "stream", url, fps, max_pixels_per_frame, max_source_pixels, memory_bytes, timeout_s, threads}: one
  connection to a live stream (engine/reading/decoders/pyav_stream.py): {"status": "frame", t_s, shape} and its
  (H, W, 3) uint8 frame for every frame taken, as it is taken, then one last header: {"status": "ended",
  frames}, "open_failed" (with a reason), "too_many_pixels", "out_of_memory" or "unreadable". The reader
  exits after it: a stream's reader reads that stream only (engine/reading/live_stream.py starts it).
An answer with "retire": true is the reader's last: after running out of memory, or once its heap has
grown past RETIRE_GROWTH_BYTES, it exits and the pool starts a fresh one.
"""

import json
import os
import resource
import signal
import sys
from contextlib import contextmanager

import numpy as np

from engine.config import FrameSampling

from .decoders.pillow_picture import open_picture, read_picture
from .decoders.pyav_soundtrack import read_soundtrack
from .decoders.pyav_stream import stream_frames
from .decoders.pyav_video import Plan, plan_file, read_targets, timeline_from_message, timeline_message
from .segments import units, worth_splitting
from .soundtrack import soundtrack_message

# A reader whose heap and private mappings grew this much past what it held when ready retires after the
# file: memory the allocator keeps from a large read would count against the next file's cap.
RETIRE_GROWTH_BYTES = 256 << 20
_PR_SET_PDEATHSIG = 1
# What MemoryError stands for under the memory cap: an allocation refused, or (EAGAIN) a decoder thread whose
# stack FFmpeg could not get.
_OUT_OF_MEMORY = (MemoryError, BlockingIOError)


def serve(parent_pid: int) -> None:
    """The reader's life: die with the parent, announce readiness, answer requests until stdin closes."""
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the server's terminal is the server's to handle
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # native decoder output goes to stderr, never into an answer
    requests = sys.stdin.buffer
    _write(answers, {"status": "ready", "pid": os.getpid()})
    baseline = _data_bytes()
    while line := requests.readline():  # EOF: the pool closed the pipe, or the engine's process is gone
        request = json.loads(line)
        payload = requests.read(request.get("payload_bytes", 0))
        if request["op"] == "stream":  # a stream's reader serves that stream only, then ends
            _stream(request, answers)
            return
        header, body = _answer(request, payload)
        if header["status"] == "out_of_memory" or _data_bytes() > baseline + RETIRE_GROWTH_BYTES:
            header["retire"] = True
        _write(answers, header, body)
        if header.get("retire"):
            return


def _answer(request: dict, payload: bytes) -> tuple[dict, np.ndarray | bytes | list | None]:
    """One request's answer under its memory cap: an allocation past it fails, in Python or in FFmpeg.
    RLIMIT_DATA (heap and private writable mappings) rather than RLIMIT_AS: the address space also counts
    the 64 MB malloc arena each decoder thread reserves but barely touches, so a cap on it would track the
    core count rather than the memory used. Only the soft limit is set, so the next file may set another."""
    with _memory_cap(request["memory_bytes"]):
        try:
            header, body = _segment(request, payload) if request["op"] == "segment" else _read(request)
            if header["status"] == "ok" and request.get("soundtrack") and "kind" not in header:
                return _with_soundtrack(request, header, body)
            if header["status"] == "ok" and request.get("soundtrack"):  # a picture has no soundtrack
                header["soundtrack"] = {"status": "none"}
            return header, body
        except _OUT_OF_MEMORY:
            return {"status": "out_of_memory"}, None
        except Exception:  # the decoder reports broken input as its own errors
            return {"status": "unreadable"}, None


@contextmanager
def _memory_cap(memory_bytes: int):
    """RLIMIT_DATA's soft limit at memory_bytes (at most the hard limit) inside the block, lifted after."""
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    cap = memory_bytes if hard == resource.RLIM_INFINITY else min(memory_bytes, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (hard, hard))


def _stream(request: dict, answers) -> None:
    """The "stream" op: every frame taken answered as it comes, under the memory cap; then, the cap lifted
    (answering must not fail for want of the memory that ended the stream), the stream's last header. A pipe
    closed by the engine (it stopped the stream) ends the reader quietly."""

    def send(header: dict, frame: np.ndarray) -> None:
        _write(answers, header, frame)

    try:
        with _memory_cap(request["memory_bytes"]):
            try:
                last = stream_frames(
                    request["url"],
                    request["fps"],
                    request["max_pixels_per_frame"],
                    request["max_source_pixels"],
                    request["timeout_s"],
                    send,
                    request["threads"],
                )
            except _OUT_OF_MEMORY:
                last = {"status": "out_of_memory"}
            except BrokenPipeError:
                raise
            except Exception:  # the decoder reports a broken stream as its own errors
                last = {"status": "unreadable"}
        _write(answers, last)
    except BrokenPipeError:
        pass


def _read(request: dict) -> tuple[dict, np.ndarray | bytes | None]:
    picture = open_picture(request["path"])
    if picture is not None:  # a picture Pillow reads: a still image, or an animated one read as a video
        with picture:
            return read_picture(picture, request)
    header, plan = plan_file(
        request["path"],
        FrameSampling(**request["frame_sampling"]),
        request["max_seconds"],
        request["patch"],
        request["max_source_pixels"],
    )
    if plan is None:
        return header, None
    header["wanted"] = plan.wanted
    targets = sorted(set(plan.wanted))
    if request["parts"] > 1 and not plan.timeline.by_order:  # frames counted from the start cannot split
        found = units(plan.timeline.pts, plan.timeline.keyframes, targets)
        if worth_splitting(found, plan.stored_hw[0] * plan.stored_hw[1], request["split_min_pixels"]):
            meta, timeline_bytes = timeline_message(plan.timeline)
            return {
                **header,
                "status": "split",
                "units": found,
                "plan": {"timeline": meta, "stored_hw": plan.stored_hw, "fit_hw": plan.fit_hw},
            }, timeline_bytes
    return _frames(header, *read_targets(request["path"], plan, targets, request["threads"]))


def _segment(request: dict, payload: bytes) -> tuple[dict, np.ndarray | None]:
    described = request["plan"]
    plan = Plan(
        timeline_from_message(described["timeline"], payload),
        [],
        tuple(described["stored_hw"]),
        tuple(described["fit_hw"]),
    )
    return _frames({"status": "ok"}, *read_targets(request["path"], plan, request["targets"], request["threads"]))


def _frames(header: dict, entries: list[dict], frames: np.ndarray | None, work: dict) -> tuple[dict, np.ndarray | None]:
    shape = list(frames.shape) if frames is not None else None
    return {**header, "entries": entries, "shape": shape, "work": work}, frames


def _with_soundtrack(request: dict, header: dict, frames: np.ndarray | None) -> tuple[dict, list | np.ndarray | None]:
    """The frames' answer with the file's soundtrack: its samples go after the frames. A soundtrack that does not
    decode costs itself only, not the frames already read; running out of memory ends the read, as it would in
    the frames."""
    asked = request["soundtrack"]
    try:
        soundtrack = read_soundtrack(request["path"], asked["rate_hz"], asked["max_seconds"])
    except _OUT_OF_MEMORY:
        raise
    except Exception:  # PyAV's errors for a stream it cannot decode
        return {**header, "soundtrack": {"status": "unreadable"}}, frames
    if soundtrack is None:
        return {**header, "soundtrack": {"status": "none"}}, frames
    fields, samples = soundtrack_message(soundtrack)
    return {**header, "soundtrack": {"status": "ok", **fields}}, [frames, samples]


def _write(answers, header: dict, body: np.ndarray | bytes | list | None = None) -> None:
    """One answer: the header line, then the body's buffers (one, or a list of them) back to back."""
    # The arrays' own buffers: the frames and samples are written without a second copy.
    parts = [
        memoryview(np.ascontiguousarray(part) if isinstance(part, np.ndarray) else part)
        for part in (body if isinstance(body, list) else [body])
        if part is not None
    ]
    if parts:
        header = {**header, "payload_bytes": sum(part.nbytes for part in parts)}
    answers.write(json.dumps(header).encode() + b"\n")
    for part in parts:
        answers.write(part)
    answers.flush()


def _data_bytes() -> int:
    """What RLIMIT_DATA counts of this process now (VmData), in bytes; 0 where /proc does not say."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmData:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to kill this reader when the engine's process dies (Linux), even mid-decode; then
    make sure the parent did not die before the request was made. Elsewhere, EOF on stdin ends an idle
    reader and a busy one ends with its file."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:
        os._exit(0)
