"""Load a vision-language model (Qwen-VL or Nemotron-H Omni) and its processor by name: a Hub id, a local
folder, or a tiny model.

Tiny models are built into the cache folder first and then read through the very same
`from_pretrained` path as a real checkpoint.
"""

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub.errors import HfHubHTTPError, HFValidationError
from transformers import (
    AutoConfig,
    AutoProcessor,
    NemotronH_Omni_Reasoning_V3,
    PreTrainedModel,
    ProcessorMixin,
    Qwen2_5_VLForConditionalGeneration,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeForConditionalGeneration,
    Qwen3VLForConditionalGeneration,
    Qwen3VLMoeForConditionalGeneration,
)

from engine.checkpoints.random_weights import (
    UnknownCheckpoint,
    build_random_model,
    checkpoint_spec,
    is_random,
    spec_config,
    unbuilt_note,
)
from engine.checkpoints.tiny import MODEL_NOTES_FILE, TINY_MODELS, TRAINED_MODELS, ensure_tiny_model
from engine.config import default_cache_dir
from engine.families.registry import family_for
from engine.loading import kernels

from .device import choose_device, probe_host

log = logging.getLogger(__name__)

MODEL_CLASSES = {
    "qwen3_vl": Qwen3VLForConditionalGeneration,
    "qwen2_5_vl": Qwen2_5_VLForConditionalGeneration,
    "qwen3_vl_moe": Qwen3VLMoeForConditionalGeneration,
    "qwen3_5": Qwen3_5ForConditionalGeneration,
    "qwen3_5_moe": Qwen3_5MoeForConditionalGeneration,
    "nemotron_h_omni": NemotronH_Omni_Reasoning_V3,
}
# Families whose vision tower attends within each image-sized unit as a dense batch (RADIO: one tubelet a
# row), so there are no varlen segments for kernels.TORCH_VARLEN to pack: their tower keeps sdpa.
DENSE_VISION_TOWERS = {"nemotron_h_omni"}

# What the Hub and the filesystem raise when a checkpoint is missing, private, offline or not cached.
_UNAVAILABLE_ERRORS = (OSError, HfHubHTTPError, HFValidationError)


class ModelUnavailable(RuntimeError):
    """The checkpoint could not be found or fetched (missing, offline, not cached, no access)."""


class UnsupportedModel(ValueError):
    """The checkpoint exists but is not a model family this app can run."""


@dataclass
class LoadedModel:
    name: str  # what the user asked for: "tiny-random", "Qwen/Qwen3-VL-4B-Instruct", "random:<id>", a local path
    family: str  # the config's model_type: "qwen3_vl", "qwen2_5_vl", "qwen3_5", "nemotron_h_omni", ...
    model: PreTrainedModel  # the *ForConditionalGeneration, eval mode, on `device`
    processor: ProcessorMixin
    device: torch.device
    dtype: torch.dtype
    # The vision tower's kernel: "flash_attention_2" | kernels.TORCH_VARLEN | "sdpa"; the language model
    # runs the same, except sdpa beside TORCH_VARLEN (see _pick_attention).
    attn_implementation: str
    is_tiny: bool
    random_weights: bool  # tiny-random models and random:<checkpoint>: the words mean nothing
    # The checkpoint's own system prompt when it ships one (tiny-trained was trained without any: ""),
    # else None and the engine's default; `about`: what the model knows, for the app's banner.
    system_prompt: str | None = None
    about: str | None = None
    # For live sessions (engine/live/window.py): the seconds of stream the checkpoint learned to read (the offline
    # models': 8), its vision tower's noise floor (the dissimilarity of a still camera's sensor and codec noise),
    # and what it can be asked live, for the app; None where the checkpoint does not say.
    live_span_s: float | None = None
    live_noise_floor: float | None = None
    live_about: str | None = None
    # The words a model trained here answers with (tiny-trained: colours, shapes, ...), so that the app can mark an
    # answer outside them as the guess it is; None where the checkpoint does not say (a real model answers anything).
    answers: tuple[str, ...] | None = None
    # The checkpoint's `video_pruning_rate` (config.json), the rate it was published to serve at; None if unsaid.
    video_pruning_rate: float | None = None
    # A hybrid model's linear-attention kernels (kernels.linear_attention_kernels); None without such layers.
    linear_attention: str | None = None


def resolve_device(device: str) -> torch.device:
    """ "auto" -> cuda when torch can use a GPU, cpu when there is none; engine.loading.device.DeviceUnavailable
    (one sentence) for a GPU that is there but unusable, or for "cuda" on a machine without one."""
    return choose_device(device, probe_host())


def _flash_attn_importable() -> bool:
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True


