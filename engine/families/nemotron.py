"""Nemotron-H Omni: a RADIO vision tower over two-frame tubelets, a Parakeet audio tower, and a NemotronH
language model of Mamba-2, attention and MoE layers, with no rotary positions."""

import copy

import torch

from .base import AudioInputs, Family, VideoFeatures, VideoInputs


class NemotronOmni(Family):
    """Nemotron-H Omni (transformers' `nemotron_h_omni`): a RADIO vision tower that packs two frames per
    tubelet, a pixel-shuffle projector, and a NemotronH language model of Mamba-2, attention and MoE layers
    (engine/state/lm_state.py keeps its Mamba layers' conv and SSM state, like Gated DeltaNet's).

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
    # RADIO runs each tubelet as a whole image (cls and register tokens, then every patch): no part of one is
    # encoded alone here, so skip_still_patches does nothing (exact repeats are still not encoded).
    skips_still_patches = False
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

    def image_placeholder(self):
        # The processor expands it into `<img>` + one `<image>` per token + `</img>`, as it writes a tubelet.
        return "<image>\n"

    def live_group_text(self, group, times_s, first):
        # The processor labels each tubelet with its frames' numbers and times and joins tubelets by newlines. It
        # writes a frame's time as its index times a whole number of milliseconds per frame of the file; a live
        # stream has no file rate, so the capture time is written (the same at 8 fps, and at any rate whose frame
        # lasts a whole number of milliseconds).
        labels = [
            f"{'Frame' if offset == 0 else 'frame'} {group * self.temporal_patch + offset + 1} sampled at "
            f"{time_s:.2f} seconds"
            for offset, time_s in enumerate(times_s)
        ]
        return ("" if first else "\n") + " and ".join(labels) + ": <img>", self._VIDEO_END

    def video_runs(self, grid_thw):
        return [(t, 1) for t in range(grid_thw[0])]  # each tubelet its own `<img>...</img>`

    def full_positions(self, is_visual, media):
        # Each token's index in the unpruned prompt, on all three rows (see the class docstring: only row 0 of
        # the pruned layout reaches the model).
        return torch.arange(is_visual.numel()).expand(3, -1).clone()

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

    def visual_token_ids(self, config):
        return [config.image_token_id]  # images and tubelets alike

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

    def image_inputs(self, inputs, config):
        # pixel_values: (rows * cols, C * p * p) patch rows of one image, in row-major order; image_grid_hw its
        # (rows, cols) in patches, any size the budget allows (image_processor_kwargs).
        rows, cols = (int(side) for side in inputs["image_grid_hw"][0])
        grid_thw = (1, rows // self.merge_size, cols // self.merge_size)
        return VideoInputs(inputs["pixel_values"], torch.tensor([1, rows, cols]), grid_thw, 0.0, is_image=True)

    def token_side(self, processor) -> int:
        return self.patch_size * self.merge_size

    def image_processor_kwargs(self, processor, max_pixels):
        # The image processor resizes each image (up or down) into [min_num_patches, max_num_patches] patches
        # (the checkpoints: 1,024 to 13,312); the cap lowers both ends, never raises them.
        factor = self.patch_size * self.merge_size
        if max_pixels < factor * factor:
            raise ValueError(f"max_pixels_per_frame={max_pixels} is below one token ({factor}x{factor})")
        image_processor = processor.image_processor
        budget = max_pixels // self.patch_size**2
        return {
            "min_num_patches": min(image_processor.min_num_patches, budget),
            "max_num_patches": min(image_processor.max_num_patches or budget, budget),
        }

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

    def encode_media(self, model, media):
        # An image's patch rows hold one frame (C*p*p), a tubelet's two: images go through the tower apart from
        # the videos, all of them in one call (RADIO takes images of any size in one packed sequence).
        videos = [i for i, medium in enumerate(media) if not medium.is_image]
        images = [i for i, medium in enumerate(media) if medium.is_image]
        out: list[VideoFeatures | None] = [None] * len(media)
        if videos:
            encoded = super().encode_media(model, [media[i] for i in videos])
            for i, features in zip(videos, encoded):
                out[i] = features
        if images:
            pixels = torch.cat([media[i].pixel_values for i in images]).to(model.device)
            grids = torch.stack([media[i].grid_thw_patches[1:] for i in images]).to(model.device)
            for i, embeds in zip(images, model.get_image_features(pixels, grids, return_dict=True).pooler_output):
                out[i] = VideoFeatures(embeds, [])
        return out

    def language_positions(self, positions):
        return positions[0]  # (B, L): the token index; nothing rotary to feed

    def text_model(self, model):
        return model.language_model.model

    def lm_head(self, model):
        return model.language_model.lm_head

    def vision_modules(self, model):
        return [
            module
            for module in (model.vision_model, model.vision_final_layernorm, model.multi_modal_projector)
            if module is not None
        ]
