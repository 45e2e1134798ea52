"""Timing the vision tower outside the engine, on the prompts the engine would build (shared by
`python -m bench` and bench/gpu_check.py)."""

import dataclasses
import time
from pathlib import Path

import torch

from engine import Engine, FrameSampling
from engine.prompt.unpruned import UnprunedPrompt, unpruned_prompt
from engine.reading.video import read_video


def prepared_prompts(engine: Engine, clips: list[Path], sampling: FrameSampling, question: str) -> list[UnprunedPrompt]:
    """Each clip's frames sampled and run through the HF processor as the engine does, no size limits."""
    loaded = engine.loaded
    temporal_patch = loaded.model.config.vision_config.temporal_patch_size
    prompts = []
    for clip in clips:
        video = read_video(
            clip, sampling, max_seconds=1e9, max_bytes=1 << 60, timeout_s=600, temporal_patch=temporal_patch
        )
        prompts.append(
            unpruned_prompt(
                loaded, engine.family, video, question, [], engine.system_prompt, sampling.max_pixels_per_frame
            )
        )
    return prompts


def vit_forward_s(engine: Engine, prompts: list[UnprunedPrompt]) -> float:
    """Seconds of one vision-tower forward over every prompt's patches together (a prompt listed twice
    counts twice), waiting for the GPU to finish."""
    loaded = engine.loaded
    device = loaded.model.device
    media = [
        dataclasses.replace(
            medium, pixel_values=medium.pixel_values.to(device), grid_thw_patches=medium.grid_thw_patches.to(device)
        )
        for prompt in prompts
        for medium in prompt.media
    ]
    with torch.inference_mode():
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the copies above are not part of the forward
        start = time.perf_counter()
        engine.family.encode_media(loaded.model, media)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start
