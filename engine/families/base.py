"""What every model family answers: the data the engine keeps between the processor, the towers and the
language model (`VideoFeatures`, `VideoInputs`, `AudioInputs`), and `Family`, the questions the rest of the
engine asks a family (prompt markers, positions, the processor's output, the towers' outputs, where the
language model sits in the checkpoint). The families themselves are in qwen.py and nemotron.py; the
registry picks one for a loaded model.

Everything here works on one unpruned prompt; EVS (pruning/) then selects columns from it.
"""

from dataclasses import dataclass, replace

import torch
from torch import nn

import pruning


@dataclass
class VideoFeatures:
    """Vision-tower output for one medium (a video, or a still image: one temporal group), rows in (t, h, w)
    raster order of LLM tokens, and the audio tower's for a video's soundtrack when it was heard.

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

    def carried(self, encoded: torch.Tensor) -> "VideoFeatures":
        """Every unit's features from the encoded units' rows (these features, in raster order): a unit the vision
        tower did not encode takes the last encoded unit's at its place (pruning.carried_rows). encoded: (T, h*w)
        bool, group 0 all True."""
        if bool(encoded.all()):
            return self
        rows = pruning.carried_rows(encoded.cpu()).to(self.embeds.device)
        return VideoFeatures(self.embeds[rows], [level[rows] for level in self.deepstack], self.audio)

    @staticmethod
    def joined(parts: list["VideoFeatures"]) -> "VideoFeatures":
        """The features of several media, in order: what the prompt's visual and audio tokens take, in order."""
        audio = [part.audio for part in parts if part.audio is not None]
        return VideoFeatures(
            torch.cat([part.embeds for part in parts]),
            [torch.cat(levels) for levels in zip(*(part.deepstack for part in parts))],
            torch.cat(audio) if audio else None,
        )


