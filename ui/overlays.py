"""Sampled frames with the pruned patches dimmed and tinted, so a person sees what the model kept."""

import math

import numpy as np

from engine.stream import EvsPicture

PRUNED_DIM = 0.35  # pruned pixels keep this fraction of their brightness...
PRUNED_TINT_RGB = np.array([225, 29, 72], dtype=np.float32)  # ...plus this colour (figures' PRUNED_COLOR)
PRUNED_TINT_WEIGHT = 0.3


def pruned_pixels(kept_hw: np.ndarray, height_px: int, width_px: int) -> np.ndarray:
    """(H, W) bool, True where the pixel lies in a pruned token.

    kept_hw: (h, w) bool token mask of one group. Each token covers an equal share of the frame; the
    frame need not be an exact multiple of the grid, so pixel rows/columns map to tokens by flooring.
    """
    h, w = kept_hw.shape
    token_row = np.arange(height_px) * h // height_px
    token_col = np.arange(width_px) * w // width_px
    return ~kept_hw[np.ix_(token_row, token_col)]


def dim_pruned(frame: np.ndarray, kept_hw: np.ndarray) -> np.ndarray:
    """(H, W, 3) uint8 copy of `frame` with the pixels of pruned tokens dimmed and tinted."""
    mask = pruned_pixels(kept_hw, frame.shape[0], frame.shape[1])
    out = frame.copy()
    shaded = frame[mask].astype(np.float32) * PRUNED_DIM + PRUNED_TINT_RGB * PRUNED_TINT_WEIGHT
    out[mask] = np.clip(np.rint(shaded), 0, 255).astype(np.uint8)
    return out


def frame_caption(timestamp_s: float, kept_tokens: int, total_tokens: int) -> str:
    return f"t={timestamp_s:.1f} s · kept {kept_tokens}/{total_tokens}"


def frame_gallery(picture: EvsPicture) -> list[tuple[np.ndarray, str]]:
    """One (overlaid frame (H, W, 3) uint8, caption) per temporal group, in time order."""
    _, h, w = picture.grid_thw
    return [
        (dim_pruned(frame, kept_hw), frame_caption(t_s, int(kept_hw.sum()), h * w))
        for frame, kept_hw, t_s in zip(picture.frames, picture.kept_mask, picture.timestamps_s)
    ]


def pruning_montage(picture: EvsPicture, side_px: int = 96) -> np.ndarray:
    """Every group's dimmed frame in one picture, (H, W, 3) uint8: a grid of ceil(sqrt(T)) columns, each frame
    scaled (nearest pixel) to fit side_px x side_px, in time order, with a white gap; for the compare view,
    where each request gets one picture."""
    frames = [dim_pruned(frame, kept_hw) for frame, kept_hw in zip(picture.frames, picture.kept_mask)]
    height, width = frames[0].shape[:2]
    scale = side_px / max(height, width)
    cell_h, cell_w = max(1, round(height * scale)), max(1, round(width * scale))
    rows_px, cols_px = np.arange(cell_h) * height // cell_h, np.arange(cell_w) * width // cell_w
    columns = math.ceil(math.sqrt(len(frames)))
    rows = math.ceil(len(frames) / columns)
    gap = 2
    out = np.full((rows * (cell_h + gap) - gap, columns * (cell_w + gap) - gap, 3), 255, dtype=np.uint8)
    for index, frame in enumerate(frames):
        top, left = (index // columns) * (cell_h + gap), (index % columns) * (cell_w + gap)
        out[top : top + cell_h, left : left + cell_w] = frame[np.ix_(rows_px, cols_px)]
    return out
