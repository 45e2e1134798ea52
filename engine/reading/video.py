"""Validate an uploaded video and sample its frames by time, reading it in an isolated reader process.

Reading runs in a child process (engine/reading/pool.py, engine/reading/reader_process.py) so that a malformed file
that crashes or hangs the decoder costs that process, not the server: the pool kills it after the
timeout and starts another, and the child's memory is capped so that a file that makes the decoder
allocate without bound fails alone. The engine keeps a warm pool of readers that have imported PyAV and
numpy already; `read_video` without one starts a reader for the file alone, as every upload once had.

The reader decodes with PyAV (engine/reading/decoders/pyav_video.py) rather than decord 0.6, the engine's decoder
before: the frames' presentation times come from the container, so variable-frame-rate files are sampled at the
right seconds; it reads every codec its FFmpeg has (AV1 included, which decord 0.6 cannot); and it
decodes the 32 sampled frames of a 2-minute 1080p long-GOP H.264 file with 40% less CPU (seeking only
where it pays and skipping frames nothing refers to; bench/decoding.py).
"""

import hashlib
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from engine.config import (
    MAX_PICTURE_PIXELS,
    MAX_SOUNDTRACK_SECONDS,
    MAX_VIDEO_SOURCE_PIXELS,
    READ_MEMORY_BYTES,
    FrameSampling,
)
from engine.errors import EXPIRED_VIDEO, NO_VIDEO, InputError

from .pool import Read, ReaderPool
from .segments import assemble
from .soundtrack import Soundtrack

UNREADABLE = "The file could not be read as a video or a picture."
EMPTY = "The file is empty."
TOO_SLOW = "Reading the video took too long; try a shorter or smaller file."
OUT_OF_MEMORY = "Reading the video needed more memory than the server allows; try a smaller file."


@dataclass(frozen=True)
class SampledVideo:
    """Frames sampled from one upload at evenly spaced times, with where each sits in the video.

    frames: (N, H, W, 3) uint8 RGB, upright, N a multiple of the temporal patch.
    frame_indices: (N,) ordinal of each sampled frame in presentation order (non-decreasing; a clip
    shorter than the temporal patch repeats its last frame). timestamps_s: (N,) each frame's
    presentation time in seconds from the first frame, read from the container. total_frames: frames in
    the video. duration_s: first frame's start to last frame's end. native_fps: total_frames /
    duration_s, the average rate. sampled_fps: N / duration_s, the rate actually sampled (below the
    asked fps once max_frames caps a long video); Qwen's seconds per temporal group follow from it.
    content_hash: sha256 hex of the file bytes. read_wait_s: seconds the read waited for a free reader;
    read_s: seconds the reader(s) took, from the file handed over to the last frame back. readers: how
    many readers read it at once (more than one for a long video split at keyframes). soundtrack: the
    upload's soundtrack when it was asked for and the file has one; soundtrack_status: when it was asked
    for, "ok", "none" (no audio stream) or "unreadable" (the stream did not decode), else None.
    """

    frames: np.ndarray
    frame_indices: list[int]
    timestamps_s: list[float]
    native_fps: float
    total_frames: int
    duration_s: float
    sampled_fps: float
    content_hash: str
    read_wait_s: float = 0.0
    read_s: float = 0.0
    readers: int = 1
    soundtrack: Soundtrack | None = None
    soundtrack_status: str | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of frames and soundtrack samples it holds (what the frame cache counts)."""
        return self.frames.nbytes + (self.soundtrack.samples.nbytes if self.soundtrack else 0)


def file_sha256(path) -> str:
    """sha256 hex digest of the file's bytes, read in chunks so large uploads stay out of memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def read_video(path, sampling: FrameSampling, *, content_hash: str | None = None, **options) -> SampledVideo:
    """Check the upload, read the sampled frames in a reader process, and return them.

    content_hash: the file's sha256 when the caller already computed it (it is read again otherwise);
    options: read_upload's. InputError(UNREADABLE) for a still picture, which is no video.
    """
    read = read_upload(path, sampling, **options)
    if read.header.get("kind") == "image":
        raise InputError(UNREADABLE)
    return sampled_video(read, content_hash or file_sha256(path))


