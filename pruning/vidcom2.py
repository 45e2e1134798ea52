"""VidCom2 (Liu et al., 2025, "Video Compression Commander"): each frame's share of the kept tokens from how
unlike the whole video the frame is, then in each frame the tokens most unlike their frame and the video.

A frame is one temporal group of the grid `(T, h, w)`, M = h*w tokens; features are in `(t, h, w)` raster
order. The paper's formulas (its sections 3.3 and 3.4), on the final visual embeddings x[t, m]:

    g_v = mean of all T*M tokens                      u_video[t, m] = -cos(x[t, m], g_v)
    u_t = mean over m of u_video[t, m]                (the frame's uniqueness)
    sigma = softmax((u - max u) / tau), tau = 0.01    r_t = R * (1 + sigma_t - 1/T), R = 1 - q
    g_f[t] = mean over m of x[t, m]                   u_frame[t, m] = -cos(x[t, m], g_f[t])
    frame t keeps the r_t * M tokens of largest u_video[t, m] + u_frame[t, m].

The r_t average R, so the paper keeps about R*T*M tokens. Here the count is exact, EVS's where the method
allows: K = max(h*w, T, floor(T*h*w*(1 - q))) (`vidcom2_token_count`). That is EVS's K whenever T <= h*w;
with more groups than tokens per group VidCom2 keeps T, one token per frame, where EVS keeps h*w. The budgets
r_t * M are capped at M and rounded to whole tokens by the largest remainder, every frame keeping at least
one, so that they sum to K (the paper rounds each alone; vLLM then adds or drops tokens by score over the
whole video, which can leave a frame with none). Cosines are float32; ties go to the earlier raster index.
"""

import math

import torch

from pruning.evs import retained_token_count, unit_vectors
from pruning.inputs import check_counts, check_features, parse_grid, validate_pruning_rate

TEMPERATURE = 0.01  # the paper's tau: a frame's share moves with differences of a hundredth in u_t


def vidcom2_token_count(tokens_per_frame: int, num_frames: int, q: float) -> int:
    """Tokens VidCom2 keeps: `K = max(h*w, T, floor(T*h*w*(1 - q)))`, exactly (EVS's count, and one token a
    frame at least)."""
    tokens_per_frame, num_frames = check_counts(tokens_per_frame, num_frames)
    return max(retained_token_count(tokens_per_frame, num_frames, q), num_frames)


def uniqueness(features: torch.Tensor, grid_thw) -> tuple[torch.Tensor, torch.Tensor]:
    """(u_t, u_video + u_frame): the frames' uniqueness (T,) and the tokens' (T, h*w), float32.

    features: (T*h*w, D), any float dtype, rows in (t, h, w) raster order. Both scores are larger for what
    is less like the rest; a zero feature vector has cosine 0 with anything (never NaN).
    """
    t, h, w = parse_grid(grid_thw)
    check_features(features, t, h, w)
    tokens = features.to(torch.float32).reshape(t, h * w, -1)
    unit = unit_vectors(tokens)
    video_cos = unit @ unit_vectors(tokens.mean(dim=(0, 1)))
    # A batched product, not unit * centre summed: that would hold one more (T, h*w, D) float32 copy.
    frame_cos = (unit @ unit_vectors(tokens.mean(dim=1))[:, :, None])[..., 0]
    return -video_cos.mean(dim=1), -(video_cos + frame_cos)


def frame_budgets(frame_uniqueness: torch.Tensor, tokens_per_frame: int, kept: int, q: float) -> torch.Tensor:
    """Tokens each frame keeps, (T,) int64 summing to `kept`, each from 1 to tokens_per_frame.

    frame_uniqueness: (T,) u_t. The paper's r_t * M, capped at M, is each frame's ideal share; the frame's
    j-th token (from 0) has the claim share - j, its first one an unbeatable claim, and the `kept` largest
    claims win: the largest-remainder rounding, frames with room taking what a capped frame cannot.
    """
    num_frames = frame_uniqueness.numel()
    if not num_frames <= kept <= num_frames * tokens_per_frame:
        raise ValueError(f"kept must be from {num_frames} to {num_frames * tokens_per_frame}; got {kept}.")
    weights = torch.softmax((frame_uniqueness - frame_uniqueness.max()) / TEMPERATURE, dim=0)
    share = ((1 - q) * (1 + weights - 1 / num_frames) * tokens_per_frame).clamp(max=tokens_per_frame)
    slots = torch.arange(tokens_per_frame, dtype=torch.float32, device=share.device)
    claims = share[:, None] - slots
    claims[:, 0] = math.inf
    # A stable sort gives equal claims to the earlier frame.
    winners = torch.sort(claims.reshape(-1), descending=True, stable=True).indices[:kept]
    return torch.bincount(winners // tokens_per_frame, minlength=num_frames)


def vidcom2_retention_mask(features: torch.Tensor, grid_thw, q) -> torch.Tensor:
    """Which video tokens VidCom2 keeps: in each frame, its budget's most unique tokens.

    features: (T*h*w, D), any float dtype, rows in (t, h, w) raster order.
    grid_thw: (T, h, w) in LLM tokens, as a tuple, list or 1-D tensor.
    q: pruning rate in [0, 1); anything else raises ValueError.
    Returns (T*h*w,) bool on the features' device in raster order, `vidcom2_token_count(h*w, T, q)` of
    them True, at least one in every frame. q = 0 keeps everything.
    """
    q = validate_pruning_rate(q)
    t, h, w = parse_grid(grid_thw)
    check_features(features, t, h, w)
    kept = vidcom2_token_count(h * w, t, q)
    if kept == t * h * w:
        return torch.ones(t * h * w, dtype=torch.bool, device=features.device)
    frame_scores, token_scores = uniqueness(features, (t, h, w))
    budgets = frame_budgets(frame_scores, h * w, kept, q)
    order = torch.sort(token_scores, dim=1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(h * w, device=order.device).expand(t, -1))
    return (rank < budgets[:, None]).reshape(-1)
