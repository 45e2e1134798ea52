"""A live stream's temporal group, from its sampled frames to what causal EVS decided of it: `LiveGroup`, and
`group_of`, the engine's one way to make one (LiveSession.push makes each of a session's; training and the
benchmarks build their streams with it too)."""

import time
from dataclasses import dataclass

import numpy as np
import torch

from engine.config import FrameSampling
from engine.families.base import Family, VideoFeatures
from engine.prompt.unpruned import processor_inputs
from engine.reading.video import SampledVideo

from .frames import resized


@dataclass(eq=False)
class LiveGroup:
    """One temporal group of a live stream, from its frames to its features.

    index: its place in the stream (0: the first group). times_s: its frames' capture times, seconds after the
    stream's first frame. pushed_at: time.perf_counter() when its last frame was handed to `push` (before the HF
    processor ran on it: the lag counts the processor's time on the pushing thread). pixel_values (P, C) and
    grid_thw_patches (3,): the vision tower's input; grid_hw: (h, w) in LLM tokens. picture: (H, W, 3) uint8, its
    first frame as the model sees it (scaled to the session's max_pixels_per_frame), for the pruning picture.
    The worker sets encoded (h*w,) bool, the units the vision tower encodes (engine/prompt/units.py's rules, decided
    causally), features, then retention (h*w,) bool and dissimilarity (h, w) once causal EVS decided it (and lets go
    of the pixels and features: engine/worker/live.py keeps what the window needs).
    """

    index: int
    times_s: list[float]
    pushed_at: float
    pixel_values: torch.Tensor
    grid_thw_patches: torch.Tensor
    grid_hw: tuple[int, int]
    picture: np.ndarray | None = None
    encoded: torch.Tensor | None = None
    features: VideoFeatures | None = None
    retention: torch.Tensor | None = None
    dissimilarity: torch.Tensor | None = None


def group_of(
    loaded,
    family: Family,
    sampling: FrameSampling,
    index: int,
    frames: list[tuple[np.ndarray, float]],
    pushed_at: float | None = None,
) -> LiveGroup:
    """Group `index` of a live stream from its sampled (frame, seconds after the stream's first frame) pairs: each
    frame scaled to the sampling's max_pixels_per_frame, then the checkpoint's HF processor on them as on an
    upload's frames. The engine's one way to make a live group (training builds its streams with it too).
    pushed_at: time.perf_counter() when its last frame was handed to `push` (now when None: a stream built here)."""
    times = [time_s for _, time_s in frames]
    pictures = np.stack([resized(frame, sampling.max_pixels_per_frame) for frame, _ in frames])
    fps = sampling.fps
    video = SampledVideo(
        frames=pictures,
        frame_indices=[round(t * fps) for t in times],
        timestamps_s=times,
        native_fps=fps,
        total_frames=len(times),
        duration_s=len(times) / fps,
        sampled_fps=fps,
        content_hash="",
    )
    inputs = processor_inputs(loaded, video, family.video_placeholder(), sampling.max_pixels_per_frame)
    pixels = family.video_inputs(inputs, loaded.model.config)
    return LiveGroup(
        index,
        times,
        time.perf_counter() if pushed_at is None else pushed_at,
        pixels.pixel_values,
        pixels.grid_thw_patches,
        pixels.grid_thw[1:],
        picture=pictures[0].copy(),
    )