def read_upload(
    path,
    sampling: FrameSampling,
    *,
    max_seconds: float,
    max_bytes: int,
    timeout_s: float,
    temporal_patch: int = 2,
    max_source_pixels: int = MAX_VIDEO_SOURCE_PIXELS,
    max_picture_pixels: int = MAX_PICTURE_PIXELS,
    memory_bytes: int = READ_MEMORY_BYTES,
    readers: ReaderPool | None = None,
    soundtrack_rate_hz: int | None = None,
    max_soundtrack_seconds: float = MAX_SOUNDTRACK_SECONDS,
) -> Read:
    """One upload read by a reader: its "ok" answer, a video's frames or a still picture's pixels
    (header["kind"] == "image"; engine/reading/decoders/pillow_picture.py).

    max_source_pixels: most width*height of a video's frames as stored, before any resizing
    (max_picture_pixels: the same for a picture, still or animated, read by Pillow).
    memory_bytes: the reader process's cap on heap and private writable memory (RLIMIT_DATA).
    readers: the engine's warm pool, where timeout_s bounds the reading, not the wait for a free reader;
    None starts one reader for this file alone and stops it after, and timeout_s bounds both.
    soundtrack_rate_hz: also read the file's first audio stream, mono at this rate, its first
    max_soundtrack_seconds (a soundtrack that does not decode leaves the frames answered, and says so in
    soundtrack_status); None reads none.
    Raises InputError (one sentence for the user) when the file is missing, empty, larger than max_bytes,
    neither a video nor a picture, longer than max_seconds, larger per frame than its pixel limit, needs more
    than memory_bytes, or takes longer than timeout_s to read.
    """
    if not path or not Path(path).is_file():
        raise InputError(NO_VIDEO)
    try:
        size_bytes = Path(path).stat().st_size
    except FileNotFoundError:  # deleted since is_file(): the temp-file cleaner took an old upload
        raise InputError(EXPIRED_VIDEO) from None
    if size_bytes == 0:
        raise InputError(EMPTY)
    if size_bytes > max_bytes:
        size_text, limit_text = size_pair(size_bytes, max_bytes)
        raise InputError(f"The file is {size_text}; the limit is {limit_text}.")
    request = {
        "path": str(path),
        "frame_sampling": asdict(sampling),
        "max_seconds": max_seconds,
        "patch": temporal_patch,
        "max_source_pixels": max_source_pixels,
        "max_picture_pixels": max_picture_pixels,
        "memory_bytes": memory_bytes,
        "soundtrack": None
        if soundtrack_rate_hz is None
        else {"rate_hz": soundtrack_rate_hz, "max_seconds": max_soundtrack_seconds},
    }
    if readers is None:  # the reader's start counts against the timeout, as a fresh process per file did
        with ReaderPool(1) as own:
            read = own.read(request, timeout_s, count_wait=True)
    else:
        read = readers.read(request, timeout_s)
    header = read.header
    status = header["status"]
    if status == "too_slow":
        raise InputError(TOO_SLOW)
    if status == "too_long":
        length_text, limit_text = duration_pair(header["duration_s"], max_seconds)
        raise InputError(f"The video is {length_text} long; the limit is {limit_text}.")
    if status == "too_many_pixels":
        limit = max_picture_pixels if header.get("kind") else max_source_pixels  # a Pillow picture says its kind
        subject = "The picture is" if header.get("kind") else "The video's frames are"
        raise InputError(too_many_pixels(subject, *header["size"], limit))
    if status == "out_of_memory":
        raise InputError(OUT_OF_MEMORY)
    if status != "ok" or not read.parts or read.parts[0][1] is None:
        raise InputError(UNREADABLE)
    return read


