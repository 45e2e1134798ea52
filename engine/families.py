"""What differs between the model families: prompt markers, positions, the processor's output, vision
outputs, where the language model sits in the checkpoint, and how it takes DeepStack features; and for a
model that hears (Nemotron-H Omni's audio tower), the soundtrack's markers and audio features. The Qwen-VL
families (MRoPE positions) and Nemotron-H Omni (no rotary positions) are here.

Everything here works on one unpruned prompt; EVS (evs/) then selects columns from it.
"""

import copy
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class VideoFeatures:
    """Vision-tower output for one video, rows in (t, h, w) raster order of LLM tokens, and the audio tower's
    for its soundtrack when it was heard.

    embeds: (T*h*w, D) the final visual embeddings the LLM receives (merger output).
    deepstack: per DeepStack level, (T*h*w, D); empty for families without DeepStack.
    audio: (A, D) one row per audio token of the prompt, in order; None when no soundtrack was heard.
    """

    embeds: torch.Tensor
    deepstack: list[torch.Tensor]
    audio: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        tensors = [self.embeds, *self.deepstack, *([] if self.audio is None else [self.audio])]
        return sum(t.numel() * t.element_size() for t in tensors)

    def select(self, keep: torch.Tensor) -> "VideoFeatures":
        """Rows where keep (T*h*w,) bool is True; the same mask for every DeepStack level. EVS prunes video
        tokens only: every audio row is kept (the same tensor, not a copy)."""
        return VideoFeatures(self.embeds[keep], [level[keep] for level in self.deepstack], self.audio)


@dataclass
class VideoInputs:
    """The video part of the HF processor's output for one prompt, in the layout the engine keeps.

    pixel_values: (P, C) float patches, one row per vision patch, in (t, row, col) order. grid_thw_patches: (3,)
    long patch grid (groups, rows, cols). grid_thw: (T, h, w) in LLM tokens (after the spatial merge).
    second_per_group: seconds of video per temporal group (Qwen2.5-VL's temporal scale; 0.0 where unused).
    """

    pixel_values: torch.Tensor
    grid_thw_patches: torch.Tensor
    grid_thw: tuple[int, int, int]
    second_per_group: float


@dataclass
class AudioInputs:
    """The soundtrack part of the HF processor's output for one prompt: the audio tower's input.

    features: (1, F, mel bins) float log-mel frames. mask: (1, F) 1 on each real frame (all of them: one clip).
    """

    features: torch.Tensor
    mask: torch.Tensor