def _pick_attention(device: torch.device, dtype: torch.dtype) -> str:
    """The vision tower's attention kernel for a model in `dtype` on `device`, logged as "attention: ...".

    - "flash_attention_2", both towers: CUDA, fp16/bf16, sm80 or newer, flash_attn importable.
    - kernels.TORCH_VARLEN on that same hardware without flash_attn: torch's built-in varlen
      FlashAttention runs the vision tower (one call per layer over every frame group of every video),
      and the language model runs sdpa (its padded masks and KV cache stay as they are; see
      engine.loading.kernels). load_model builds with sdpa and then switches the vision tower.
    - "sdpa", both towers, anywhere else: CPU, float32 (tiny models), GPUs older than sm80, or a torch
      without varlen_attn. Both flash kernels need fp16/bf16 and sm80+, so the rule is shared.
    """
    if device.type != "cuda":
        reason = f"device is {device.type}"
    elif dtype not in (torch.float16, torch.bfloat16):
        reason = f"flash attention needs fp16/bf16, dtype is {dtype}"
    elif torch.cuda.get_device_capability(device) < (8, 0):
        reason = "flash attention needs an Ampere (sm80) or newer GPU"
    elif _flash_attn_importable():
        log.info("attention: flash_attention_2 (CUDA, %s, flash_attn importable)", dtype)
        return "flash_attention_2"
    elif kernels.torch_varlen_available():
        log.info(
            "attention: %s for the vision tower, sdpa for the language model (CUDA, %s, flash_attn is not installed)",
            kernels.TORCH_VARLEN,
            dtype,
        )
        return kernels.TORCH_VARLEN
    else:
        reason = "flash_attn is not installed and this torch has no varlen_attn"
    log.info("attention: sdpa (%s)", reason)
    return "sdpa"


def _read_config(name: str, source: str):
    try:
        if is_random(name):
            return spec_config(checkpoint_spec(name))
        return AutoConfig.from_pretrained(source)
    except UnknownCheckpoint as exc:
        raise ModelUnavailable(str(exc)) from None
    except _UNAVAILABLE_ERRORS as exc:
        raise ModelUnavailable(f"Model {name!r} is unavailable: {type(exc).__name__}: {exc}") from exc


def _model_class(name: str, config) -> type[PreTrainedModel]:
    if config.model_type not in MODEL_CLASSES:
        raise UnsupportedModel(
            f"Model {name!r} has model_type {config.model_type!r}; only {sorted(MODEL_CLASSES)} checkpoints "
            "are supported."
        )
    return MODEL_CLASSES[config.model_type]


def _source(name: str, cache_dir: Path | None) -> str:
    """Where from_pretrained reads `name`: a shipped trained model's or the built tiny model's folder,
    else the name itself."""
    if name in TRAINED_MODELS:
        return str(TRAINED_MODELS[name])
    return str(ensure_tiny_model(name, cache_dir or default_cache_dir())) if name in TINY_MODELS else name


def is_tiny_model(name: str) -> bool:
    return name in TINY_MODELS or name in TRAINED_MODELS


