"""What differs between the Qwen model families: prompt markers, MRoPE positions, vision outputs,
and how the language model takes DeepStack features.

Everything here works on one unpruned prompt; EVS (evs/) then selects columns from it.
"""

from dataclasses import dataclass

import torch


@dataclass
class VideoFeatures:
    """Vision-tower output for one video, rows in (t, h, w) raster order of LLM tokens.

    embeds: (T*h*w, D) the final visual embeddings the LLM receives (merger output).
    deepstack: per DeepStack level, (T*h*w, D); empty for families without DeepStack.
    """

    embeds: torch.Tensor
    deepstack: list[torch.Tensor]

    @property
    def nbytes(self) -> int:
        tensors = [self.embeds, *self.deepstack]
        return sum(t.numel() * t.element_size() for t in tensors)

    def select(self, keep: torch.Tensor) -> "VideoFeatures":
        """Rows where keep (T*h*w,) bool is True; the same mask for every DeepStack level."""
        return VideoFeatures(self.embeds[keep], [level[keep] for level in self.deepstack])


class Family:
    """Base: a Qwen-VL family. Subclasses fill in the differences.

    temporal_patch: video frames per temporal group (the vision tower's temporal patch size), read once
    from the model config here; the rest of the engine asks the family.
    """

    name = ""
    think_end: str | None = None  # the marker that ends the thinking; None: no enable_thinking switch

    def __init__(self, temporal_patch: int):
        self.temporal_patch = temporal_patch

    def video_placeholder(self) -> str:
        """Text that the HF processor expands into the video's tokens."""
        raise NotImplementedError

    def message_text(self, text: str) -> str:
        """A system or user message as the checkpoint's chat template writes it (the video placeholder
        included, in the first user message)."""
        return text

    def earlier_answer(self, answer: str) -> str:
        """An earlier assistant turn as the chat template writes it in the history."""
        return answer

    def answer_opening(self, thinking: bool) -> str:
        """What the chat template writes after `<|im_start|>assistant\\n` of the turn to be generated;
        thinking is its enable_thinking, which a family without the switch ignores."""
        return ""

    def video_runs(self, grid_thw: tuple[int, int, int]) -> list[tuple[int, int]]:
        """(first temporal group, groups in the run) for each contiguous run of video tokens."""
        raise NotImplementedError

    def temporal_offsets(self, num_groups: int, second_per_group: float) -> torch.Tensor:
        """(num_groups,) long: temporal MRoPE offset of each group within its run."""
        raise NotImplementedError

    def next_text_position(self, run_start: int, run_max: int, grid_thw: tuple[int, int, int]) -> int:
        """Where text after a run of video tokens starts."""
        raise NotImplementedError

    def full_positions(
        self, is_video: torch.Tensor, grid_thw: tuple[int, int, int], second_per_group: float
    ) -> torch.Tensor:
        """MRoPE positions (3, L) of an unpruned prompt holding one video.

        is_video: (L,) bool marks the T*h*w video tokens; grid_thw: (T, h, w) in LLM tokens;
        second_per_group: seconds of video per temporal group (Qwen2.5's temporal scale).
        """
        T, h, w = grid_thw
        length = is_video.numel()
        positions = torch.empty(3, length, dtype=torch.long)
        video_idx = torch.nonzero(is_video).flatten().tolist()
        runs = self.video_runs(grid_thw)
        tokens_per_group = h * w
        if len(video_idx) != T * tokens_per_group:
            raise ValueError(f"prompt holds {len(video_idx)} video tokens, grid {grid_thw} needs {T * h * w}")
        rows = torch.arange(h).repeat_interleave(w)
        cols = torch.arange(w).repeat(h)
        cursor, text_pos, consumed = 0, 0, 0
        for first_group, num_groups in runs:
            run_len = num_groups * tokens_per_group
            run_begin = video_idx[consumed]
            if video_idx[consumed + run_len - 1] != run_begin + run_len - 1:
                raise ValueError("video tokens of one run are not contiguous in the prompt")
            positions[:, cursor:run_begin] = torch.arange(run_begin - cursor) + text_pos
            start = text_pos + run_begin - cursor
            t_off = self.temporal_offsets(num_groups, second_per_group)
            run = positions[:, run_begin : run_begin + run_len]
            run[0] = (t_off.repeat_interleave(tokens_per_group)) + start
            run[1] = rows.repeat(num_groups) + start
            run[2] = cols.repeat(num_groups) + start
            text_pos = self.next_text_position(start, int(run.max()), grid_thw)
            cursor = run_begin + run_len
            consumed += run_len
        positions[:, cursor:] = torch.arange(length - cursor) + text_pos
        return positions

    def encode(self, model, pixel_values: torch.Tensor, grid_thw_patches: torch.Tensor) -> list[VideoFeatures]:
        """One vision forward over several videos.

        pixel_values: (P, C) patches of all videos concatenated; grid_thw_patches: (n, 3) patch grids.
        Returns one VideoFeatures per video, in order.
        """
        raise NotImplementedError

    def language_kwargs(self, visual_mask: torch.Tensor | None, deepstack: list[torch.Tensor] | None) -> dict:
        """Extra arguments for the language model's forward (DeepStack injection)."""
        return {}

    def processor_size(self, num_frames: int, max_pixels_per_frame: int, factor: int) -> dict:
        """The HF video processor's `size` (pixels) that caps each of num_frames frames at
        max_pixels_per_frame; factor is patch * merge, the side of one LLM token in pixels."""
        return {"shortest_edge": factor * factor, "longest_edge": max_pixels_per_frame}


class Qwen3VL(Family):
    """Qwen3-VL: each temporal group is `<t.t seconds><|vision_start|>` + pads + `<|vision_end|>`;
    temporal order comes from the timestamps, so every group's t position is its own start."""

    name = "qwen3_vl"

    def video_placeholder(self) -> str:
        # The processor adds the per-group timestamps and vision markers itself.
        return "<|video_pad|>"

    def video_runs(self, grid_thw):
        return [(t, 1) for t in range(grid_thw[0])]

    def temporal_offsets(self, num_groups, second_per_group):
        return torch.zeros(num_groups, dtype=torch.long)

    def next_text_position(self, run_start, run_max, grid_thw):
        return run_max + 1

    def encode(self, model, pixel_values, grid_thw_patches):
        out = model.model.get_video_features(pixel_values, grid_thw_patches, return_dict=True)
        levels = getattr(out, "deepstack_features", None) or []  # Qwen3.5 has no DeepStack
        return [
            VideoFeatures(embeds, [level[i] for level in levels]) for i, embeds in enumerate(out.pooler_output)
        ]

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
    released configs; a hybrid language model (engine/lm_state.py keeps its recurrent layers' state). The chat
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


def family_for(model) -> Family:
    model_type = model.config.model_type
    vision = model.config.vision_config
    if model_type in ("qwen3_vl", "qwen3_vl_moe"):  # the MoE changes the MLPs only
        return Qwen3VL(vision.temporal_patch_size)
    if model_type in ("qwen3_5", "qwen3_5_moe"):
        return Qwen35(vision.temporal_patch_size)
    if model_type == "qwen2_5_vl":
        return Qwen25VL(vision.temporal_patch_size, vision.tokens_per_second)
    raise ValueError(f"model type {model_type!r} is not a supported Qwen-VL family")
