"""A live frame from its caller to the language model's pixels: the checks (one sentence each), sampling by
capture time, and resizing as an upload's frames are resized."""

import math
import numbers

import av
import numpy as np

from engine.errors import InputError
from engine.reading.frame_sampling import fit_pixels
from engine.reading.media import too_small

# A frame's longer side may be at most this many times its shorter: the Qwen processors refuse more (their
# smart_resize), and a 20,000 x 1 strip is no picture of anything.
MAX_ASPECT = 200
# Capture times within this of a sampling tick count as on it: a caller's 1/fps steps in float add up unevenly.
TICK_TOLERANCE_S = 1e-6
# The largest capture time taken, either side of 0 (some 317 years: Unix time in seconds fits until 2286). Past it a
# time overflows the clock's tick count (9e307 after 0 at 2 fps is more than a float holds) or, well before that,
# writes a prompt's `<t seconds>` of hundreds of digits (1e200); any real clock is far inside it.
MAX_TIME_S = 1e10


def check_frame(frame, max_source_pixels: int, min_side: int = 1) -> np.ndarray:
    """The frame as a (H, W, 3) uint8 array, or InputError: a live frame is an RGB picture of at most
    max_source_pixels (EngineConfig.max_video_source_pixels, as an upload's frames), each side at least
    min_side pixels (the model's Family.token_side; 1 where the model is not known here)."""
    if not isinstance(frame, np.ndarray) or frame.ndim != 3 or frame.shape[2] != 3:
        shape = getattr(frame, "shape", None)
        raise InputError(f"A live frame must be an (height, width, 3) RGB array; got {shape or type(frame).__name__}.")
    if frame.dtype != np.uint8:
        raise InputError(f"A live frame must hold uint8 pixels (0-255); got {frame.dtype}.")
    height, width = frame.shape[:2]
    if height * width > max_source_pixels:
        raise InputError(
            f"The frame is {width}x{height}, more than the {max_source_pixels:,} pixels this server "
            "takes; send smaller frames."
        )
    if min(height, width) < 1 or max(height, width) > MAX_ASPECT * min(height, width):
        raise InputError(
            f"The frame is {width}x{height}; its longer side may be at most {MAX_ASPECT} times its shorter."
        )
    if why := too_small("The frame", width, height, min_side):
        raise InputError(why)
    return frame


def check_time(t_s, last_s: float | None) -> float:
    """The capture time as a float, or InputError: a finite number of seconds within MAX_TIME_S of 0, later than
    the frame before."""
    real = isinstance(t_s, numbers.Real) and not isinstance(t_s, bool)
    # An int is finite however large, and is compared as it is: float() would overflow on one past a float's range.
    if not real or (not isinstance(t_s, numbers.Integral) and not math.isfinite(t_s)):
        raise InputError(f"A frame's capture time must be a finite number of seconds; got {t_s!r}.")
    if abs(t_s) > MAX_TIME_S:
        raise InputError(
            f"A frame's capture time must be within {MAX_TIME_S:,.0f} seconds of 0 (some 300 years); got {_shown(t_s)}."
        )
    t_s = float(t_s)
    if last_s is not None and t_s <= last_s:
        raise InputError(f"Frames must come in capture order: {t_s:g} s is not after the last frame's {last_s:g} s.")
    return t_s


def _shown(t_s) -> str:
    """A time past MAX_TIME_S in a few digits (an int too large for a float by its size)."""
    try:
        return f"{t_s:.3g}"
    except OverflowError:
        return f"about 1e{int(abs(int(t_s)).bit_length() * math.log10(2))}"


class CaptureClock:
    """Which frames to sample, by capture time: the first frame, then the first at or after each tick of 1/fps
    from it. Ticks with no frame of their own (a slow camera) are skipped, not made up later.

    fps: frames sampled per second of capture time.
    """

    def __init__(self, fps: float):
        self.fps = fps
        self.start_s: float | None = None
        self._next_tick = 0  # ticks are start_s + n / fps

    def due(self, t_s: float) -> bool:
        """Whether the frame captured at t_s is due; the clock moves past it either way, so that a frame dropped
        when the engine is behind is not made up by the next one."""
        if self.start_s is None:
            self.start_s = t_s
            self._next_tick = 1
            return True
        ticks = (t_s - self.start_s) * self.fps + TICK_TOLERANCE_S * self.fps
        if ticks < self._next_tick:
            return False
        self._next_tick = math.floor(ticks) + 1
        return True


def resized(frame: np.ndarray, max_pixels: int) -> np.ndarray:
    """The frame scaled down to at most max_pixels, its aspect kept, by the scaler an upload's frames go through
    (FFmpeg's, through PyAV: engine/reading/pyav_video.py), never up; the frame itself when it fits."""
    height, width = frame.shape[:2]
    fit_h, fit_w = fit_pixels(height, width, max_pixels)
    if (fit_h, fit_w) == (height, width):
        return frame
    picture = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
    return picture.to_ndarray(format="rgb24", width=fit_w, height=fit_h)
