"""Offline tiny vision-language models (Qwen-VL families, Nemotron-H Omni) with random weights, built once
and saved like a real checkpoint.

They let the whole pipeline (processor, ViT, EVS, prefill, decode) run with no network and on CPU:
`load_model` reads the saved folder through the same `from_pretrained` path as a downloaded model.
The words they produce are meaningless; shapes, positions and timings are real. One more layout,
tiny-trained, is the starting point of `python -m train.tiny_trained`; its trained weights ship in
assets/models/ (TRAINED_MODELS) and answer questions about the synthetic clips of assets/shapes.py.
"""

import fcntl
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import (
    GenerationConfig,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
    Qwen2VLImageProcessor,
    Qwen2VLVideoProcessor,
    Qwen3_5Config,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeConfig,
    Qwen3_5MoeForConditionalGeneration,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLProcessor,
    Qwen3VLVideoProcessor,
)

from engine.families.registry import family_for

from .tiny_nemotron import nemotron_omni_layout
from .tokenizer import CHAT_TEMPLATE, EXTRA_SPECIAL_TOKENS, build_tokenizer, special_token_ids

log = logging.getLogger(__name__)

# Tiny models trained by a script in the repo (train/), shipped as weights: name -> folder.
TRAINED_MODELS = {
    name: Path(__file__).resolve().parents[2] / "assets" / "models" / name
    for name in ("tiny-trained", "tiny-trained-plain")
}
# What a trained model's folder says about itself (loading/load.py reads it): its system prompt and a
# sentence for the app's banner.
MODEL_NOTES_FILE = "evs_model.json"

TINY_MODELS = {
    "tiny-random": "qwen3_vl",
    "tiny-random-qwen2.5-vl": "qwen2_5_vl",
    "random-qwen3-vl-50m": "qwen3_vl",  # benchmark size: heavy enough that batching shows
    "tiny-random-qwen3.5": "qwen3_5",  # hybrid: three linear-attention layers, then one full-attention layer
    "tiny-random-qwen3.5-moe": "qwen3_5_moe",
    "tiny-random-nemotron-omni": "nemotron_h_omni",  # hybrid Mamba-2 / attention / MoE, RADIO tubelets, audio
}

# Layer sizes of each Qwen3-VL build: text (hidden, layers, heads, kv heads, head_dim, MLP, MRoPE split),
# vision (depth, hidden, heads, MLP, DeepStack layers).
_QWEN3_SIZES = {
    "tiny-random": dict(
        text=dict(
            hidden_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=128,
            mrope=[4, 2, 2],
        ),
        vision=dict(depth=3, hidden_size=32, num_heads=2, intermediate_size=64, deepstack_visual_indexes=[0, 1]),
    ),
    "random-qwen3-vl-50m": dict(
        text=dict(
            hidden_size=512,
            num_hidden_layers=8,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=64,
            intermediate_size=1536,
            mrope=[12, 10, 10],
        ),
        vision=dict(depth=6, hidden_size=384, num_heads=6, intermediate_size=1536, deepstack_visual_indexes=[1, 3]),
    ),
    # The layout `python -m train.tiny_trained` trains on assets/shapes.py clips; those weights ship in the
    # repo (TRAINED_MODELS) and are never built here.
    "tiny-trained": dict(
        text=dict(
            hidden_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            intermediate_size=384,
            mrope=[6, 5, 5],
        ),
        vision=dict(depth=3, hidden_size=96, num_heads=3, intermediate_size=384, deepstack_visual_indexes=[0, 1]),
    ),
}

# Bump when the config, tokenizer or init changes: a cached folder with another version is rebuilt.
TINY_BUILD_VERSION = "4"
_VERSION_FILE = "evs_tiny_version.txt"

# Large enough that the top-2 logit gap dwarfs float noise from batching/padding, so greedy
# decoding is stable across code paths; checked on sample prompts (gaps of ~1e-1, not 1e-5).
_INIT_RANGE = 0.2


def _text_config(tokenizer, mrope_section: list[int], init_range: float = _INIT_RANGE, **extra) -> dict:
    sizes = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2
    )
    return dict(
        vocab_size=len(tokenizer),
        **{**sizes, **extra},
        max_position_embeddings=32768,
        initializer_range=init_range,
        pad_token_id=tokenizer.pad_token_id,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": mrope_section},
    )


