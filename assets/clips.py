"""Deterministic synthetic test clips, written as H.264 MP4 with PyAV.

Used by the tests and the benchmarks. Every texture has structure (gradients,
stripes, shapes) so that a vision model's features differ from one region to the next.
"""

import functools
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

# Each kind maps (frame index, frame count, width, height) to one (H, W, 3) uint8 RGB frame.
FrameFn = Callable[[int, int, int, int], np.ndarray]


def write_clip(
    path,
    kind: str,
    *,
    seconds: float = 4.0,
    fps: int = 8,
    size: tuple[int, int] = (160, 120),
    codec: str = "libx264",
    options: dict[str, str] | None = None,
) -> Path:
    """Write a `seconds`-long clip of `kind` at `fps` and `size` = (width, height); returns the path.

    Kinds: "moving_object", "pan", "scene_cut", "static"; "still_camera" (the moving object under sensor noise),
    "camera_noise" (the still scene under sensor noise), "slides" (a screen recording of four slides), "handheld"
    (the pan, shaken). Odd sides are rounded down to even
    (yuv420p needs even sizes). codec: a PyAV encoder ("libx264", "libsvtav1", ...); options: encoder
    options, by default x264's deterministic single-threaded ones.
    """
    if kind not in _KINDS:
        raise ValueError(f"unknown clip kind {kind!r}; choose one of {sorted(_KINDS)}")
    width, height = (max(2, side - side % 2) for side in size)
    num_frames = max(1, round(seconds * fps))
    path = Path(path)
    frame_fn = _KINDS[kind]
    with av.open(str(path), mode="w", format="mp4") as container:
        stream = container.add_stream(codec, rate=Fraction(fps))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        # One thread: x264's output then depends only on the input, so regenerated files are identical.
        stream.options = options if options is not None else {"crf": "23", "preset": "medium", "threads": "1"}
        for index in range(num_frames):
            rgb = frame_fn(index, num_frames, width, height)
            for packet in stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def _frozen(img: np.ndarray) -> np.ndarray:
    img.setflags(write=False)
    return img


