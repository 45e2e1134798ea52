"""`random:<checkpoint>`: the published architectures, built from stored configs without the Hub."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine import Engine, EngineConfig, GenerationParams
from engine.models import ModelUnavailable, describe_model
from engine.random_checkpoints import checkpoint_spec, stored_checkpoints
from engine.tiny import build_tokenizer, special_token_ids

ROOT = Path(__file__).resolve().parent.parent
# Parameter counts the Hub shows for each checkpoint's safetensors (tied embeddings once).
PUBLISHED = {
    "Qwen/Qwen3-VL-2B-Instruct": 2_127_532_032,
    "Qwen/Qwen3-VL-4B-Instruct": 4_437_815_808,  # "4.44 B, 415 M in the vision tower"
    "Qwen/Qwen3-VL-8B-Instruct": 8_767_123_696,  # "8.77 B"
    "Qwen/Qwen2.5-VL-3B-Instruct": 3_754_622_976,
    "Qwen/Qwen2.5-VL-7B-Instruct": 8_292_166_656,  # "8.29 B"
}


def test_every_published_checkpoint_is_stored():
    assert stored_checkpoints() == sorted(PUBLISHED)


@pytest.mark.parametrize("checkpoint", sorted(PUBLISHED))
def test_parameter_counts_match_the_published_sizes(checkpoint):
    summary = describe_model(f"random:{checkpoint}")
    assert summary["parameters"] == pytest.approx(PUBLISHED[checkpoint], rel=0.02)
    assert summary["family"] == ("qwen3_vl" if "Qwen3" in checkpoint else "qwen2_5_vl")
    assert summary["dtype"] == "float32" and summary["attention"] == "sdpa"  # what a CPU load would use


def test_the_4b_is_the_published_architecture():
    summary = describe_model("random:Qwen/Qwen3-VL-4B-Instruct")
    assert summary["vision_parameters"] == pytest.approx(415e6, rel=0.01)
    config = checkpoint_spec("random:Qwen/Qwen3-VL-4B-Instruct")["config"]
    text, vision = config["text_config"], config["vision_config"]
    assert (text["hidden_size"], text["num_hidden_layers"], text["num_attention_heads"],
            text["num_key_value_heads"], text["head_dim"], text["intermediate_size"], text["vocab_size"]) == (
        2560, 36, 32, 8, 128, 9728, 151936)
    assert text["rope_scaling"]["mrope_section"] == [24, 20, 20] and text["rope_scaling"]["mrope_interleaved"]
    assert (vision["depth"], vision["hidden_size"], vision["num_heads"], vision["intermediate_size"],
            vision["patch_size"], vision["temporal_patch_size"], vision["spatial_merge_size"],
            vision["num_position_embeddings"], vision["out_hidden_size"], vision["deepstack_visual_indexes"]) == (
        24, 1024, 16, 4096, 16, 2, 2, 2304, 2560, [5, 11, 17])
    assert config["tie_word_embeddings"]


def test_describe_on_the_command_line_ends_with_one_json_line():
    result = subprocess.run([sys.executable, "-m", "engine", "--describe", "--model", "random:Qwen/Qwen3-VL-8B-Instruct"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert {"parameters", "vision_parameters", "family", "dtype", "attention"} <= set(summary)
    assert summary["parameters"] == PUBLISHED["Qwen/Qwen3-VL-8B-Instruct"]


def test_an_unknown_checkpoint_is_one_sentence():
    with pytest.raises(ModelUnavailable, match="is neither a stored checkpoint"):
        describe_model("random:Qwen/Qwen9-VL-1T")
    result = subprocess.run([sys.executable, "-m", "engine", "--describe", "--model", "random:nope"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.startswith("error: 'random:nope' is neither")
    assert "Traceback" not in result.stderr


# Each family's real spec with fewer and narrower layers, so the whole path runs on a CPU in seconds: the
# real vocabulary, processors, patch/merge geometry and (Qwen3-VL) DeepStack stay.
SHRINK = {
    "Qwen/Qwen3-VL-4B-Instruct": dict(
        text=dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  intermediate_size=256, rope_scaling={"rope_type": "default", "mrope_section": [6, 5, 5],
                                                       "mrope_interleaved": True}),
        vision=dict(depth=2, hidden_size=64, num_heads=2, intermediate_size=128, out_hidden_size=128,
                    deepstack_visual_indexes=[0, 1])),
    "Qwen/Qwen2.5-VL-3B-Instruct": dict(
        text=dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=256, rope_scaling={"type": "mrope", "mrope_section": [4, 6, 6]}),
        vision=dict(depth=2, hidden_size=64, num_heads=2, intermediate_size=128, out_hidden_size=128,
                    fullatt_block_indexes=[1])),
}


def shrunk_spec(tmp_path: Path, checkpoint: str) -> Path:
    spec = checkpoint_spec(f"random:{checkpoint}")
    config = spec["config"]
    text = config.get("text_config", config)  # Qwen2.5-VL keeps the text fields at the top level
    text.update(SHRINK[checkpoint]["text"])
    if "text_config" not in config:
        config["hidden_size"] = text["hidden_size"]
    config["vision_config"].update(SHRINK[checkpoint]["vision"])
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return path


@pytest.mark.parametrize("checkpoint", sorted(SHRINK))
def test_a_random_checkpoint_serves_through_the_engine_with_its_real_processor(tmp_path, clip, checkpoint):
    spec_path = shrunk_spec(tmp_path, checkpoint)
    engine = Engine(EngineConfig(model=f"random:{spec_path}", device="cpu", cache_dir=tmp_path))
    try:
        answer = engine.submit(video=clip("moving_object"), question="What moves?",
                               params=GenerationParams(pruning_rate=0.5, max_new_tokens=4, ignore_eos=True)).result(
            timeout_s=120)
        loaded = engine.loaded
    finally:
        engine.shutdown()
    spec = checkpoint_spec(f"random:{checkpoint}")
    config = loaded.model.config
    assert config.text_config.vocab_size == loaded.model.get_input_embeddings().weight.shape[0] == 151936
    tokenizer_ids = special_token_ids(build_tokenizer())
    assert {key: getattr(config, key) for key in tokenizer_ids} == tokenizer_ids
    video = loaded.processor.video_processor
    stored = spec.get("video_preprocessor", spec["preprocessor"])
    assert (video.patch_size, video.merge_size, video.temporal_patch_size) == (
        stored["patch_size"], stored["merge_size"], stored["temporal_patch_size"])
    assert loaded.random_weights and not loaded.is_tiny
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in loaded.model.parameters())
    assert answer.stats["generated_tokens"] == 4
    assert 0 < answer.stats["video_tokens_kept"] < answer.stats["video_tokens_total"]
