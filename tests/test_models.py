"""Tiny offline models and model loading: build, cache, determinism, processor round trips, generate."""

import re
import threading

import huggingface_hub.constants
import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import Qwen2_5_VLProcessor, Qwen2Config, Qwen3VLProcessor
from transformers.video_utils import VideoMetadata

from engine.checkpoints import tiny, tokenizer
from engine.families.registry import family_for
from engine.loading.load import ModelUnavailable, UnsupportedModel, load_model, resolve_device

TINY = {"tiny-random": ("qwen3_vl", Qwen3VLProcessor), "tiny-random-qwen2.5-vl": ("qwen2_5_vl", Qwen2_5_VLProcessor)}
VIDEO_PAD = "<|video_pad|>"


@pytest.fixture(scope="module")
def cache_dir(tiny_cache_dir):
    """The session's shared tiny-model folder (tests/conftest.py), so the suite builds each model once."""
    return tiny_cache_dir


@pytest.fixture(scope="module")
def loaded(cache_dir):
    return {name: load_model(name, device="cpu", cache_dir=cache_dir) for name in TINY}


def _video(num_frames: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    """(N, H, W, 3) uint8 random frames."""
    return np.random.default_rng(seed).integers(0, 256, (num_frames, height, width, 3), dtype=np.uint8)


def _process(lm, prompt: str, frames: np.ndarray, fps: float, indices: list[int], total_frames: int):
    metadata = VideoMetadata(total_num_frames=total_frames, fps=fps, frames_indices=indices)
    height, width = frames.shape[1:3]
    processor, size_kwargs = family_for(lm.model).sized_processor(lm.processor, len(frames), height * width)
    return processor(
        text=[prompt],
        videos=[frames],
        video_metadata=[metadata],
        do_sample_frames=False,
        return_tensors="pt",
        **size_kwargs,
    )


def _frame_side_pixels(lm, grid_thw: torch.Tensor) -> tuple[int, int]:
    patch = lm.processor.video_processor.patch_size
    return int(grid_thw[1]) * patch, int(grid_thw[2]) * patch


@pytest.mark.parametrize("name", TINY)
def test_tiny_model_loads_through_from_pretrained(loaded, cache_dir, name):
    lm = loaded[name]
    family, processor_class = TINY[name]
    assert lm.name == name and lm.family == family and lm.is_tiny
    assert lm.dtype == torch.float32 and next(lm.model.parameters()).dtype == torch.float32
    assert lm.device == torch.device("cpu") and next(lm.model.parameters()).device.type == "cpu"
    assert lm.attn_implementation == "sdpa"
    assert not lm.model.training and not any(p.requires_grad for p in lm.model.parameters())
    assert type(lm.processor) is processor_class
    folder = cache_dir / name
    assert (folder / "model.safetensors").exists()
    assert sum(f.stat().st_size for f in folder.iterdir()) < 5_000_000


@pytest.mark.parametrize("name", TINY)
def test_config_token_ids_match_tokenizer(loaded, name):
    lm = loaded[name]
    tok, cfg = lm.processor.tokenizer, lm.model.config
    assert cfg.video_token_id == tok.convert_tokens_to_ids(VIDEO_PAD)
    assert cfg.image_token_id == tok.convert_tokens_to_ids("<|image_pad|>")
    assert cfg.vision_start_token_id == tok.convert_tokens_to_ids("<|vision_start|>")
    assert cfg.vision_end_token_id == tok.convert_tokens_to_ids("<|vision_end|>")
    assert cfg.get_text_config().vocab_size == len(tok)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    # Special tokens can never win greedy decoding, so a tiny answer always runs to max_new_tokens.
    special_ids = tok.convert_tokens_to_ids(tokenizer.SPECIAL_TOKENS)
    lm_head = lm.model.get_output_embeddings().weight
    assert not lm_head[special_ids].any()
    vision_ids = [cfg.video_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id]
    assert lm.model.get_input_embeddings().weight[vision_ids].abs().sum(dim=1).min() > 0  # inputs untouched


def test_qwen3_config_is_deepstack_with_interleaved_mrope(loaded):
    cfg = loaded["tiny-random"].model.config
    assert list(cfg.vision_config.deepstack_visual_indexes) == [0, 1]
    text = cfg.text_config
    assert sum(text.rope_parameters["mrope_section"]) == text.head_dim // 2


@pytest.mark.parametrize("name", TINY)
def test_tokenizer_is_byte_level_and_round_trips_utf8(loaded, name):
    tok = loaded[name].processor.tokenizer
    assert len(tok(VIDEO_PAD, add_special_tokens=False).input_ids) == 1
    text = "héllo wörld, 世界 🎥 — ok?\n"
    ids = tok(text, add_special_tokens=False).input_ids
    assert len(ids) == len(text.encode("utf-8"))  # one token per byte: no merges
    assert tok.decode(ids, skip_special_tokens=True) == text
    with_specials = tok("<|im_start|>" + text + "<|im_end|>", add_special_tokens=False).input_ids
    assert tok.decode(with_specials, skip_special_tokens=True) == text


def test_chat_template_is_chatml(loaded):
    tok = loaded["tiny-random"].processor.tokenizer
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What moves?"}]},
    ]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>What moves?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_qwen3_processor_expands_video_with_timestamps(loaded):
    lm = loaded["tiny-random"]
    indices, fps = [0, 4, 8, 12], 8.0
    inputs = _process(lm, f"Look: {VIDEO_PAD} now", _video(4, 224, 224), fps, indices, total_frames=16)
    grid = inputs["video_grid_thw"][0]
    assert grid.tolist() == [2, 14, 14]
    tokens_per_group = int(grid[1] * grid[2]) // 4
    ids = inputs["input_ids"][0]
    assert int((ids == lm.model.config.video_token_id).sum()) == int(grid.prod()) // 4

    # One `<t seconds>` marker per temporal group, at the mean time of its two frames.
    times_s = [(indices[i] + indices[i + 1]) / 2 / fps for i in range(0, len(indices), 2)]
    assert times_s == [0.25, 1.25]
    groups = "".join(
        f"<{t:.1f} seconds><|vision_start|>" + VIDEO_PAD * tokens_per_group + "<|vision_end|>" for t in times_s
    )
    assert lm.processor.tokenizer.decode(ids) == f"Look: {groups} now"
    assert re.findall(r"<([\d.]+) seconds>", lm.processor.tokenizer.decode(ids)) == ["0.2", "1.2"]


