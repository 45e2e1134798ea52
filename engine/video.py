"""Validate an uploaded video and sample its frames, decoding in a separate process.

Decoding runs in a fresh Python interpreter so that a malformed file that crashes or hangs the decoder
costs that process, not the server; the parent kills it after the timeout. It is started with
subprocess rather than multiprocessing 'spawn' because a spawn child re-imports the parent's main
module (app.py: gradio, torch) and the engine package (torch, transformers): measured at 14-21 s and
860 MB per upload, against 0.4 s and 32 MB for numpy and decord alone.
"""

import hashlib
import json
import math
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from engine.config import SamplingParams
from engine.errors import InputError

MISSING = "Please upload a video file."
UNREADABLE = "The file could not be read as a video."
TOO_SLOW = "Reading the video took too long; try a shorter or smaller file."

# The child imports this module under a bare `engine` package so that engine/__init__.py (torch,
# transformers) never runs there: argv[1] is the engine folder, argv[2] the request as JSON.
_CHILD_PROGRAM = """
import sys, types
package = types.ModuleType("engine")
package.__path__ = [sys.argv[1]]
sys.modules["engine"] = package
from engine.video import _child_main
_child_main(sys.argv[2])
"""
_ENGINE_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class SampledVideo:
    """Frames sampled from one upload, with what the HF processor needs for correct timestamps.

    frames: (N, H, W, 3) uint8 RGB, N a multiple of the temporal patch. frame_indices: the source
    frame index of each sampled frame (non-decreasing). content_hash: sha256 hex of the file bytes.
    """

    frames: np.ndarray
    frame_indices: list[int]
    native_fps: float
    total_frames: int
    duration_s: float
    content_hash: str