def _model_notes(source: str) -> dict:
    """{"system_prompt": ..., "about": ..., "live_about": ..., "live_span_s": ..., "live_noise_floor": ...,
    "answers": (...)} from a local model folder's notes file, the text fields, positive numbers and list of words it
    holds and nothing else; {} when it has none or it is not a JSON object."""
    try:
        notes = json.loads((Path(source) / MODEL_NOTES_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(notes, dict):
        return {}
    texts = {key: notes[key] for key in ("system_prompt", "about", "live_about") if isinstance(notes.get(key), str)}
    numbers = {
        key: float(notes[key])
        for key in ("live_span_s", "live_noise_floor")
        if isinstance(notes.get(key), int | float) and not isinstance(notes[key], bool) and 0 < notes[key] < math.inf
    }
    answers = notes.get("answers")
    words = (
        {"answers": tuple(answers)} if isinstance(answers, list) and all(isinstance(a, str) for a in answers) else {}
    )
    return {**texts, **numbers, **words}


def model_dtype(name: str, device: torch.device) -> torch.dtype:
    """bfloat16 on CUDA; float32 on CPU, and for tiny models everywhere, so their results are
    deterministic and comparable across code paths."""
    return torch.bfloat16 if device.type == "cuda" and not is_tiny_model(name) else torch.float32


def describe_model(name: str, cache_dir: Path | None = None, device: torch.device | None = None) -> dict:
    """What loading `name` on `device` would give, from its config alone: the model is built on the `meta`
    device, so no weights are read or allocated and any size describes instantly. Tied embeddings count once.

    Returns {"name", "family", "parameters", "active_parameters", "vision_parameters", "dtype", "attention",
    "device"} (active_parameters: what one token passes through, `active_parameters`), and for a
    random:<checkpoint> whose checkpoint holds weights transformers does not build (Qwen3.5's
    multi-token-prediction head) also "unbuilt_parameters" ({"mtp": N}) and "note" (one sentence);
    raises ModelUnavailable (no config to be had) or UnsupportedModel like load_model.
    """
    config = _read_config(name, _source(name, cache_dir))
    model_class = _model_class(name, config)
    with torch.device("meta"):
        model = model_class._from_config(config)
    device = device or torch.device("cpu")
    dtype = model_dtype(name, device)
    vision = family_for(model).vision_modules(model)
    summary = {
        "name": name,
        "family": config.model_type,
        "parameters": sum(p.numel() for p in model.parameters()),
        "active_parameters": active_parameters(model, config.text_config),
        "vision_parameters": sum(p.numel() for module in vision for p in module.parameters()),
        "dtype": str(dtype).removeprefix("torch."),
        "attention": _vision_attention(config.model_type, device, dtype),
        "device": str(device),
    }
    spec = checkpoint_spec(name) if is_random(name) else {}
    if spec.get("unbuilt_parameters"):
        summary["unbuilt_parameters"] = dict(spec["unbuilt_parameters"])
        summary["note"] = unbuilt_note(spec)
    return summary


def active_parameters(model: PreTrainedModel, text_config) -> int:
    """Parameters one token passes through: all of them but the routed experts its router does not choose
    (num_experts_per_tok of each mixture-of-experts layer's experts run). Routed experts are the parameters
    under an `experts` module whose first axis is the expert count (transformers stacks them so); shared
    experts and the towers count in full. The total on a dense model."""
    total = sum(p.numel() for p in model.parameters())
    experts = getattr(text_config, "num_experts", None) or getattr(text_config, "n_routed_experts", None)
    if not experts:
        return total
    routed = sum(
        p.numel()
        for name, p in model.named_parameters()
        if ".experts." in name and p.dim() > 1 and p.shape[0] == experts
    )
    return total - routed * (experts - text_config.num_experts_per_tok) // experts


def _vision_attention(family: str, device: torch.device, dtype: torch.dtype) -> str:
    """_pick_attention's kernel for the vision tower, but sdpa where TORCH_VARLEN would have nothing to pack."""
    attn = _pick_attention(device, dtype)
    if attn == kernels.TORCH_VARLEN and family in DENSE_VISION_TOWERS:
        log.info("attention: sdpa for %s's vision tower (one dense batch of tubelets, no varlen segments)", family)
        return "sdpa"
    return attn


def load_model(name: str, device: str = "auto", cache_dir: Path | None = None) -> LoadedModel:
    """Load `name` onto `device` in eval mode.

    Tiny models are float32 everywhere; real checkpoints are bfloat16 on CUDA and float32 on CPU.
    Raises ModelUnavailable when the checkpoint cannot be found or fetched, UnsupportedModel when
    it is not a family served here (MODEL_CLASSES), engine.loading.device.DeviceUnavailable when `device`
    cannot be used (checked first, before anything is read).
    """
    torch_device = resolve_device(device)
    is_tiny = is_tiny_model(name)
    source = _source(name, cache_dir)
    dtype = model_dtype(name, torch_device)

    config = _read_config(name, source)
    family = config.model_type
    model_class = _model_class(name, config)

    vision_attn = _vision_attention(family, torch_device, dtype)
    attn = kernels.built_implementation(vision_attn)  # what the model is built with; see install below
    if is_random(name):
        model, processor = build_random_model(checkpoint_spec(name), model_class, torch_device, dtype, attn)
    else:
        try:
            processor = AutoProcessor.from_pretrained(source)
            model = model_class.from_pretrained(
                source,
                config=config,
                dtype=dtype,
                attn_implementation=attn,
                # Load straight onto the GPU instead of staging a multi-GB copy in host memory.
                device_map=str(torch_device) if torch_device.type == "cuda" else None,
            )
        except _UNAVAILABLE_ERRORS as exc:
            raise ModelUnavailable(f"Model {name!r} is unavailable: {type(exc).__name__}: {exc}") from exc
    model = model.to(torch_device).eval()
    model.requires_grad_(False)
    kernels.install(model, vision_attn)  # TORCH_VARLEN: the vision tower only, after the sdpa build
    log.info("loaded %s (%s) on %s as %s with %s attention", name, family, torch_device, dtype, vision_attn)
    linear = None
    if "linear_attention" in (getattr(config.text_config, "layer_types", None) or ()):
        linear = (
            kernels.mamba_kernels(torch_device)
            if family == "nemotron_h_omni"
            else kernels.linear_attention_kernels(torch_device)
        )
        log.info("attention: linear-attention layers on %s", linear)
    return LoadedModel(
        name=name,
        family=family,
        model=model,
        processor=processor,
        device=torch_device,
        dtype=dtype,
        attn_implementation=vision_attn,
        is_tiny=is_tiny,
        random_weights=name in TINY_MODELS or is_random(name),
        video_pruning_rate=checkpoint_pruning_rate(config),
        linear_attention=linear,
        **_model_notes(source),
    )


def checkpoint_pruning_rate(config) -> float | None:
    """config.json's `video_pruning_rate` when it is a valid EVS rate q in [0, 1); otherwise None, logged."""
    rate = getattr(config, "video_pruning_rate", None)
    if rate is None:
        return None
    if isinstance(rate, (int, float)) and not isinstance(rate, bool) and 0 <= rate < 1:
        return float(rate)
    log.warning("ignoring the checkpoint's video_pruning_rate %r: not a rate in [0, 1)", rate)
    return None
