"""Engine-wide settings and per-request generation settings."""

import os
from dataclasses import dataclass, field
from pathlib import Path


def default_cache_dir() -> Path:
    """Where the offline tiny models are saved once and loaded from afterwards (EVS_CACHE_DIR overrides)."""
    return Path(os.environ.get("EVS_CACHE_DIR") or Path.home() / ".cache" / "evs-video-chat")


@dataclass(frozen=True)
class SamplingParams:
    """How frames are taken from an upload; part of the feature-cache key.

    fps: frames sampled per second of video. max_frames: cap on sampled frames (rounded down to a
    multiple of the temporal patch, at least 2). max_pixels_per_frame: cap on height*width of each frame
    after resizing (the HF processor aligns sides to patch*merge).
    """

    fps: float = 2.0
    max_frames: int = 32
    max_pixels_per_frame: int = 224 * 224


@dataclass
class EngineConfig:
    model: str = "tiny-random"
    device: str = "auto"  # auto | cuda | cpu
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_video_seconds: float = 600.0
    max_file_bytes: int = 200 * 1024 * 1024
    decode_timeout_s: float = 60.0
    # Patches (pre-merge rows) in one ViT forward before the batch is split; None picks by device:
    # 65536 on a GPU (bounds activation memory), 4096 on a CPU, where larger batches overflow the caches
    # and turn the elementwise ops memory-bound (2 cores, 8 videos of 1568 patches: one forward 1.18x
    # eight separate ones, forwards of 2 videos 0.97x; `python bench/serving.py`).
    vit_token_budget: int | None = None
    feature_cache_bytes: int = 1 << 30
    prefix_cache_bytes: int = 1 << 30
    decoded_video_cache_bytes: int = 256 << 20  # sampled frames of recent uploads (follow-ups skip decoding)
    max_queue: int = 64  # requests waiting for admission before submit answers "busy"
    max_running: int = 16  # requests decoding together
    prefill_token_budget: int = 2048  # prompt tokens prefilled per iteration between decode steps (>= 1 prompt)
    cache_dir: Path = field(default_factory=default_cache_dir)
    system_prompt: str = "You are a helpful assistant."


@dataclass(frozen=True)
class GenerationParams:
    """Per-request settings. pruning_rate q in [0, 1): the fraction of video tokens EVS drops."""

    pruning_rate: float = 0.7
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    ignore_eos: bool = False  # benchmarks decode a fixed number of tokens
    seed: int = 0
    sampling: SamplingParams | None = None  # None: the engine's default