def qwen3_vl_layout(tokenizer, name: str = "tiny-random", init_range: float = _INIT_RANGE):
    """Qwen3-VL layout: patch 16, merge 2, interleaved MRoPE, DeepStack from two early ViT layers.

    Returns (model class, config, processor) for the sizes of `name`; init_range is the weights' std.
    """
    text = dict(_QWEN3_SIZES[name]["text"])
    # tiny: head_dim 16 -> 8 rotary frequencies split t/h/w = 4/2/2; the model interleaves them.
    mrope = text.pop("mrope")
    config = Qwen3VLConfig(
        text_config=_text_config(tokenizer, mrope, init_range, **text),
        vision_config=dict(
            **_QWEN3_SIZES[name]["vision"],
            patch_size=16,
            temporal_patch_size=2,
            spatial_merge_size=2,
            out_hidden_size=text["hidden_size"],
            num_position_embeddings=64,
            initializer_range=init_range,
        ),
        **special_token_ids(tokenizer),
    )
    half = [0.5, 0.5, 0.5]
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(
            patch_size=16,
            temporal_patch_size=2,
            merge_size=2,
            image_mean=half,
            image_std=half,
            size={"shortest_edge": 64 * 32 * 32, "longest_edge": 16384 * 32 * 32},
        ),
        video_processor=Qwen3VLVideoProcessor(
            patch_size=16,
            temporal_patch_size=2,
            merge_size=2,
            image_mean=half,
            image_std=half,
            size={"shortest_edge": 4 * 32 * 32, "longest_edge": 24576 * 32 * 32},
        ),
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
    )
    return Qwen3VLForConditionalGeneration, config, processor


def _qwen2_5_vl(tokenizer, name: str = "tiny-random-qwen2.5-vl"):
    """Qwen2.5-VL layout: patch 14, merge 2, windowed ViT attention with one full-attention block."""
    config = Qwen2_5_VLConfig(
        # head_dim 64/4 = 16 -> 8 rotary frequencies split t/h/w = 2/3/3 like the real 16/24/24.
        text_config=_text_config(tokenizer, [2, 3, 3], bos_token_id=None, eos_token_id=tokenizer.eos_token_id),
        vision_config=dict(
            depth=3,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            patch_size=14,
            temporal_patch_size=2,
            spatial_merge_size=2,
            window_size=56,
            fullatt_block_indexes=[2],
            tokens_per_second=2,
            out_hidden_size=64,
            initializer_range=_INIT_RANGE,
        ),
        **special_token_ids(tokenizer),
    )
    pixels = {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280}
    processor = Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(patch_size=14, temporal_patch_size=2, merge_size=2, size=pixels),
        video_processor=Qwen2VLVideoProcessor(patch_size=14, temporal_patch_size=2, merge_size=2, size=pixels),
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
    )
    return Qwen2_5_VLForConditionalGeneration, config, processor


# Qwen3.5's text tower: every 4th layer full attention, the rest Gated DeltaNet linear attention with its
# conv and recurrent state; a quarter of each head's dims is rotary (head_dim 32 -> 8 dims -> 4 frequencies,
# split t/h/w = 2/1/1 and interleaved). Qwen3.5's vision tower has no DeepStack.
_QWEN3_5_TEXT = dict(
    hidden_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=128,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    full_attention_interval=4,
)
_QWEN3_5_MOE_TEXT = dict(
    moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2
)


def _qwen3_5(tokenizer, name: str):
    """Qwen3.5 layout (dense or MoE): Qwen3-VL's processor, patch 16, merge 2, no DeepStack."""
    moe = TINY_MODELS[name] == "qwen3_5_moe"
    text = {**_QWEN3_5_TEXT, **(_QWEN3_5_MOE_TEXT if moe else {})}
    if moe:
        del text["intermediate_size"]
    text_config = _text_config(tokenizer, [2, 1, 1], **text)
    text_config["rope_parameters"].update(mrope_interleaved=True, partial_rotary_factor=0.25)
    config_class = Qwen3_5MoeConfig if moe else Qwen3_5Config
    config = config_class(
        text_config=text_config,
        vision_config=dict(
            depth=2,
            hidden_size=32,
            num_heads=2,
            intermediate_size=64,
            patch_size=16,
            temporal_patch_size=2,
            spatial_merge_size=2,
            out_hidden_size=64,
            num_position_embeddings=64,
            initializer_range=_INIT_RANGE,
        ),
        **special_token_ids(tokenizer),
    )
    _model_class, _config, processor = qwen3_vl_layout(tokenizer)
    return (Qwen3_5MoeForConditionalGeneration if moe else Qwen3_5ForConditionalGeneration), config, processor


