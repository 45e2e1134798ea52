"""Real checkpoints' exact architectures with random weights, built without the Hub: `random:<checkpoint>`.

    random:Qwen/Qwen3-VL-4B-Instruct     one of the checkpoints stored in engine/checkpoints/specs/
    random:/path/to/spec.json            any spec file of the same shape

No machine of this project can download a checkpoint, the GPU machines it borrows included, so real
scale is reached this way. Stored: Qwen2.5-VL 3B and 7B; Qwen3-VL 2B, 4B, 8B and 30B-A3B; Qwen3.5 0.8B,
4B, 9B, 27B and 35B-A3B (the Instruct/post-trained releases); Nemotron-3-Nano-Omni-30B-A3B-Reasoning. Each spec
holds the checkpoint's published config.json, its image processor settings and (all but Qwen2.5-VL) its video
processor settings, the published parameter count (the Hub's safetensors total) and, for Qwen3.5, the
parameters the checkpoint holds that transformers does not build (its multi-token-prediction head:
"unbuilt_parameters"). The Nemotron spec is reconstructed from public quotes of its config (its
"config_note" says from where) and gives the Hub's rounded count only ("published_parameters_rounded"). The
model is built from that config directly on the target device in the target dtype (seconds on a GPU; no
8 GB file). The tokenizer is the tiny models' byte-level one; the embedding keeps the real vocabulary
size, and the config's special-token ids are pointed at that tokenizer's ids. Shapes, memory and timings
are real; the words are not.
"""

import json
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    GenerationConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    ProcessorMixin,
    Qwen2_5_VLProcessor,
    Qwen2VLImageProcessor,
    Qwen2VLVideoProcessor,
    Qwen3VLProcessor,
    Qwen3VLVideoProcessor,
)

from .tiny_nemotron import media_token_ids, omni_processor
from .tokenizer import CHAT_TEMPLATE, EXTRA_SPECIAL_TOKENS, build_tokenizer, special_token_ids

RANDOM_PREFIX = "random:"
CHECKPOINTS_DIR = Path(__file__).resolve().parent / "specs"
# Keys of the stored processor files that name classes rather than settings.
_CLASS_KEYS = ("image_processor_type", "video_processor_type", "processor_class")
# The families whose checkpoints ship Qwen3-VL's processor (patch 16, merge 2) and a video processor file.
QWEN3_VL_PROCESSOR_FAMILIES = ("qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe")
# What each key of a spec's "unbuilt_parameters" is, in words.
UNBUILT_PARTS = {"mtp": "multi-token-prediction head"}
# Released configs written for the checkpoint's own remote code, under a model_type transformers does not
# register: the transformers type that reads them (its config class maps their legacy field names itself).
RELEASED_MODEL_TYPES = {"NemotronH_Nano_Omni_Reasoning_V3": "nemotron_h_omni"}


class UnknownCheckpoint(LookupError):
    """`random:X` names neither a stored checkpoint nor a readable spec file."""


def is_random(name: str) -> bool:
    return name.startswith(RANDOM_PREFIX)


def stored_checkpoints() -> list[str]:
    """Hub ids of the checkpoints whose specs ship in engine/checkpoints/specs/."""
    return sorted(json.loads(path.read_text())["checkpoint"] for path in CHECKPOINTS_DIR.glob("*.json"))


def checkpoint_spec(name: str) -> dict:
    """The spec behind `random:<checkpoint>`: {"checkpoint", "published_parameters" (Nemotron:
    "published_parameters_rounded" and a "config_note"), "config", "preprocessor", "video_preprocessor" (all but
    Qwen2.5-VL), "audio_preprocessor" (Nemotron), "unbuilt_parameters" (Qwen3.5: {"mtp": N}),
    "processor_note" (where the checkpoint's own processor files were not found and Qwen3-VL's are stored)}."""
    target = name.removeprefix(RANDOM_PREFIX)
    path = CHECKPOINTS_DIR / f"{target.replace('/', '--')}.json"
    if not path.is_file():
        path = Path(target)
    try:
        spec = json.loads(path.read_text())
    except (OSError, ValueError):
        raise UnknownCheckpoint(
            f"{name!r} is neither a stored checkpoint ({', '.join(stored_checkpoints())}) nor a readable spec file"
        ) from None
    if not (
        isinstance(spec, dict)
        and isinstance(spec.get("config"), dict)
        and "model_type" in spec["config"]
        and isinstance(spec.get("preprocessor"), dict)
    ):
        raise UnknownCheckpoint(f'{name!r}: a spec needs a "config" with a model_type and a "preprocessor"')
    return spec


def spec_family(spec: dict) -> str:
    """The transformers model_type that builds the spec's checkpoint."""
    model_type = spec["config"]["model_type"]
    return RELEASED_MODEL_TYPES.get(model_type, model_type)


