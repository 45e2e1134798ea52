"""Which frames of a video to sample and at what size: arithmetic on frame counts, presentation times and
frame sizes, nothing read. The reader process plans its reads with it (engine/reading/pyav_video.py); training,
which draws its own clips, picks their frames the same way without a reader.
"""

import math

import numpy as np

from engine.config import FrameSampling


def sampled_frame_count(duration_s: float, total_frames: int, sampling: FrameSampling, temporal_patch: int = 2) -> int:
    """Frames to sample: round(duration_s * fps) clamped to [temporal_patch, max_frames], rounded down to a
    multiple of temporal_patch, and no more than total_frames rounded down the same way (a video of fewer
    than temporal_patch frames still gives temporal_patch, repeating its last frame)."""
    count = max(temporal_patch, min(round(duration_s * sampling.fps), sampling.max_frames))
    count = max(temporal_patch, count // temporal_patch * temporal_patch)
    return min(count, max(temporal_patch, total_frames // temporal_patch * temporal_patch))


def sample_frame_indices(
    duration_s: float, total_frames: int, sampling: FrameSampling, temporal_patch: int = 2
) -> list[int]:
    """Source frame indices of a constant-rate video: sampled_frame_count of them, evenly spaced from the
    first frame to the last. (The decoder samples by time, `sample_by_time`; at a constant rate the two
    agree.)"""
    count = sampled_frame_count(duration_s, total_frames, sampling, temporal_patch)
    if total_frames < temporal_patch:
        return list(range(total_frames)) + [total_frames - 1] * (temporal_patch - total_frames)
    return [int(i) for i in np.linspace(0, total_frames - 1, count).round()]


def sample_by_time(times: np.ndarray, count: int) -> list[int]:
    """Ordinals of the frames nearest `count` times evenly spaced from the first frame's time to the last's.

    times: (n,) ascending presentation times of every frame (any unit). Each target time maps to a
    fractional ordinal by interpolating between its two neighbouring frames, rounded to the nearer one (a
    tie to the earlier); at a constant rate this is `sample_frame_indices` but for ties. Where frames are
    sparse (a slow part of a variable-rate file) two targets can pick the same frame, as it is what shows
    at both times. Fewer frames than `count` repeats the last.
    """
    total = len(times)
    if total < count:
        return list(range(total)) + [total - 1] * (count - total)
    targets = np.linspace(float(times[0]), float(times[-1]), count)
    ordinals = np.interp(targets, np.asarray(times, dtype=np.float64), np.arange(total, dtype=np.float64))
    # Halfway between two frames (to float noise) goes to the earlier one, whatever the parity.
    return [int(i) for i in np.floor(ordinals + 0.5 - 1e-9)]


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


def next_due_s(taken_s: float, fps: float) -> float:
    """Sampling a live feed at `fps` as its frames arrive: after a frame taken at taken_s (seconds from the
    feed's start), the next frame taken is the first at or after this time, the next multiple of 1 / fps.
    Over any stretch at least as dense as fps this takes one frame per 1 / fps slot, at the slot's first
    frame; a sparser feed gives every frame (a frame that arrives late in its slot does not push the next
    one later)."""
    return (math.floor(taken_s * fps + 1e-9) + 1) / fps