def file_sha256(path) -> str:
    """sha256 hex digest of the file's bytes, read in chunks so large uploads stay out of memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def load_video(
    path,
    sampling: SamplingParams,
    *,
    max_seconds: float,
    max_bytes: int,
    timeout_s: float,
    temporal_patch: int = 2,
    content_hash: str | None = None,
) -> SampledVideo:
    """Check the upload, decode the sampled frames in a child process, and return them.

    content_hash: the file's sha256 when the caller already computed it (it is read again otherwise).
    Raises InputError (one sentence for the user) when the file is missing, larger than max_bytes,
    not a readable video, longer than max_seconds, or takes longer than timeout_s to decode.
    """
    if not path or not Path(path).is_file():
        raise InputError(MISSING)
    size_bytes = Path(path).stat().st_size
    if size_bytes > max_bytes:
        size_text, limit_text = _size_pair(size_bytes, max_bytes)
        raise InputError(f"The video is {size_text}; the limit is {limit_text}.")
    header, frames = _decode_isolated(str(path), sampling, max_seconds, temporal_patch, timeout_s)
    if header["status"] == "too_long":
        length_text, limit_text = _duration_pair(header["duration_s"], max_seconds)
        raise InputError(f"The video is {length_text} long; the limit is {limit_text}.")
    if header["status"] != "ok":
        raise InputError(UNREADABLE)
    return SampledVideo(
        frames=frames,
        frame_indices=header["frame_indices"],
        native_fps=header["native_fps"],
        total_frames=header["total_frames"],
        duration_s=header["total_frames"] / header["native_fps"],
        content_hash=content_hash or file_sha256(path),
    )


def sample_frame_indices(
    duration_s: float, total_frames: int, sampling: SamplingParams, temporal_patch: int = 2
) -> list[int]:
    """Source frame indices to decode: evenly spaced, a multiple of temporal_patch in count.

    count = round(duration_s * fps) clamped to [temporal_patch, max_frames], rounded down to a
    multiple of temporal_patch, and no more than total_frames rounded down the same way. A video
    shorter than temporal_patch frames repeats its last frame.
    """
    count = max(temporal_patch, min(round(duration_s * sampling.fps), sampling.max_frames))
    count = max(temporal_patch, count // temporal_patch * temporal_patch)
    count = min(count, max(temporal_patch, total_frames // temporal_patch * temporal_patch))
    if total_frames < temporal_patch:
        return list(range(total_frames)) + [total_frames - 1] * (temporal_patch - total_frames)
    return [int(i) for i in np.linspace(0, total_frames - 1, count).round()]


def fit_pixels(height: int, width: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) scaled down, aspect kept, so that height*width <= max_pixels; never scaled up."""
    if height * width <= max_pixels:
        return height, width
    scale = math.sqrt(max_pixels / (height * width))
    new_h, new_w = max(1, math.floor(height * scale)), max(1, math.floor(width * scale))
    # Over the cap only when a side was raised to 1 or through float error: shrink the longer side.
    if new_h * new_w > max_pixels:
        if new_h >= new_w:
            new_h = max(1, max_pixels // new_w)
        else:
            new_w = max(1, max_pixels // new_h)
    return new_h, new_w


def _decode_isolated(
    path: str, sampling: SamplingParams, max_seconds: float, temporal_patch: int, timeout_s: float
) -> tuple[dict, np.ndarray | None]:
    """Decode in a child process: (header, frames). A crash or a garbled answer reads as unreadable."""
    request = {"path": path, "sampling": asdict(sampling), "max_seconds": max_seconds}
    request["patch"] = temporal_patch
    command = [sys.executable, "-c", _CHILD_PROGRAM, str(_ENGINE_DIR), json.dumps(request)]
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    try:
        output, _ = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise InputError(TOO_SLOW) from None
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    if child.returncode != 0:
        return {"status": "unreadable"}, None
    return _parse_answer(output)


def _parse_answer(output: bytes) -> tuple[dict, np.ndarray | None]:
    """Split the child's answer: one JSON header line, then (N, H, W, 3) uint8 frame bytes when "ok"."""
    line, _, payload = output.partition(b"\n")
    try:
        header = json.loads(line)
        if header["status"] != "ok":
            return header, None
        # copy(): a writable array, so torch.from_numpy downstream does not warn.
        frames = np.frombuffer(payload, np.uint8).reshape(header["shape"]).copy()
    except (ValueError, KeyError, TypeError):
        return {"status": "unreadable"}, None
    return header, frames


def _child_main(request_json: str) -> None:
    """Body of the decoder process: write the header line and frame bytes to stdout."""
    answer = os.fdopen(os.dup(1), "wb")
    # Anything the native decoder prints goes to stderr, never into the answer.
    os.dup2(2, 1)
    request = json.loads(request_json)
    try:
        sampling = SamplingParams(**request["sampling"])
        header, frames = _decode(request["path"], sampling, request["max_seconds"], request["patch"])
    except Exception:  # the decoders report broken input as their own errors
        header, frames = {"status": "unreadable"}, None
    answer.write(json.dumps(header).encode() + b"\n")
    if frames is not None:
        answer.write(np.ascontiguousarray(frames).tobytes())
    answer.flush()


def _decode(
    path: str, sampling: SamplingParams, max_seconds: float, temporal_patch: int
) -> tuple[dict, np.ndarray | None]:
    """decord first (it seeks and scales while decoding); PyAV for what decord refuses (AV1, which
    decord 0.6 cannot decode) and where decord is not installed (a bare GPU image)."""
    try:
        return _decode_with_decord(path, sampling, max_seconds, temporal_patch)
    except Exception:  # ImportError, or decord's DECORDError / RuntimeError on a file it cannot read
        return _decode_with_pyav(path, sampling, max_seconds, temporal_patch)


def _sampling_plan(total_frames: int, native_fps: float, height: int, width: int, sampling: SamplingParams,
                   max_seconds: float, temporal_patch: int) -> tuple[dict | None, list[int], tuple[int, int]]:
    """(refusal header or None, source frame indices to keep, (height, width) to scale to)."""
    if total_frames <= 0 or not native_fps or not math.isfinite(native_fps) or native_fps <= 0:
        return {"status": "unreadable"}, [], (0, 0)
    duration_s = total_frames / native_fps
    if duration_s > max_seconds:
        return {"status": "too_long", "duration_s": duration_s}, [], (0, 0)
    indices = sample_frame_indices(duration_s, total_frames, sampling, temporal_patch)
    return None, indices, fit_pixels(height, width, sampling.max_pixels_per_frame)


def _answer(frames: np.ndarray, indices: list[int], size: tuple[int, int], native_fps: float,
            total_frames: int) -> tuple[dict, np.ndarray | None]:
    if frames.dtype != np.uint8 or frames.shape != (len(indices), *size, 3):
        return {"status": "unreadable"}, None
    header = {
        "status": "ok",
        "shape": list(frames.shape),
        "frame_indices": indices,
        "native_fps": float(native_fps),
        "total_frames": total_frames,
    }
    return header, frames


def _decode_with_decord(
    path: str, sampling: SamplingParams, max_seconds: float, temporal_patch: int
) -> tuple[dict, np.ndarray | None]:
    # Imported here so that only the child loads the native decoder.
    from decord import VideoReader

    reader = VideoReader(path)
    total_frames, native_fps = len(reader), reader.get_avg_fps()
    height, width = reader[0].shape[:2] if total_frames > 0 else (0, 0)
    refusal, indices, (fit_h, fit_w) = _sampling_plan(total_frames, native_fps, height, width, sampling,
                                                      max_seconds, temporal_patch)
    if refusal is not None:
        return refusal, None
    if (fit_h, fit_w) != (height, width):
        # decord scales while decoding, so a large video never exists at full size in memory.
        reader = VideoReader(path, width=fit_w, height=fit_h)
    frames = reader.get_batch(indices).asnumpy()
    return _answer(frames, indices, (fit_h, fit_w), native_fps, total_frames)


def _decode_with_pyav(
    path: str, sampling: SamplingParams, max_seconds: float, temporal_patch: int
) -> tuple[dict, np.ndarray | None]:
    """Decode in order and keep the sampled frames, each scaled as it is converted to RGB."""
    import av

    with av.open(path) as container:
        # FFmpeg reads still images (PNG, JPEG, ...) through image demuxers as one-frame videos: not uploads.
        if container.format.name == "image2" or container.format.name.endswith("_pipe"):
            return {"status": "unreadable"}, None
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        native_fps = float(stream.average_rate or 0)
        total_frames = stream.frames
        if total_frames <= 0:  # containers that keep no count (WebM, MKV): count the packets
            total_frames = sum(1 for packet in container.demux(stream) if packet.size)
            container.seek(0)
        refusal, indices, (fit_h, fit_w) = _sampling_plan(total_frames, native_fps, stream.height, stream.width,
                                                          sampling, max_seconds, temporal_patch)
        if refusal is not None:
            return refusal, None
        wanted = set(indices)
        kept: dict[int, np.ndarray] = {}
        for index, frame in enumerate(container.decode(stream)):
            if index in wanted:
                kept[index] = frame.to_ndarray(format="rgb24", width=fit_w, height=fit_h)
            if index >= indices[-1]:
                break
    # A count taken from the header can exceed what decodes: repeat the last decoded frame for the rest.
    if not kept:
        return {"status": "unreadable"}, None
    last = kept[max(kept)]
    frames = np.stack([kept.get(index, last) for index in indices])
    return _answer(frames, indices, (fit_h, fit_w), native_fps, total_frames)


def _size_pair(size_bytes: int, limit_bytes: int) -> tuple[str, str]:
    """("312.4 MB", "200 MB"): the unit follows the limit; the size rounds up so it never reads as equal."""
    if limit_bytes >= 1 << 20:
        unit_bytes, unit = 1 << 20, "MB"
    elif limit_bytes >= 1 << 10:
        unit_bytes, unit = 1 << 10, "KB"
    else:
        unit_bytes, unit = 1, "bytes"
    size = _number(size_bytes / unit_bytes, round_up=True)
    return f"{size} {unit}", f"{_number(limit_bytes / unit_bytes)} {unit}"


def _duration_pair(length_s: float, limit_s: float) -> tuple[str, str]:
    """("12.5 minutes", "10 minutes"): minutes when the limit is a minute or more, else seconds."""
    unit_s, unit = (60.0, "minute") if limit_s >= 60 else (1.0, "second")
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
