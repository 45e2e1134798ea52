"""VidCom2 (Liu et al., 2025, "Video Compression Commander") as its authors' code defines it
(github.com/xuyang-liu16/VidCom2, `token_compressor/vidcom2/vidcom2.py`): each frame's share of the kept
tokens from how unlike the whole video the frame is, then in each frame the tokens least like the video and
the frame.

A frame is one temporal group of the grid `(T, h, w)`, M = h*w tokens; features are in `(t, h, w)` raster
order, the final visual embeddings, as the authors' Qwen3-VL hook takes them. In the authors' terms:

    channels: the C = D/2 channels of lowest variance over all T*M tokens (population variance)
    x[t, m]   the token on those channels, scaled to unit length
    g_v = mean of x over the video               g_f[t] = mean of x over frame t (neither rescaled)
    s(x, g) = sum over a in {1/8, 1/4, 1/2, 1, 2} of exp(-|x - g|^2 / (2a))   (larger: more alike)
    u_t = -mean over m of s(x[t, m], g_v)        (the frame's uniqueness)
    sigma = softmax((u - max u) / tau), tau = 0.01
    r_t = min(1, R * (1 + sigma_t - mean sigma)), R = 1 - q
    budget_t = max(1, round(r_t * M))            (round half to even, as torch rounds)
    frame t keeps its budget_t tokens of smallest s(x, g_v) + s(x, g_f[t]).

The authors' budgets sum to about R*T*M. Here the count is exact and EVS's where the method allows,
K = max(h*w, T, floor(T*h*w*(1 - q))) (`vidcom2_token_count`), so that methods compare at equal budgets. It
is reached as vLLM's port reaches its count: from the authors' choice, the kept tokens of largest
s(x, g_v) + s(x, g_f) over the whole video are dropped, or the unkept ones of smallest added, until K are
kept; a drop never takes a frame's last token (the project keeps one in every frame, as the authors'
budgets do). Ties, which the authors leave to `topk`, go to the earlier raster index: it is kept first and
dropped last, within a frame and over the video. Scores are float32 whatever the features' dtype (the
authors' code scores in the embeddings' own dtype). With one channel (D = 1) that channel is scored (the
authors' D/2 rounds down to none).
"""

import torch

from pruning.evs import retained_token_count, unit_vectors
from pruning.inputs import check_counts, check_features, parse_grid, validate_pruning_rate

TEMPERATURE = 0.01  # the authors' tau: a frame's share moves with differences of a hundredth in u_t
KERNEL_WIDTHS = tuple(2.0**k for k in range(-3, 2))  # the authors' a: 1/8 to 2, fine to coarse
CHANNEL_SHARE = 0.5  # of the embedding channels, the lowest-variance share that is scored


def vidcom2_token_count(tokens_per_frame: int, num_frames: int, q: float) -> int:
    """Tokens VidCom2 keeps: `K = max(h*w, T, floor(T*h*w*(1 - q)))`, exactly (EVS's count, and one token a
    frame at least)."""
    tokens_per_frame, num_frames = check_counts(tokens_per_frame, num_frames)
    return max(retained_token_count(tokens_per_frame, num_frames, q), num_frames)


def low_variance_channels(features: torch.Tensor) -> torch.Tensor:
    """features (N, D) -> float32 (N, C): the C = max(1, floor(D * CHANNEL_SHARE)) channels of lowest
    population variance over the N tokens, in channel order; equal variances go to the lower channel."""
    rows = features.to(torch.float32)
    channels = max(1, int(rows.shape[1] * CHANNEL_SHARE))
    # Two passes, not torch.var(dim=0): that reduction across rows is about 30x slower on CPU (measured).
    variance = (rows - rows.mean(dim=0)).square().mean(dim=0)
    order = torch.sort(variance, stable=True).indices[:channels]
    return rows.index_select(1, order.sort().values)


def kernel_similarity(unit: torch.Tensor, centre: torch.Tensor) -> torch.Tensor:
    """sum over KERNEL_WIDTHS a of exp(-|unit - centre|^2 / (2a)): unit (..., C), centre broadcastable to it;
    returns (...) float32, from 0 (far) to len(KERNEL_WIDTHS) (the centre itself)."""
    distance_sq = (unit - centre).square().sum(dim=-1)
    return sum(torch.exp(-distance_sq / (2 * width)) for width in KERNEL_WIDTHS)


def vidcom2_scores(features: torch.Tensor, grid_thw) -> tuple[torch.Tensor, torch.Tensor]:
    """(u_t, s(x, g_v) + s(x, g_f)): the frames' uniqueness (T,) and the tokens' redundancy (T, h*w), float32.

    features: (T*h*w, D), any float dtype, rows in (t, h, w) raster order. Uniqueness is larger for a frame
    less like the video; redundancy is larger for a token more like its video and its frame. A token that is
    zero on the scored channels stays zero (never NaN).
    """
    t, h, w = parse_grid(grid_thw)
    check_features(features, t, h, w)
    unit = unit_vectors(low_variance_channels(features)).reshape(t, h * w, -1)
    to_video = kernel_similarity(unit, unit.mean(dim=(0, 1)))
    to_frame = kernel_similarity(unit, unit.mean(dim=1, keepdim=True))
    return -to_video.mean(dim=1), to_video + to_frame


def frame_budgets(frame_uniqueness: torch.Tensor, tokens_per_frame: int, q: float) -> torch.Tensor:
    """The authors' per-frame budgets, (T,) int64, each from 1 to tokens_per_frame: round(r_t * M), at least 1.

    frame_uniqueness: (T,) u_t. They sum to about (1 - q) * T * M, not to any exact count.
    """
    weights = torch.softmax((frame_uniqueness - frame_uniqueness.max()) / TEMPERATURE, dim=0)
    shares = ((1 - validate_pruning_rate(q)) * (1 + weights - weights.mean())).clamp(max=1.0)
    return (shares * tokens_per_frame).round().long().clamp(min=1)


def vidcom2_retention_mask(features: torch.Tensor, grid_thw, q) -> torch.Tensor:
    """Which video tokens VidCom2 keeps: in each frame, its most unique tokens, K of them over the video.

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
    frame_uniqueness, redundancy = vidcom2_scores(features, (t, h, w))
    budgets = frame_budgets(frame_uniqueness, h * w, q)
    # Ranks by a stable ascending sort: 0 is the least redundant, equal scores rank the earlier token first.
    in_frame = inverse_permutation(torch.sort(redundancy, dim=1, stable=True).indices)
    over_video = inverse_permutation(torch.sort(redundancy.reshape(-1), stable=True).indices)
    mask = (in_frame < budgets[:, None]).reshape(-1)
    surplus = int(mask.sum()) - kept
    if surplus > 0:  # drop the most redundant kept tokens, each frame's least redundant one spared
        droppable = mask & (in_frame.reshape(-1) > 0)
        mask[torch.where(droppable, over_video, -1).topk(surplus).indices] = False
    elif surplus < 0:  # add the least redundant unkept tokens
        mask[torch.where(mask, t * h * w, over_video).topk(-surplus, largest=False).indices] = True
    return mask


def inverse_permutation(order: torch.Tensor) -> torch.Tensor:
    """The rank of each position given `order` (..., n), the positions sorted along the last dimension."""
    ranks = torch.arange(order.shape[-1], device=order.device).expand_as(order)
    return torch.empty_like(order).scatter_(-1, order, ranks)