# The backgrounds are cached (read-only; frames that draw on one copy it): a 2-minute 720p clip is
# thousands of frames, and building each background takes tens of milliseconds.
@functools.lru_cache(maxsize=8)
def _landscape(width: int, height: int) -> np.ndarray:
    """A warm scene: sky gradient, diagonal stripes on the ground, a sun and hills. (H, W, 3) uint8."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    u, v = x / max(width - 1, 1), y / max(height - 1, 1)
    img = np.empty((height, width, 3), np.float32)
    img[..., 0] = 90 + 120 * v
    img[..., 1] = 150 + 60 * u
    img[..., 2] = 235 - 90 * v
    ground = v > 0.6 + 0.08 * np.sin(u * 9.0)
    stripes = ((x + y) // 6) % 2 == 0
    img[ground] = np.where(stripes[ground, None], [60.0, 140.0, 40.0], [120.0, 90.0, 40.0])
    sun = (x - 0.2 * width) ** 2 + (y - 0.25 * height) ** 2 < (0.1 * height) ** 2
    img[sun] = [250.0, 220.0, 60.0]
    return _frozen(img.clip(0, 255).astype(np.uint8))


@functools.lru_cache(maxsize=8)
def _city(width: int, height: int) -> np.ndarray:
    """A cold scene: dark checkerboard, vertical bars, rings. (H, W, 3) uint8, unlike `_landscape`."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    checker = ((x // 10) + (y // 10)) % 2
    img = np.stack([20 + 40 * checker, 30 + 30 * checker, 80 + 100 * checker], axis=-1)
    bars = (x // 14) % 3 == 0
    img[bars] = [200.0, 200.0, 210.0]
    radius = np.hypot(x - 0.7 * width, y - 0.5 * height)
    img[((radius // 5) % 2 == 0) & (radius < 0.35 * height)] = [240.0, 60.0, 200.0]
    return _frozen(img.clip(0, 255).astype(np.uint8))


def _moving_object(index: int, num_frames: int, width: int, height: int) -> np.ndarray:
    frame = _landscape(width, height).copy()
    side = max(2, height // 4)
    progress = index / max(num_frames - 1, 1)
    left = round(progress * (width - side))
    top = (height - side) // 2
    frame[top : top + side, left : left + side] = [220, 20, 30]
    return frame


@functools.lru_cache(maxsize=4)
def _panorama(width: int, height: int) -> np.ndarray:
    """A scene three frames wide: landscape, city, mirrored landscape."""
    parts = [_landscape(width, height), _city(width, height), _landscape(width, height)[:, ::-1]]
    return _frozen(np.concatenate(parts, axis=1))


def _pan(index: int, num_frames: int, width: int, height: int) -> np.ndarray:
    # The camera looks at a window of the panorama and slides over it.
    scene = _panorama(width, height)
    progress = index / max(num_frames - 1, 1)
    left = round(progress * (scene.shape[1] - width))
    return np.ascontiguousarray(scene[:, left : left + width])


def _scene_cut(index: int, num_frames: int, width: int, height: int) -> np.ndarray:
    return _landscape(width, height) if index < num_frames // 2 else _city(width, height)


def _static(index: int, num_frames: int, width: int, height: int) -> np.ndarray:
    return _landscape(width, height)


# A camera's sensor noise: Gaussian, independent per pixel, channel and frame, in 0-255 levels (a webcam indoors
# reads 2-4; bench/still_noise.py measures what the vision tower's units see of it).
SENSOR_NOISE_LEVELS = 3.0


def _noisy(frame: np.ndarray, index: int, sigma: float = SENSOR_NOISE_LEVELS) -> np.ndarray:
    noise = np.random.default_rng(index).normal(0.0, sigma, frame.shape)
    return (frame.astype(np.float32) + noise).round().clip(0, 255).astype(np.uint8)


def _still_camera(index: int, num_frames: int, width: int, height: int) -> np.ndarray:
    """A camera on a tripod: the moving square over a still scene, with sensor noise on every frame."""
    return _noisy(_moving_object(index, num_frames, width, height), index)


def _camera_noise(index: int, num_frames: int, width: int, height: int) -> np.ndarray:
    """The still camera with nothing moving: its sensor noise alone."""
    return _noisy(_landscape(width, height), index)


def _slides(index: int, num_frames: int, width: int, height: int) -> np.ndarray:
    """A screen recording: four slides, each shown for a quarter of the clip (a title bar and lines of "text"
    that differ per slide), as a presentation's or a tutorial's recording mostly is."""
    slide = min(3, 4 * index // max(num_frames, 1))
    frame = np.full((height, width, 3), 245, np.uint8)
    frame[: max(2, height // 8)] = [(40, 90, 160), (160, 60, 40), (40, 130, 70), (110, 60, 140)][slide]
    rng = np.random.default_rng(1_000 + slide)
    line = max(2, height // 16)
    for top in range(height // 5, height - line, 2 * line):
        length = int(width * rng.uniform(0.3, 0.9))
        frame[top : top + line, width // 10 : width // 10 + length] = 30
    return frame


def _handheld(index: int, num_frames: int, width: int, height: int) -> np.ndarray:
    """A handheld camera panning: the pan, shaken by a few pixels each frame."""
    scene = _panorama(width, height + 8)
    progress = index / max(num_frames - 1, 1)
    shake = np.random.default_rng(index).integers(-3, 4, 2)
    left = int(np.clip(round(progress * (scene.shape[1] - width)) + shake[0], 0, scene.shape[1] - width))
    top = 4 + int(shake[1])
    return np.ascontiguousarray(scene[top : top + height, left : left + width])


_KINDS: dict[str, FrameFn] = {
    "moving_object": _moving_object,
    "pan": _pan,
    "scene_cut": _scene_cut,
    "static": _static,
    "still_camera": _still_camera,
    "camera_noise": _camera_noise,
    "slides": _slides,
    "handheld": _handheld,
}