class Family:
    """Base: a Qwen-VL family. Subclasses fill in the differences.

    temporal_patch: video frames per temporal group (the vision tower's temporal patch size), read once
    from the model config here; the rest of the engine asks the family.
    """

    name = ""
    think_end: str | None = None  # the marker that ends the thinking; None: no enable_thinking switch
    writes_empty_system = False  # whether the chat template writes a system turn when there is no system prompt

    def __init__(self, temporal_patch: int):
        self.temporal_patch = temporal_patch

    def video_placeholder(self) -> str:
        """Text that the HF processor expands into the video's tokens."""
        raise NotImplementedError

    def hears(self, model) -> bool:
        """Whether the model has an audio tower, so that a soundtrack can be given to it beside the frames."""
        return False

    def audio_placeholder(self) -> str:
        """Text, written right after the video placeholder, that the HF processor expands into the soundtrack's
        tokens (a family that hears)."""
        raise NotImplementedError

    def audio_token_id(self, config) -> int:
        """The token id that stands for one audio token in the prompt (a family that hears)."""
        raise NotImplementedError

    def audio_end_token_id(self, tokenizer) -> int:
        """The marker the processor writes right after the soundtrack's last token (a family that hears)."""
        raise NotImplementedError

    def audio_inputs(self, inputs) -> AudioInputs:
        """The processor output's audio features (one soundtrack; a family that hears)."""
        raise NotImplementedError

    def encode_audio(self, model, clip: AudioInputs) -> torch.Tensor:
        """The audio tower over one soundtrack: (A, D), one row per audio token of the prompt (a family that
        hears)."""
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

    def sized_processor(self, processor, num_frames: int, max_pixels_per_frame: int) -> tuple[object, dict]:
        """(processor, call kwargs) that cap each of num_frames frames at max_pixels_per_frame (height*width)
        and never upscale. Sides are rounded to multiples of patch*merge (32 for Qwen3-VL, 28 for Qwen2.5-VL)
        by the processor; what `size` means differs by family (processor_size). The floor is one merged token
        per frame: ValueError below it."""
        video_processor = processor.video_processor
        factor = video_processor.patch_size * video_processor.merge_size
        size = self.processor_size(num_frames, max_pixels_per_frame, factor)
        if size["longest_edge"] < size["shortest_edge"]:
            raise ValueError(f"max_pixels_per_frame={max_pixels_per_frame} is below one token ({factor}x{factor})")
        # cap_pixels_per_frame=False: the cap above is ours; the processor must not shrink frames further.
        return processor, {"size": size, "cap_pixels_per_frame": False}

    def video_token_id(self, config) -> int:
        """The token id that stands for one video token in the prompt."""
        return config.video_token_id

    def video_end_token_id(self, config, tokenizer) -> int:
        """The marker the processor writes right after the video's last token."""
        return config.vision_end_token_id

    def video_inputs(self, inputs, config) -> VideoInputs:
        """The processor output's video pixels and grids (one video)."""
        grid_patches = inputs["video_grid_thw"][0]
        merge = config.vision_config.spatial_merge_size
        second_per_group = float(inputs["second_per_grid_ts"][0]) if "second_per_grid_ts" in inputs else 0.0
        grid_thw = (int(grid_patches[0]), int(grid_patches[1]) // merge, int(grid_patches[2]) // merge)
        return VideoInputs(inputs["pixel_values_videos"], grid_patches, grid_thw, second_per_group)

    def language_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """What the language model takes as position_ids, from the engine's (4, B, L) rows (row 0 the 1-D
        position, rows 1-3 MRoPE t/h/w): all four for the Qwen families."""
        return positions

    def text_model(self, model) -> nn.Module:
        """The language model's decoder stack: takes inputs_embeds, position_ids, attention_mask and a cache,
        returns last_hidden_state."""
        return model.model.language_model

    def lm_head(self, model) -> nn.Module:
        return model.lm_head

    def vision_modules(self, model) -> list[nn.Module]:
        """The modules a video passes through before the language model (for counting their parameters)."""
        return [model.model.visual]


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


class NemotronOmni(Family):
    """Nemotron-H Omni (transformers' `nemotron_h_omni`): a RADIO vision tower that packs two frames per
    tubelet, a pixel-shuffle projector, and a NemotronH language model of Mamba-2, attention and MoE layers
    (engine/lm_state.py keeps its Mamba layers' conv and SSM state, like Gated DeltaNet's).

    The processor writes each tubelet as `Frame i sampled at t seconds and frame i+1 sampled at t' seconds: `
    + `<img>` + one `<image>` per token + `</img>`, the tubelets joined by newlines: one temporal group per
    tubelet, and a tubelet that keeps no token under EVS still keeps its frame text and markers.

    Positions: the attention layers apply no rotary embedding (NemotronHAttention projects q, k and v and
    attends; it never reads position_ids), and Mamba-2 is causal by construction. Order is all the language
    model knows, so the pruned sequence simply is shorter: no position is carried from the unpruned layout,
    and the model is given the pruned sequence's own token index (row 0), which only its causal mask reads.
    The unpruned MRoPE-style rows are kept as the same index so the pruning code stays one for all families.
    """

    name = "nemotron_h_omni"
    think_end = "</think>"
    writes_empty_system = True  # the template always opens with `<|im_start|>system\n...<|im_end|>\n`
    _VIDEO_END = "</img>"
    _AUDIO_END = "<so_end>"

    def __init__(self, temporal_patch: int, patch_size: int, merge_size: int):
        super().__init__(temporal_patch)
        self.patch_size, self.merge_size = patch_size, merge_size

    def video_placeholder(self):
        # The processor expands it into the tubelets, their frame text and markers.
        return "<video>\n"

    def hears(self, model):
        return model.audio_tower is not None  # built from the config's audio_config, which the released one has

    def audio_placeholder(self):
        # The processor expands it into `<so_start>`, one `<so_embedding>` per audio token, `<so_end>`.
        return "<so_embedding>\n"

    def audio_token_id(self, config):
        return config.audio_token_id

    def audio_end_token_id(self, tokenizer):
        return tokenizer.convert_tokens_to_ids(self._AUDIO_END)

    def audio_inputs(self, inputs):
        return AudioInputs(inputs["input_features"], inputs["input_features_mask"])

    def encode_audio(self, model, clip):
        features, mask = clip.features.to(model.device), clip.mask.to(model.device)
        return model.get_audio_features(features, mask, return_dict=True).pooler_output

    def earlier_answer(self, answer):
        # truncate_history_thinking (on by default): an answer before the last question is written as an empty
        # think block and what followed its `</think>`, the whole trimmed.
        return ("<think></think>" + answer.split(self.think_end)[-1]).strip()

    def answer_opening(self, thinking):
        # The generation prompt after `<|im_start|>assistant\n`: open the think block, or write it empty.
        return "<think>\n" if thinking else "<think></think>"

    def full_positions(self, is_video, grid_thw, second_per_group):
        # Each token's index in the unpruned prompt, on all three rows (see the class docstring: only row 0 of
        # the pruned layout reaches the model).
        return torch.arange(is_video.numel()).expand(3, -1).clone()

    def sized_processor(self, processor, num_frames, max_pixels_per_frame):
        # The video processor resizes every frame (up or down) to one aspect-kept tile of about
        # `video_target_num_patches` patches (the checkpoints: 1,024, 512x512 pixels); the cap lowers that
        # budget, never raises it. The budget is an attribute the processor reads, not a call argument, and the
        # loaded processor is shared by the prepare threads: a request with another budget gets shallow copies.
        factor = self.patch_size * self.merge_size
        if max_pixels_per_frame < factor * factor:
            raise ValueError(f"max_pixels_per_frame={max_pixels_per_frame} is below one token ({factor}x{factor})")
        budget = min(processor.video_processor.video_target_num_patches, max_pixels_per_frame // self.patch_size**2)
        if budget == processor.video_processor.video_target_num_patches:
            return processor, {}
        sized = copy.copy(processor)
        sized.video_processor = copy.copy(processor.video_processor)
        sized.video_processor.video_target_num_patches = budget
        return sized, {}

    def video_token_id(self, config):
        # Tubelets are written with the image token; config.video_token_id names the `<video>` placeholder.
        return config.image_token_id

    def video_end_token_id(self, config, tokenizer):
        return tokenizer.convert_tokens_to_ids(self._VIDEO_END)

    def video_inputs(self, inputs, config):
        # pixel_values_videos: (1, T, temporal_patch * C, H, W), each tubelet's frames stacked on the channels.
        # Kept as patch rows like Qwen's, so videos of any size concatenate and the ViT budget counts patches.
        tubelets = inputs["pixel_values_videos"][0]
        T, channels, height, width = tubelets.shape
        p = self.patch_size
        rows, cols = height // p, width // p
        patches = tubelets.reshape(T, channels, rows, p, cols, p).permute(0, 2, 4, 1, 3, 5)
        grid_patches = torch.tensor([T, rows, cols])
        grid_thw = (T, rows // self.merge_size, cols // self.merge_size)
        return VideoInputs(patches.reshape(T * rows * cols, channels * p * p), grid_patches, grid_thw, 0.0)

    def _tubelets(self, patches: torch.Tensor, grid: list[int]) -> torch.Tensor:
        """(T*rows*cols, temporal_patch*C*p*p) patch rows -> (T, temporal_patch*C, rows*p, cols*p) pixels."""
        T, rows, cols = grid
        p = self.patch_size
        pixels = patches.reshape(T, rows, cols, -1, p, p).permute(0, 3, 1, 4, 2, 5)
        return pixels.reshape(T, -1, rows * p, cols * p)

    def encode(self, model, pixel_values, grid_thw_patches):
        # RADIO attends within each tubelet alone, so the tubelets of every video of one frame size go through
        # the tower as one batch; each video's rows come back in (tubelet, row, col) order of merged tokens.
        grids = grid_thw_patches.tolist()
        videos = pixel_values.split([T * rows * cols for T, rows, cols in grids])
        embeds: list[torch.Tensor | None] = [None] * len(grids)
        for size in dict.fromkeys((rows, cols) for _, rows, cols in grids):
            members = [i for i, grid in enumerate(grids) if tuple(grid[1:]) == size]
            tubelets = torch.cat([self._tubelets(videos[i], grids[i]) for i in members])
            out = model.get_video_features(tubelets[None], return_dict=True).pooler_output[0]
            tokens = [grids[i][0] * (size[0] // self.merge_size) * (size[1] // self.merge_size) for i in members]
            for i, rows_of_video in zip(members, out.split(tokens)):
                embeds[i] = rows_of_video
        return [VideoFeatures(video, []) for video in embeds]

    def language_positions(self, positions):
        return positions[0]  # (B, L): the token index; nothing rotary to feed

    def text_model(self, model):
        return model.language_model.model

    def lm_head(self, model):
        return model.language_model.lm_head

    def vision_modules(self, model):
        return [module for module in (model.vision_model, model.vision_final_layernorm, model.multi_modal_projector)
                if module is not None]


def video_geometry(config) -> tuple[int, int, int]:
    """(patch side in pixels, spatial merge, frames per temporal group) of a model config's video tokens: one
    LLM token covers (patch * merge)^2 pixels of that many frames."""
    if config.model_type == NemotronOmni.name:
        return config.vision_config.patch_size, round(1 / config.downsample_ratio), config.video_temporal_patch_size
    vision = config.vision_config
    return vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size


def family_for(model) -> Family:
    model_type = model.config.model_type
    vision = model.config.vision_config
    if model_type == NemotronOmni.name:
        patch, merge, temporal = video_geometry(model.config)
        return NemotronOmni(temporal, patch, merge)
    if model_type in ("qwen3_vl", "qwen3_vl_moe"):  # the MoE changes the MLPs only
        return Qwen3VL(vision.temporal_patch_size)
    if model_type in ("qwen3_5", "qwen3_5_moe"):
        return Qwen35(vision.temporal_patch_size)
    if model_type == "qwen2_5_vl":
        return Qwen25VL(vision.temporal_patch_size, vision.tokens_per_second)
    raise ValueError(f"model type {model_type!r} is not a supported family")
