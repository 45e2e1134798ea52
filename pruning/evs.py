"""EVS math on bare tensors: how many tokens to keep, how much each token changed, which ones survive.

A "frame" here is one temporal token group of the LLM grid `(T, h, w)` (after the spatial merge; for
Qwen models two video frames form one group). Features are rows in `(t, h, w)` raster order.
"""

import math
from fractions import Fraction

import torch

from pruning.inputs import check_counts, check_features, parse_grid, validate_pruning_rate

# Norms are clamped to this so a zero feature vector normalises to zero instead of 0/0 = NaN.
_NORM_EPS = 1e-12


def unit_vectors(features: torch.Tensor) -> torch.Tensor:
    """features (..., D), any float dtype -> float32 (..., D) scaled to unit length; a zero row stays zero.

    Float32 before the norms: squaring float16 activations of a few hundred already overflows."""
    rows = features.to(torch.float32)
    return rows / rows.norm(dim=-1, keepdim=True).clamp_min(_NORM_EPS)


def retained_token_count(tokens_per_frame: int, num_frames: int, q: float) -> int:
    """Tokens EVS keeps: `K = max(h*w, floor(T*h*w*(1 - q)))`, computed exactly.

    `tokens_per_frame` is h*w (LLM tokens per temporal group), `num_frames` is T (temporal groups).
    The rate is read from its shortest decimal repr, so q=0.8 means exactly 4/5: with h*w=100 and
    T=10 this keeps 200 (float arithmetic gives 199).
    """
    q = validate_pruning_rate(q)
    tokens_per_frame, num_frames = check_counts(tokens_per_frame, num_frames)
    return max(tokens_per_frame, share_of(tokens_per_frame * num_frames, q))


def share_of(total_tokens: int, q) -> int:
    """`floor(total_tokens * (1 - q))`, exactly: q is read from its shortest decimal repr (0.8 is 4/5)."""
    q = validate_pruning_rate(q)
    return math.floor(total_tokens * (1 - Fraction(repr(q))))


def frame_dissimilarity(features: torch.Tensor, grid_thw) -> torch.Tensor:
    """How much each token changed since the same position in the previous temporal group.

    features: (T*h*w, D), any float dtype, rows in (t, h, w) raster order.
    grid_thw: (T, h, w) in LLM tokens, as a tuple, list or 1-D tensor.
    Returns (T, h, w) float32 on the features' device: `1 - cos(f[t, i, j], f[t-1, i, j])` in [0, 2],
    computed in float32; group 0 is +inf (it has no predecessor and is always kept). Identical tokens
    give exactly 0. Cosine is undefined for a zero vector: two zero vectors give 0 (no change), a zero
    and a non-zero vector give 0.5; never NaN.
    """
    t, h, w = parse_grid(grid_thw)
    check_features(features, t, h, w)
    unit = unit_vectors(features.reshape(t, h * w, -1))
    # For unit vectors 1 - cos(u, v) = |u - v|^2 / 2. This form is exactly 0 for identical tokens
    # (1 - u.u is not, so static tokens would tie-break on rounding noise) and never negative.
    change = 0.5 * (unit[1:] - unit[:-1]).square().sum(dim=-1)
    first_group = torch.full((1, h * w), math.inf, dtype=torch.float32, device=features.device)
    return torch.cat([first_group, change]).reshape(t, h, w)


def compute_retention_mask(features: torch.Tensor, grid_thw, q) -> torch.Tensor:
    """Which video tokens EVS keeps: the K most changed over the whole video.

    features: (T*h*w, D), any float dtype, rows in (t, h, w) raster order.
    grid_thw: (T, h, w) in LLM tokens, as a tuple, list or 1-D tensor.
    q: pruning rate in [0, 1); anything else raises ValueError. K = `retained_token_count(h*w, T, q)`.
    Returns (T*h*w,) bool on the features' device, in raster order. Selection is global, not per group,
    so a later group may keep zero tokens; ties go to the earlier raster index; group 0 (dissimilarity
    +inf) is always fully kept. q = 0 keeps everything.
    """
    q = validate_pruning_rate(q)
    t, h, w = parse_grid(grid_thw)
    check_features(features, t, h, w)
    if retained_token_count(h * w, t, q) == t * h * w:
        return torch.ones(t * h * w, dtype=torch.bool, device=features.device)
    return retention_mask_from_dissimilarity(frame_dissimilarity(features, (t, h, w)), q)


def retention_mask_from_dissimilarity(
    dissimilarity: torch.Tensor, q, candidates: torch.Tensor | None = None
) -> torch.Tensor:
    """The same selection as `compute_retention_mask`, from an already computed (T, h, w) dissimilarity
    (for callers that also show it). Returns (T*h*w,) bool in raster order.

    candidates: (T*h*w,) bool, the tokens that may be kept (None: all). Skipping still patches
    (pruning/still.py) leaves the units the vision tower did not encode out of the prompt: EVS then keeps the
    K most changed among the candidates, K the video's count, or every candidate when there are fewer."""
    q = validate_pruning_rate(q)
    t, h, w = dissimilarity.shape
    kept_tokens = retained_token_count(h * w, t, q)
    flat = dissimilarity.reshape(-1)
    if candidates is not None:
        candidates = candidates.to(device=flat.device, dtype=torch.bool)
        kept_tokens = min(kept_tokens, int(candidates.sum()))
        flat = torch.where(candidates, flat, torch.full_like(flat, -math.inf))
    # A stable descending sort keeps equal values in raster order, so ties go to the earlier token.
    order = torch.sort(flat, descending=True, stable=True).indices
    mask = torch.zeros(t * h * w, dtype=torch.bool, device=dissimilarity.device)
    mask[order[:kept_tokens]] = True
    return mask