def test_qwen2_5_processor_expands_video_and_seconds_per_group(loaded):
    lm = loaded["tiny-random-qwen2.5-vl"]
    indices, fps = [0, 4, 8, 12], 8.0
    inputs = _process(lm, f"<|vision_start|>{VIDEO_PAD}<|vision_end|>", _video(4, 224, 224), fps, indices, 16)
    grid = inputs["video_grid_thw"][0]
    assert grid.tolist() == [2, 16, 16]
    ids = inputs["input_ids"][0]
    assert int((ids == lm.model.config.video_token_id).sum()) == int(grid.prod()) // 4
    assert lm.processor.tokenizer.decode(ids) == "<|vision_start|>" + VIDEO_PAD * 128 + "<|vision_end|>"
    sampling_fps = fps / (indices[1] - indices[0])  # every 4th frame of an 8 fps clip: 2 frames a second
    assert inputs["second_per_grid_ts"].tolist() == [pytest.approx(2 / sampling_fps)]


@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("num_frames", [2, 8])
def test_video_kwargs_keep_aligned_frames_unscaled(loaded, name, num_frames):
    # 224 = 7*32 (Qwen3-VL) = 8*28 (Qwen2.5-VL): already aligned, so no resize may happen, however many frames.
    lm = loaded[name]
    inputs = _process(lm, VIDEO_PAD, _video(num_frames, 224, 224), 8.0, list(range(num_frames)), num_frames)
    grid = inputs["video_grid_thw"][0]
    assert int(grid[0]) == num_frames // 2
    assert _frame_side_pixels(lm, grid) == (224, 224)


@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("num_frames", [4, 5])
def test_video_kwargs_cap_pixels_per_frame(loaded, name, num_frames):
    lm = loaded[name]
    cap = 224 * 224
    metadata = VideoMetadata(total_num_frames=num_frames, fps=8.0, frames_indices=list(range(num_frames)))
    processor, size_kwargs = family_for(lm.model).sized_processor(lm.processor, num_frames, cap)
    inputs = processor(
        text=[VIDEO_PAD],
        videos=[_video(num_frames, 480, 640)],
        video_metadata=[metadata],
        do_sample_frames=False,
        return_tensors="pt",
        **size_kwargs,
    )
    height, width = _frame_side_pixels(lm, inputs["video_grid_thw"][0])
    assert height * width <= cap
    assert height * width >= cap // 2  # shrunk to the cap, not far below it
    assert width > height  # aspect ratio kept


