"""The baseline a demo author would write: fewer frames instead of fewer tokens per frame.

Whole temporal groups are kept, evenly spaced and starting with the first: G = max(1, floor(T*(1 - q))) of
the T groups (group i*T // G for i < G), so G*h*w tokens. That is floor(K / (h*w)) groups for EVS's K, never
more tokens than EVS keeps, and as many whenever EVS's K is a whole number of groups (q = 0.5 on an even T).
It reads no features: which groups survive depends on T and q alone.
"""

import torch

from pruning.evs import share_of
from pruning.inputs import check_counts, check_features, parse_grid, validate_pruning_rate


def uniform_group_count(num_frames: int, q: float) -> int:
    """Temporal groups kept: `G = max(1, floor(T*(1 - q)))`, exactly (q read from its decimal repr)."""
    _, num_frames = check_counts(1, num_frames)
    return max(1, share_of(num_frames, q))


def uniform_token_count(tokens_per_frame: int, num_frames: int, q: float) -> int:
    """Tokens kept: G whole groups, `G*h*w`."""
    tokens_per_frame, num_frames = check_counts(tokens_per_frame, num_frames)
    return uniform_group_count(num_frames, q) * tokens_per_frame


def uniform_retention_mask(features: torch.Tensor, grid_thw, q) -> torch.Tensor:
    """Which video tokens the uniform baseline keeps: every token of groups 0, T//G, 2T//G, ...

    features: (T*h*w, D), only checked and used for its device. Returns (T*h*w,) bool in raster order.
    q = 0 keeps everything; q = 0.5 on an even T keeps every other group.
    """
    q = validate_pruning_rate(q)
    t, h, w = parse_grid(grid_thw)
    check_features(features, t, h, w)
    groups = uniform_group_count(t, q)
    kept_groups = torch.zeros(t, dtype=torch.bool, device=features.device)
    kept_groups[torch.arange(groups, device=features.device) * t // groups] = True
    return kept_groups.repeat_interleave(h * w)