def spec_config(spec: dict, tokenizer: PreTrainedTokenizerFast | None = None) -> PretrainedConfig:
    """The checkpoint's config; with `tokenizer`, its special-token ids point at that tokenizer's."""
    values = dict(spec["config"])
    del values["model_type"]
    family = spec_family(spec)
    if "model_type" in values.get("sound_config", {}):
        # Nemotron-H Omni's released sound_config names its encoder "parakeet", a type transformers does not
        # register; the audio sub-config's own class (parakeet_encoder) reads the rest of it.
        values["sound_config"] = {key: value for key, value in values["sound_config"].items() if key != "model_type"}
    config = AutoConfig.for_model(family, **values)
    if tokenizer is not None:
        token_ids = media_token_ids(tokenizer) if family == "nemotron_h_omni" else special_token_ids(tokenizer)
        for key, token_id in token_ids.items():
            setattr(config, key, token_id)
        config.text_config.pad_token_id = tokenizer.pad_token_id
        config.text_config.bos_token_id = None
        config.text_config.eos_token_id = tokenizer.eos_token_id
    return config


def _article(count: int) -> str:
    """ "an" before a count read out starting with a vowel sound (8..., 11..., 18... of a comma group)."""
    lead = f"{count:,}".split(",")[0]
    return "an" if lead.startswith("8") or lead in ("11", "18") else "a"


def unbuilt_note(spec: dict) -> str | None:
    """One sentence on the parameters the checkpoint holds that transformers does not build, or None."""
    unbuilt = spec.get("unbuilt_parameters") or {}
    if not unbuilt:
        return None
    parts = " and ".join(
        f"{_article(count)} {count:,}-parameter {UNBUILT_PARTS.get(part, part)}" for part, count in unbuilt.items()
    )
    note = (
        f"the checkpoint's {spec['published_parameters']:,} parameters also hold {parts} that transformers "
        "does not build"
    )
    index_bytes = spec.get("index_total_size_bytes")
    if index_bytes is None:
        return note
    # The Hub's model.safetensors.index.json gives bytes; halving them, as for bf16, counts every float32
    # parameter twice, so figures read from it run higher than the headers' counts.
    extra = index_bytes // 2 - spec["published_parameters"]
    return (
        f"{note} (halving the Hub index's total_size gives {index_bytes // 2:,}, and so "
        f"{sum(unbuilt.values()) + extra:,} for what is not built, as it counts the {extra:,} float32 "
        "parameters twice)"
    )


def _settings(stored: dict) -> dict:
    return {key: value for key, value in stored.items() if key not in _CLASS_KEYS}


def spec_processor(spec: dict, family: str, tokenizer: PreTrainedTokenizerFast) -> ProcessorMixin:
    """The checkpoint's own image and video processor settings around the byte-level tokenizer: Qwen3-VL's
    processor for Qwen3-VL and Qwen3.5 (dense and MoE), Qwen2.5-VL's for Qwen2.5-VL, Nemotron-H Omni's (with its
    audio feature extractor) for Nemotron-H Omni."""
    if family == "nemotron_h_omni":
        return omni_processor(
            tokenizer,
            video_settings=_settings(spec["video_preprocessor"]),
            image_settings=_settings(spec["preprocessor"]),
            audio_settings=spec["audio_preprocessor"],
        )
    image = Qwen2VLImageProcessor(**_settings(spec["preprocessor"]))
    if family in QWEN3_VL_PROCESSOR_FAMILIES:
        video = Qwen3VLVideoProcessor(**_settings(spec["video_preprocessor"]))
        return Qwen3VLProcessor(
            image_processor=image, video_processor=video, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE
        )
    # Qwen2.5-VL checkpoints ship no video processor file: their video processor reads the image settings.
    video = Qwen2VLVideoProcessor(**_settings(spec["preprocessor"]))
    return Qwen2_5_VLProcessor(
        image_processor=image, video_processor=video, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE
    )


def build_random_model(
    spec: dict, model_class: type[PreTrainedModel], device: torch.device, dtype: torch.dtype, attn_implementation: str
) -> tuple[PreTrainedModel, ProcessorMixin]:
    """The spec's architecture with random weights made on `device` in `dtype`, and its processor."""
    tokenizer = build_tokenizer(EXTRA_SPECIAL_TOKENS.get(spec_family(spec), ()))
    config = spec_config(spec, tokenizer)
    torch.manual_seed(0)
    with torch.device(device):
        model = model_class._from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    model.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.eos_token_id, tokenizer.pad_token_id], pad_token_id=tokenizer.pad_token_id
    )
    return model, spec_processor(spec, config.model_type, tokenizer)