@dataclass
class VideoInputs:
    """The HF processor's output for one medium (a video, or a still image: is_image), in the layout the engine
    keeps.

    pixel_values: (P, C) float patches, one row per vision patch, in (t, row, col) order. grid_thw_patches: (3,)
    long patch grid (groups, rows, cols; an image has one group). grid_thw: (T, h, w) in LLM tokens (after the
    spatial merge). second_per_group: seconds of video per temporal group (Qwen2.5-VL's temporal scale; 0.0
    where unused).
    """

    pixel_values: torch.Tensor
    grid_thw_patches: torch.Tensor
    grid_thw: tuple[int, int, int]
    second_per_group: float
    is_image: bool = False

    @property
    def tokens(self) -> int:
        """LLM tokens of the medium: T*h*w."""
        T, h, w = self.grid_thw
        return T * h * w


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
    # Whether the vision tower can encode part of a temporal group, the rest left out (skip_still_patches).
    skips_still_patches = True
    think_end: str | None = None  # the marker that ends the thinking; None: no enable_thinking switch
    writes_empty_system = False  # whether the chat template writes a system turn when there is no system prompt

    def __init__(self, temporal_patch: int):
        self.temporal_patch = temporal_patch

    def video_placeholder(self) -> str:
        """Text that the HF processor expands into the video's tokens."""
        raise NotImplementedError

    def image_placeholder(self) -> str:
        """Text that the HF processor expands into a still image's tokens (the chat template's image item)."""
        return "<|vision_start|><|image_pad|><|vision_end|>"

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

    def live_group_text(self, group: int, times_s: list[float], first: bool) -> tuple[str, str]:
        """(text before its video tokens, text after them) of one temporal group of a live stream, as the HF
        processor writes that group of a video: group is its index from the stream's start, times_s its frames'
        capture times in seconds from the stream's first frame, first whether it opens the window (written as
        a video's first group; engine/live/layout.py; the live tests compare the result with the processor's
        prompt for the same frames)."""
        raise NotImplementedError

    def video_runs(self, grid_thw: tuple[int, int, int]) -> list[tuple[int, int]]:
        """(first temporal group, groups in the run) for each contiguous run of video tokens."""
        raise NotImplementedError

    def temporal_offsets(self, num_groups: int, second_per_group: float) -> torch.Tensor:
        """(num_groups,) long: temporal MRoPE offset of each group within its run."""
        raise NotImplementedError

    def next_text_position(self, run_start: int, run_max: int, grid_thw: tuple[int, int, int]) -> int:
        """Where text after a run of video tokens starts."""
        raise NotImplementedError

    def full_positions(self, is_visual: torch.Tensor, media: list["VideoInputs"]) -> torch.Tensor:
        """MRoPE positions (3, L) of an unpruned prompt holding several media.

        is_visual: (L,) bool marks every medium's T*h*w tokens, the media in prompt order; media: each one's
        grid_thw (T, h, w) in LLM tokens and second_per_group (Qwen2.5's temporal scale). A still image is one
        temporal group. Text between media continues from the position after the medium before it.
        """
        length = is_visual.numel()
        positions = torch.empty(3, length, dtype=torch.long)
        visual_idx = torch.nonzero(is_visual).flatten().tolist()
        if len(visual_idx) != sum(medium.tokens for medium in media):
            raise ValueError(
                f"prompt holds {len(visual_idx)} media tokens, the grids need {sum(medium.tokens for medium in media)}"
            )
        cursor, text_pos, consumed = 0, 0, 0
        for medium in media:
            T, h, w = medium.grid_thw
            tokens_per_group = h * w
            rows = torch.arange(h).repeat_interleave(w)
            cols = torch.arange(w).repeat(h)
            for _first_group, num_groups in self.video_runs(medium.grid_thw):
                run_len = num_groups * tokens_per_group
                run_begin = visual_idx[consumed]
                if visual_idx[consumed + run_len - 1] != run_begin + run_len - 1:
                    raise ValueError("media tokens of one run are not contiguous in the prompt")
                positions[:, cursor:run_begin] = torch.arange(run_begin - cursor) + text_pos
                start = text_pos + run_begin - cursor
                t_off = self.temporal_offsets(num_groups, medium.second_per_group)
                run = positions[:, run_begin : run_begin + run_len]
                run[0] = (t_off.repeat_interleave(tokens_per_group)) + start
                run[1] = rows.repeat(num_groups) + start
                run[2] = cols.repeat(num_groups) + start
                text_pos = self.next_text_position(start, int(run.max()), medium.grid_thw)
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

    def encode_planned(
        self, model, media: list[VideoInputs], encoded: list[torch.Tensor | None]
    ) -> list[VideoFeatures]:
        """One vision forward over the units `encoded` marks, (T, h*w) bool per medium (None: all of them); each
        medium's features of those units, (n, D) rows in raster order (VideoFeatures.carried gives every token its
        features from them). Whole groups left out leave the forward by the group, which every family allows (each
        encodes a temporal group alone, so the rest is what it would be with them); a group encoded in part needs
        `encode_units`."""
        whole = [mask is None or bool((mask.all(dim=1) | ~mask.any(dim=1)).all()) for mask in encoded]
        if all(whole):
            return self.encode_media(model, [self._groups(m, e) for m, e in zip(media, encoded)])
        return self.encode_units(model, media, encoded)

    @staticmethod
    def _groups(medium: VideoInputs, encoded: torch.Tensor | None) -> VideoInputs:
        """The medium cut to the temporal groups `encoded` (T, h*w) bool holds any unit of (None: all of them)."""
        if encoded is None or bool(encoded.all()):
            return medium
        groups = encoded.any(dim=1)
        rows = medium.pixel_values.reshape(len(groups), -1, medium.pixel_values.shape[-1])[groups]
        kept = int(groups.sum())
        return replace(
            medium,
            pixel_values=rows.reshape(-1, medium.pixel_values.shape[-1]),
            grid_thw_patches=torch.tensor([kept, *medium.grid_thw_patches[1:].tolist()]),
            grid_thw=(kept, *medium.grid_thw[1:]),
        )

    def encode_units(self, model, media: list[VideoInputs], encoded: list[torch.Tensor | None]) -> list[VideoFeatures]:
        """One vision forward over only the units `encoded` marks ((T, h*w) bool per medium, None: all), each with
        its own position in its group, as a shorter sequence; each medium's features of its encoded units, in
        raster order. A family whose tower cannot (skips_still_patches False) raises NotImplementedError."""
        raise NotImplementedError(f"{self.name} encodes whole temporal groups only")

    def unit_pixels(self, medium: VideoInputs) -> torch.Tensor:
        """The medium's pixel values as merge units, (T, U, S, C, F, P): U = h*w units per group in raster order, S
        their merge^2 patches, C channels, F frames, P pixels of a patch (pruning/still.py). The Qwen processors
        write each unit's patches as consecutive rows, each row (C, F, p, p)."""
        T, h, w = medium.grid_thw
        rows, values = medium.pixel_values.shape
        patches = rows // (T * h * w)
        return medium.pixel_values.reshape(
            T, h * w, patches, 3, self.temporal_patch, values // (3 * self.temporal_patch)
        )

    def pixel_levels(self, processor) -> torch.Tensor:
        """(C,): the 0-255 intensity levels one unit of the video processor's pixel values is, per channel (its
        rescale then its normalization: level = value * std / rescale factor)."""
        video = processor.video_processor
        std = video.image_std if getattr(video, "do_normalize", False) else (1.0, 1.0, 1.0)
        std = [std] * 3 if isinstance(std, (int, float)) else list(std)
        return torch.tensor(std, dtype=torch.float32) / float(video.rescale_factor)

    def encode_media(self, model, media: list[VideoInputs]) -> list[VideoFeatures]:
        """One vision forward over several media, videos and still images alike (the Qwen towers take an image
        as a one-group video, whose patches have the same layout); one VideoFeatures per medium, in order."""
        return self.encode(
            model,
            torch.cat([m.pixel_values for m in media]).to(model.device),
            torch.stack([m.grid_thw_patches for m in media]).to(model.device),
        )

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

    def visual_token_ids(self, config) -> list[int]:
        """The token ids that stand for one token of a medium: a video's, and a still image's."""
        return [config.video_token_id, config.image_token_id]

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

    def image_inputs(self, inputs, config) -> VideoInputs:
        """The processor output's still image pixels and grid (one image), as a one-group medium."""
        grid_patches = inputs["image_grid_thw"][0]
        merge = config.vision_config.spatial_merge_size
        grid_thw = (int(grid_patches[0]), int(grid_patches[1]) // merge, int(grid_patches[2]) // merge)
        return VideoInputs(inputs["pixel_values"], grid_patches, grid_thw, 0.0, is_image=True)

    def token_side(self, processor) -> int:
        """The side in pixels of one language-model token of a picture (patch * merge): the smallest picture or
        live frame side the model reads (the engine refuses smaller ones, engine/reading/media.py's too_small)."""
        image_processor = processor.image_processor
        return image_processor.patch_size * image_processor.merge_size

    def image_processor_kwargs(self, processor, max_pixels: int) -> dict:
        """Call kwargs that size a still image as one sampled frame: at most max_pixels (height*width), never
        upscaled below one token. ValueError below one token."""
        image_processor = processor.image_processor
        factor = image_processor.patch_size * image_processor.merge_size
        if max_pixels < factor * factor:
            raise ValueError(f"max_pixels_per_frame={max_pixels} is below one token ({factor}x{factor})")
        return {"size": {"shortest_edge": factor * factor, "longest_edge": max_pixels}}

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
