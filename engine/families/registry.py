"""The family of a loaded model, by its config's model type."""

from .base import Family
from .nemotron import NemotronOmni
from .qwen import Qwen3VL, Qwen25VL, Qwen35


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