@pytest.mark.parametrize("name", TINY)
def test_stock_generate_runs(loaded, name):
    lm = loaded[name]
    prompt = f"<|im_start|>user\n{VIDEO_PAD}What moves?<|im_end|>\n<|im_start|>assistant\n"
    if lm.family == "qwen2_5_vl":
        prompt = prompt.replace(VIDEO_PAD, f"<|vision_start|>{VIDEO_PAD}<|vision_end|>")
    inputs = _process(lm, prompt, _video(4, 64, 64), 8.0, [0, 4, 8, 12], 16)
    with torch.inference_mode():
        out = lm.model.generate(**inputs, max_new_tokens=8, do_sample=False)
    new_tokens = out[0, inputs["input_ids"].shape[1] :]
    assert new_tokens.shape == (8,)
    assert len(set(new_tokens.tolist())) > 1  # not one token repeated
    with torch.inference_mode():
        logits = lm.model(**inputs).logits[0, -1]
    top2 = logits.topk(2).values
    assert float(top2[0] - top2[1]) > 1e-3  # greedy margin well above float noise


def test_tiny_folder_is_reused(loaded, cache_dir, monkeypatch):
    def no_rebuild(*args):
        raise AssertionError("rebuilt a current tiny model")

    monkeypatch.setattr(tiny, "_build_into", no_rebuild)
    for name in TINY:
        weights = cache_dir / name / "model.safetensors"
        mtime_ns = weights.stat().st_mtime_ns
        assert tiny.ensure_tiny_model(name, cache_dir) == cache_dir / name
        assert load_model(name, device="cpu", cache_dir=cache_dir).family == TINY[name][0]
        assert weights.stat().st_mtime_ns == mtime_ns


@pytest.mark.parametrize("name", TINY)
def test_tiny_build_is_deterministic(cache_dir, tmp_path, name):
    first = load_file(tiny.ensure_tiny_model(name, cache_dir) / "model.safetensors")
    torch.manual_seed(1234)  # the build must not depend on the caller's RNG state
    second = load_file(tiny.ensure_tiny_model(name, tmp_path) / "model.safetensors")
    assert first.keys() == second.keys()
    for key in first:
        assert torch.equal(first[key], second[key]), key


def test_concurrent_builds_build_once_and_stale_builds_are_replaced(tmp_path, monkeypatch):
    builds = []
    real_build = tiny._build_into

    def counting_build(name, folder):
        builds.append(name)
        real_build(name, folder)

    monkeypatch.setattr(tiny, "_build_into", counting_build)
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(tiny.ensure_tiny_model("tiny-random", tmp_path)))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [tmp_path / "tiny-random"] * 3
    assert builds == ["tiny-random"]

    (tmp_path / "tiny-random" / "evs_tiny_version.txt").write_text("0")
    assert tiny.ensure_tiny_model("tiny-random", tmp_path) == tmp_path / "tiny-random"
    assert builds == ["tiny-random"] * 2
    assert (tmp_path / "tiny-random" / "evs_tiny_version.txt").read_text() == tiny.TINY_BUILD_VERSION
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == ["tiny-random"]


def test_missing_checkpoint_raises_model_unavailable(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    # The hub reads the variable once at import; set the constant it consults too.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelUnavailable, match="some-org/does-not-exist"):
        load_model("some-org/does-not-exist", device="cpu")
    with pytest.raises(ModelUnavailable, match="no-such-folder"):
        load_model(str(tmp_path / "no-such-folder"), device="cpu")


def test_other_model_type_is_rejected(tmp_path):
    Qwen2Config(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, vocab_size=32).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModel, match=re.escape(str(tmp_path))):
        load_model(str(tmp_path), device="cpu")


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected


@pytest.mark.parametrize("rate, served", [(0.5, 0.5), (0, 0.0), (1.0, 0.7), ("high", 0.7)])
def test_the_checkpoints_video_pruning_rate_is_the_servers_default(cache_dir, tmp_path, clip, rate, served):
    """config.json's `video_pruning_rate` sets the default rate (a request without params, the UI's slider);
    one that is not a rate in [0, 1) is ignored."""
    import json
    import shutil

    from engine import Engine, EngineConfig
    from engine.config import FrameSampling

    folder = shutil.copytree(tiny.ensure_tiny_model("tiny-random-qwen3.5", cache_dir), tmp_path / "checkpoint")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "video_pruning_rate": rate}))
    sampling = FrameSampling(fps=2.0, max_frames=4, max_pixels_per_frame=64 * 64)
    with Engine(EngineConfig(model=str(folder), device="cpu", frame_sampling=sampling)) as engine:
        assert engine.model_info["default_pruning_rate"] == served
        answer = engine.submit(clip("moving_object", seconds=2.0), "What moves?").result(120)
    assert answer.stats["pruning_rate"] == served