def _nemotron_omni(tokenizer, name: str):
    return nemotron_omni_layout(tokenizer, name, _INIT_RANGE)


_BUILDERS = {
    "qwen3_vl": qwen3_vl_layout,
    "qwen2_5_vl": _qwen2_5_vl,
    "qwen3_5": _qwen3_5,
    "qwen3_5_moe": _qwen3_5,
    "nemotron_h_omni": _nemotron_omni,
}


# Special tokens a family's tokenizer has beyond the Qwen ones (their ids come after them).
def _silence_special_tokens(model, tokenizer) -> None:
    """Zero the output rows of the special tokens so greedy decoding never picks them.

    Random weights otherwise emit <|im_end|> after a handful of tokens; a tiny model that always runs
    to max_new_tokens gives tests and benchmarks a fixed, known answer length.
    """
    lm_head = family_for(model).lm_head(model).weight
    assert lm_head.data_ptr() != model.get_input_embeddings().weight.data_ptr(), "tied embeddings"
    with torch.no_grad():
        lm_head[tokenizer.convert_tokens_to_ids(tokenizer.all_special_tokens)] = 0.0


def _lengthen_memory(model) -> None:
    """Slow the decay of every linear-attention layer's recurrent state (Gated DeltaNet's and Mamba-2's: both
    keep their decay rate as A_log beside a dt_bias).

    transformers draws each head's decay rate A from U(0.01, 16), so a random layer forgets all but its last
    few tokens, every prompt ends in the same chat markers, and all rows' states come out alike: a test that
    swapped two rows' states could not tell. Trained checkpoints keep heads with long memory; here A is drawn
    from U(0.005, 0.05), a memory of tens of tokens.
    """
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "A_log") and hasattr(module, "dt_bias"):
                module.A_log.copy_(torch.empty_like(module.A_log).uniform_(0.005, 0.05).log())


def _build_into(name: str, folder: Path) -> None:
    family = TINY_MODELS[name]
    tokenizer = build_tokenizer(EXTRA_SPECIAL_TOKENS.get(family, ()))
    model_class, config, processor = _BUILDERS[family](tokenizer, name)
    torch.manual_seed(0)
    model = model_class(config).to(torch.float32).eval()
    _silence_special_tokens(model, tokenizer)
    _lengthen_memory(model)
    model.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.eos_token_id, tokenizer.pad_token_id],
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    (folder / _VERSION_FILE).write_text(TINY_BUILD_VERSION)


def _is_current(folder: Path) -> bool:
    try:
        return (folder / _VERSION_FILE).read_text() == TINY_BUILD_VERSION
    except OSError:
        return False


def ensure_tiny_model(name: str, cache_dir: Path) -> Path:
    """Return `cache_dir / name`, building and saving the tiny model there first if needed.

    Safe across processes: the build happens in a private temp folder under a file lock and is
    renamed into place, so a reader never sees a half-written folder.
    """
    if name not in TINY_MODELS:
        raise KeyError(f"unknown tiny model {name!r}; known: {sorted(TINY_MODELS)}")
    cache_dir = Path(cache_dir)
    folder = cache_dir / name
    if _is_current(folder):
        return folder
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_current(folder):  # another process built it while we waited
            return folder
        log.info("building tiny model %s in %s", name, folder)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.build-", dir=cache_dir))
        try:
            _build_into(name, tmp)
            if folder.exists():  # stale build version: move aside atomically, then delete
                stale = Path(tempfile.mkdtemp(prefix=f".{name}.stale-", dir=cache_dir))
                os.replace(folder, stale / name)
                shutil.rmtree(stale, ignore_errors=True)
            os.replace(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return folder
