"""Turning an EVS retention mask into what a pruned prompt needs: per-group counts, kept prompt
positions, and MRoPE position ids taken from the unpruned layout."""

import torch

from pruning.inputs import parse_grid


def tokens_kept_per_group(mask: torch.Tensor, grid_thw) -> torch.Tensor:
    """Kept tokens in each temporal group.

    mask: (T*h*w,) bool in (t, h, w) raster order; grid_thw: (T, h, w) as a tuple, list or 1-D tensor.
    Returns (T,) int64 on the mask's device; entries may be 0 for groups past the first.
    """
    t, h, w = parse_grid(grid_thw)
    if mask.numel() != t * h * w:
        raise ValueError(f"mask must hold T*h*w = {t * h * w} entries for grid ({t}, {h}, {w}); got {mask.numel()}.")
    return mask.reshape(t, h * w).sum(dim=1, dtype=torch.int64)


def prompt_keep_mask(is_video_token: torch.Tensor, retention_mask: torch.Tensor) -> torch.Tensor:
    """Which tokens of the full, unpruned prompt survive EVS.

    is_video_token: (L,) bool over a prompt that holds exactly one video's n tokens.
    retention_mask: (n,) bool, the video's EVS mask in raster order.
    Returns (L,) bool on is_video_token's device: every non-video token kept, the i-th video token kept
    iff retention_mask[i]. Raises ValueError when the prompt's video-token count is not n.
    """
    video_tokens = int(is_video_token.sum())
    if video_tokens != retention_mask.numel():
        raise ValueError(
            f"The prompt holds {video_tokens} video tokens but the retention mask has {retention_mask.numel()} entries."
        )
    keep = torch.ones_like(is_video_token, dtype=torch.bool)
    keep[is_video_token.to(torch.bool)] = retention_mask.to(device=keep.device, dtype=torch.bool)
    return keep


def select_positions(position_ids: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Positions of the kept prompt tokens, taken from the unpruned layout.

    position_ids: (R, L) or (R, B, L) for the full, unpruned prompt; R = 3 (MRoPE t/h/w rows) or 4
    (a leading contiguous 1-D row, then t/h/w).
    keep: (L,) bool, e.g. from `prompt_keep_mask`.
    Returns (R, L') or (R, B, L'), L' = keep.sum(), same dtype and device.

    The t/h/w rows are NOT renumbered: MRoPE must see each kept token at its unpruned position, and
    text after the video keeps continuing from the unpruned maximum + 1. Row 0 (only when R == 4)
    is replaced by a contiguous range starting at the unpruned row 0's first value (arange(L') for
    a prompt starting at 0), because a gap in row 0 is read as a packed-sequence boundary when no
    attention mask is given.
    """
    rows = position_ids.shape[0]
    if rows not in (3, 4) or position_ids.dim() not in (2, 3):
        raise ValueError(f"position_ids must be (3 or 4, [B,] L); got {tuple(position_ids.shape)}.")
    if keep.dim() != 1 or keep.shape[0] != position_ids.shape[-1]:
        raise ValueError(f"keep must be (L,) with L = {position_ids.shape[-1]}; got {tuple(keep.shape)}.")
    kept = position_ids[..., keep.to(device=position_ids.device, dtype=torch.bool)]
    if rows == 4:
        start = position_ids[0, ..., :1]
        steps = torch.arange(kept.shape[-1], dtype=kept.dtype, device=kept.device)
        kept[0] = start + steps
    return kept