def sampled_video(read: Read, content_hash: str) -> SampledVideo:
    """A video's "ok" answer (read_upload's) as its sampled frames in order; InputError(UNREADABLE) when the
    answer does not hold up."""
    header = read.header
    assembled = _frames_in_order(header, read.parts)
    if assembled is None:
        raise InputError(UNREADABLE)
    frames, frame_indices, timestamps_s = assembled
    duration_s = header["duration_s"]
    return SampledVideo(
        frames=frames,
        frame_indices=frame_indices,
        timestamps_s=timestamps_s,
        native_fps=header["total_frames"] / duration_s,
        total_frames=header["total_frames"],
        duration_s=duration_s,
        sampled_fps=len(frames) / duration_s,
        content_hash=content_hash,
        read_wait_s=read.wait_s,
        read_s=read.read_s,
        readers=read.readers,
        soundtrack=read.soundtrack,
        soundtrack_status=read.soundtrack_status,
    )


def _frames_in_order(header: dict, parts: list) -> tuple[np.ndarray, list[int], list[float]] | None:
    """The readers' frames in sampled order, or None when the answer does not hold up (no frames, a
    duration or frame count that is not positive, a garbled header)."""
    try:
        if not header["duration_s"] > 0 or header["total_frames"] <= 0:
            return None
        assembled = assemble(header["wanted"], parts)
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    if assembled is None or len(assembled[0]) != len(header["wanted"]):
        return None
    frames = assembled[0]
    # Writable, so torch.from_numpy downstream does not warn (an array read from a pipe is already).
    return (frames if frames.flags.writeable else frames.copy()), assembled[1], assembled[2]


def size_pair(size_bytes: int, limit_bytes: int) -> tuple[str, str]:
    """("312.4 MB", "200 MB"): the unit follows the limit; the size rounds up so it never reads as equal."""
    if limit_bytes >= 1 << 20:
        unit_bytes, unit = 1 << 20, "MB"
    elif limit_bytes >= 1 << 10:
        unit_bytes, unit = 1 << 10, "KB"
    else:
        unit_bytes, unit = 1, "bytes"
    size = _number(size_bytes / unit_bytes, round_up=True)
    return f"{size} {unit}", f"{_number(limit_bytes / unit_bytes)} {unit}"


def too_many_pixels(subject: str, width: int, height: int, limit_pixels: int) -> str:
    """ "<subject> 5000x4000 (20 megapixels); the limit is 8.8 megapixels.": the sentence for frames larger
    than the cap, an upload's or a live frame's; the size rounds up so it never reads as equal."""
    megapixels = _number(width * height / 1e6, round_up=True)
    return (
        f"{subject} {width}x{height} ({megapixels} megapixels); the limit is {_number(limit_pixels / 1e6)} megapixels."
    )


def duration_pair(length_s: float, limit_s: float) -> tuple[str, str]:
    """("3.5 hours", "3 hours"), ("12.5 minutes", "10 minutes"): the unit follows the limit (hours from an
    hour, minutes from a minute, else seconds); the length rounds up so it never reads as equal."""
    unit_s, unit = (3600.0, "hour") if limit_s >= 3600 else (60.0, "minute") if limit_s >= 60 else (1.0, "second")
    length = _number(length_s / unit_s, round_up=True)
    limit = _number(limit_s / unit_s)
    return f"{length} {_plural(unit, length)}", f"{limit} {_plural(unit, limit)}"


def _number(value: float, *, round_up: bool = False) -> str:
    """One decimal at most, trailing ".0" dropped; round_up takes the ceiling at that precision."""
    tenths = math.ceil(round(value * 10, 6)) if round_up else round(value * 10)
    text = f"{tenths / 10:.1f}"
    return text.removesuffix(".0")


def _plural(unit: str, number_text: str) -> str:
    return unit if number_text == "1" else unit + "s"
