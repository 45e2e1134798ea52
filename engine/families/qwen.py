"""The Qwen-VL families: Qwen3-VL (and its MoE), Qwen3.5/3.6 (hybrid, with the thinking switch) and
Qwen2.5-VL, all with MRoPE positions carried from the unpruned prompt."""

import torch
import torch.nn.functional as F
from transformers.vision_utils import (
    get_vision_interpolation_indices_and_weights,
    get_vision_position_ids,
    get_vision_window_index,
)

from .base import Family, VideoFeatures, VideoInputs


def _unit_subset(visual, media: list[VideoInputs], encoded: list[torch.Tensor | None]):
    """What a Qwen tower needs to run only the encoded units: (their patch rows, (n, 3) patch grids, (P,) bool over
    every medium's patch rows, the kept patches' vision position ids, cu_seqlens of the kept patches of each temporal
    group (the tower attends within a group; a group with none kept has no segment), and the encoded units per
    medium)."""
    device = visual.device
    unit = visual.spatial_merge_size**2
    masks = [
        torch.ones(m.grid_thw[0], m.tokens // m.grid_thw[0], dtype=torch.bool) if e is None else e
        for m, e in zip(media, encoded)
    ]
    keep = torch.cat([mask.reshape(-1) for mask in masks]).repeat_interleave(unit).to(device)
    grids = torch.stack([m.grid_thw_patches for m in media]).to(device)
    pixels = torch.cat([m.pixel_values for m in media]).to(device)[keep].type(visual.dtype)
    per_group = torch.cat([mask.sum(dim=1) for mask in masks]) * unit
    per_group = per_group[per_group > 0]
    cu_seqlens = F.pad(per_group.cumsum(0, dtype=torch.int32), (1, 0)).to(device)
    positions = get_vision_position_ids(grids, visual.spatial_merge_size)[keep]
    return pixels, grids, keep, positions, cu_seqlens, [int(mask.sum()) for mask in masks]


class Qwen3VL(Family):
    """Qwen3-VL: each temporal group is `<t.t seconds><|vision_start|>` + pads + `<|vision_end|>`;
    temporal order comes from the timestamps, so every group's t position is its own start."""

    name = "qwen3_vl"

    def video_placeholder(self) -> str:
        # The processor adds the per-group timestamps and vision markers itself.
        return "<|video_pad|>"

    def live_group_text(self, group, times_s, first):
        # The processor's `<t seconds>`: the mean of the group's first and last frame's time.
        return f"<{(times_s[0] + times_s[-1]) / 2:.1f} seconds><|vision_start|>", "<|vision_end|>"

    def video_runs(self, grid_thw):
        return [(t, 1) for t in range(grid_thw[0])]

    def temporal_offsets(self, num_groups, second_per_group):
        return torch.zeros(num_groups, dtype=torch.long)

    def next_text_position(self, run_start, run_max, grid_thw):
        return run_max + 1

    def encode(self, model, pixel_values, grid_thw_patches):
        out = model.model.get_video_features(pixel_values, grid_thw_patches, return_dict=True)
        levels = getattr(out, "deepstack_features", None) or []  # Qwen3.5 has no DeepStack
        return [VideoFeatures(embeds, [level[i] for level in levels]) for i, embeds in enumerate(out.pooler_output)]

    def encode_units(self, model, media, encoded):
        # transformers' tower takes its grid-derived tensors precomputed (transformers.vision_utils): the learned
        # position embedding's interpolation taps and the rotary positions of the full grid, cut to the kept
        # patches, and one attention segment per temporal group of what is kept.
        visual = model.model.visual
        pixels, grids, keep, positions, cu_seqlens, counts = _unit_subset(visual, media, encoded)
        taps, weights = get_vision_interpolation_indices_and_weights(
            grids,
            num_grid_per_side=visual.num_grid_per_side,
            mode=visual.interpolation_mode,
            align_corners=visual.interpolation_align_corners,
            spatial_merge_size=visual.spatial_merge_size,
        )
        out = visual(
            pixels,
            grid_thw=grids,
            interp_indices=taps[keep],
            interp_weights=weights[keep],
            position_ids=positions,
            cu_seqlens=cu_seqlens,
            return_dict=True,
        )
        levels = getattr(out, "deepstack_features", None) or []
        embeds = out.pooler_output.split(counts)
        deepstack = [level.split(counts) for level in levels]
        return [VideoFeatures(e, [level[i] for level in deepstack]) for i, e in enumerate(embeds)]

    def processor_size(self, num_frames, max_pixels_per_frame, factor):
        # Qwen3-VL's `size` counts pixels over all frames, so the cap is scaled by the frame count: the
        # smaller of the raw and temporally rounded counts (the processor's own rounding, Python's round),
        # which keeps every frame at or under the cap whichever branch of its resize fires.
        temporal = self.temporal_patch
        frames_counted = max(1, min(num_frames, round(num_frames / temporal) * temporal))
        return {"shortest_edge": factor * factor * temporal, "longest_edge": frames_counted * max_pixels_per_frame}

    def language_kwargs(self, visual_mask, deepstack):
        if visual_mask is None or not deepstack or not bool(visual_mask.any()):
            return {}
        return {"visual_pos_masks": visual_mask, "deepstack_visual_embeds": deepstack}


class Qwen35(Qwen3VL):
    """Qwen3.5 and Qwen3.6, dense and MoE: Qwen3-VL's prompt, timestamps and positions; no DeepStack in the
    released configs; a hybrid language model (engine/state/lm_state.py keeps its recurrent layers' state). The chat
    template trims messages and has the enable_thinking switch: the answer opens with a think block, which
    the model fills and closes (thinking) or which comes empty (not)."""

    name = "qwen3_5"
    think_end = "</think>"

    def message_text(self, text):
        return text.strip()  # the template trims every message (`render_content(...)|trim`)

    def earlier_answer(self, answer):
        # Before the last question the template writes only what follows an answer's `</think>`, trimmed: no
        # earlier reasoning and no think block, empty or not (those come after the last question only).
        answer = answer.strip()
        return answer.split(self.think_end)[-1].lstrip("\n") if self.think_end in answer else answer

    def answer_opening(self, thinking):
        # Shipped templates differ only in the default (thinking on from Qwen3.5-4B up, off below); the
        # switch is always given here, so both write this.
        return "<think>\n" if thinking else "<think>\n\n</think>\n\n"


class Qwen25VL(Family):
    """Qwen2.5-VL: one `<|vision_start|>` + all pads + `<|vision_end|>` run; the temporal position of
    group g is trunc(g * tokens_per_second * seconds_per_group)."""

    name = "qwen2_5_vl"

    def __init__(self, temporal_patch: int, tokens_per_second: float):
        super().__init__(temporal_patch)
        self.tokens_per_second = tokens_per_second

    def video_placeholder(self) -> str:
        return "<|vision_start|><|video_pad|><|vision_end|>"

    def live_group_text(self, group, times_s, first):
        return "", ""  # the groups' tokens follow one another inside the placeholder's markers

    def video_runs(self, grid_thw):
        return [(0, grid_thw[0])]

    def temporal_offsets(self, num_groups, second_per_group):
        # The original Qwen rule multiplies, then truncates; float64 keeps exact products exact.
        scale = torch.tensor(second_per_group, dtype=torch.float64) * self.tokens_per_second
        return (torch.arange(num_groups, dtype=torch.float64) * scale).long()

    def next_text_position(self, run_start, run_max, grid_thw):
        # Original Qwen2.5 rule: text resumes after the largest position used by the video.
        # (transformers >= 5.3 uses run_start + max(h, w), which differs for long clips.)
        return run_max + 1

    def encode(self, model, pixel_values, grid_thw_patches):
        out = model.model.get_video_features(pixel_values, grid_thw_patches, return_dict=True)
        return [VideoFeatures(embeds, []) for embeds in out.pooler_output]

    def encode_units(self, model, media, encoded):
        # Qwen2.5-VL's windowed blocks attend within spatial windows of one group: the full grid's windows, each
        # cut to its kept units (a window left empty is no segment), in the tower's window order.
        visual = model.model.visual
        pixels, grids, keep, positions, cu_seqlens, counts = _unit_subset(visual, media, encoded)
        unit = visual.spatial_merge_unit
        order, bounds = get_vision_window_index(
            grids.cpu(), visual.spatial_merge_size, visual.window_size, visual.patch_size
        )
        kept_units = keep[::unit].cpu()
        place = kept_units.cumsum(0) - 1  # each kept unit's row in the shorter sequence
        kept_in_order = kept_units[order]
        window_of = torch.searchsorted(bounds[1:] // unit, torch.arange(order.numel(), device=order.device), right=True)
        sizes = torch.bincount(window_of[kept_in_order], minlength=bounds.numel() - 1) * unit
        window_bounds = torch.unique_consecutive(F.pad(sizes.cumsum(0, dtype=torch.int32), (1, 0)))
        out = visual(
            pixels,
            grid_thw=grids,
            position_ids=positions,
            cu_seqlens=cu_seqlens,
            window_index=place[order[kept_in_order]].to(pixels.device),
            cu_window_seqlens=window_bounds.to(pixels.device),
            return_dict=True,
        )
        return [VideoFeatures(embeds, []) for embeds in out.pooler_output.split(counts)]
