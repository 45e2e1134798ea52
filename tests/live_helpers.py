"""Frames for the live-session tests: a shapes clip at a frame rate, the same frames as a lossless file (so that an
upload and a live session see the same pixels), and playing frames into a session at their capture times."""

import io
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from assets.shapes import FPS, shape_clip
from engine.stream import Answer


def clip_frames(seed: int, fps: int = 2, seconds: float = 8.0) -> np.ndarray:
    """(N, 64, 64, 3) uint8: the shapes clip of `seed` taken at `fps` (every FPS/fps-th frame), `seconds` long."""
    frames = shape_clip(seed).frames[:: FPS // fps]
    return frames[: round(seconds * fps)]


def write_lossless(path, frames: np.ndarray, fps: int) -> Path:
    """frames as an FFV1 file at fps (lossless: read back, every pixel is the same)."""
    with av.open(str(path), mode="w", format="matroska") as container:
        stream = container.add_stream("ffv1", rate=Fraction(fps))
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "bgr0"
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return Path(path)


def jpeg_frames(path) -> list[tuple[float, bytes]]:
    """A clip's frames as (capture time in seconds, JPEG bytes at quality 90), as a /v1/live client sends them."""
    frames = []
    with av.open(str(path)) as video:
        for frame in video.decode(video=0):
            data = io.BytesIO()
            frame.to_image().save(data, "JPEG", quality=90)
            frames.append((float(frame.time), data.getvalue()))
    return frames


def play(live, frames: np.ndarray, fps: float, first: int = 0, wait: bool = True) -> None:
    """Push frames captured 1/fps apart (frame i at (first + i) / fps s); with wait, each group is in the session's
    state before the next frame is pushed, so none is dropped however slow the machine."""
    for index, frame in enumerate(frames):
        live.push(frame, (first + index) / fps)
        if wait:
            assert live.wait(60), live.stats()


def logits_close(got: Answer, want: Answer, atol: float = 1e-4) -> float:
    """The largest difference between two answers' logits, which must be the same tokens."""
    assert got.token_ids == want.token_ids
    difference = float(np.abs(got.logits - want.logits).max())
    assert difference <= atol, difference
    return difference
