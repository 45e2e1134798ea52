"""What every pruning method is given, checked once: the rate q, the grid (T, h, w) and the features.

A user's mistake is a ValueError with one sentence meant for a user; the engine turns it into its InputError.
"""

import math
import numbers

import torch


def validate_pruning_rate(q) -> float:
    """Check that the pruning rate `q` is a real number in [0, 1) and return it as a float.

    Raises ValueError (one sentence meant for a user) for anything else: negative, >= 1, NaN, inf,
    bool, str, None, tensors.
    """
    is_real = isinstance(q, numbers.Real) and not isinstance(q, bool)
    # Huge integers overflow float(); they are out of range anyway.
    rate = float(q) if is_real and abs(q) < 2 else math.nan
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"The pruning rate must be a number at least 0 and below 1; got {q!r}.")
    return rate


def check_counts(tokens_per_frame, num_frames) -> tuple[int, int]:
    """(h*w, T) as Python ints; ValueError unless both are positive integers."""
    for name, value in (("tokens_per_frame", tokens_per_frame), ("num_frames", num_frames)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"{name} must be a positive integer; got {value!r}.")
    return int(tokens_per_frame), int(num_frames)


def parse_grid(grid_thw) -> tuple[int, int, int]:
    """`(T, h, w)` as Python ints from a tuple, list or tensor of three positive integers."""
    values = grid_thw.reshape(-1).tolist() if isinstance(grid_thw, torch.Tensor) else list(grid_thw)
    if len(values) != 3 or any(isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1 for v in values):
        raise ValueError(f"grid_thw must be three positive integers (T, h, w); got {grid_thw!r}.")
    t, h, w = (int(v) for v in values)
    return t, h, w


def check_features(features: torch.Tensor, t: int, h: int, w: int) -> None:
    """ValueError unless features is (T*h*w, D) for the grid (T, h, w)."""
    if features.dim() != 2 or features.shape[0] != t * h * w:
        raise ValueError(
            f"features must have shape (T*h*w, D) = ({t * h * w}, D) for grid ({t}, {h}, {w}); "
            f"got {tuple(features.shape)}."
        )
