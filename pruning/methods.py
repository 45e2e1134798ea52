"""The pruning methods by name, one interface: (features of one video, its grid, q, method) -> retention mask.

Every method sees the final visual embeddings of one video, (T*h*w, D) in (t, h, w) raster order, and says
which of its tokens reach the language model; the prompt keeps the unpruned layout's positions for them
(pruning/layout.py), whichever method chose them.
"""

from collections.abc import Callable

import torch

from pruning.evs import (
    compute_retention_mask,
    frame_dissimilarity,
    retained_token_count,
    retention_mask_from_dissimilarity,
)
from pruning.uniform import uniform_retention_mask, uniform_token_count
from pruning.vidcom2 import vidcom2_retention_mask, vidcom2_token_count

# name -> (the retention mask, the exact count of tokens it keeps)
_METHODS: dict[str, tuple[Callable, Callable[[int, int, float], int]]] = {
    "evs": (compute_retention_mask, retained_token_count),
    "vidcom2": (vidcom2_retention_mask, vidcom2_token_count),
    "uniform": (uniform_retention_mask, uniform_token_count),
}
PRUNING_METHODS = tuple(_METHODS)


def validate_pruning_method(method) -> str:
    """The method's name when it is one of PRUNING_METHODS; ValueError (one sentence for a user) otherwise."""
    if not isinstance(method, str) or method not in _METHODS:
        names = ", ".join(PRUNING_METHODS[:-1]) + f" or {PRUNING_METHODS[-1]}"
        raise ValueError(f"The pruning method must be {names}; got {method!r}.")
    return method


def kept_token_count(method: str, tokens_per_frame: int, num_frames: int, q: float) -> int:
    """Video tokens `method` keeps of T groups of h*w at rate q (each method's module says its rule)."""
    return _METHODS[validate_pruning_method(method)][1](tokens_per_frame, num_frames, q)


def retention_mask(
    features: torch.Tensor,
    grid_thw,
    q,
    method: str,
    dissimilarity: torch.Tensor | None = None,
    candidates: torch.Tensor | None = None,
) -> torch.Tensor:
    """Which of one video's tokens `method` keeps at rate q: (T*h*w,) bool on the features' device.

    features: (T*h*w, D), any float dtype. grid_thw: (T, h, w) in LLM tokens. dissimilarity: EVS's (T, h, w)
    `frame_dissimilarity` of these features when the caller already has it (EVS then reuses it; the other
    methods do not read it). candidates: (T*h*w,) bool, the tokens that may be kept at all (None: every one;
    skipping still patches leaves the rest out of the prompt): EVS keeps its count among them
    (`retention_mask_from_dissimilarity`); the other methods choose as without and lose what is not a candidate,
    so they may keep fewer than their count. Raises ValueError for a bad method, rate, grid or feature shape.
    """
    mask_of, _ = _METHODS[validate_pruning_method(method)]
    if method == "evs" and (dissimilarity is not None or candidates is not None):
        if dissimilarity is None:
            dissimilarity = frame_dissimilarity(features, grid_thw)
        return retention_mask_from_dissimilarity(dissimilarity, q, candidates)
    mask = mask_of(features, grid_thw, q)
    return mask if candidates is None else mask & candidates.to(device=mask.device, dtype=torch.bool)
