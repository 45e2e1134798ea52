"""`random:<checkpoint>`: the published architectures, built from stored configs without the Hub."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine import Engine, EngineConfig, GenerationParams
from engine.checkpoints.random_weights import checkpoint_spec, spec_config, spec_processor, stored_checkpoints
from engine.checkpoints.tokenizer import build_tokenizer, special_token_ids
from engine.loading.load import ModelUnavailable, describe_model

ROOT = Path(__file__).resolve().parent.parent
# Parameter counts the Hub shows for each checkpoint's safetensors (its API's safetensors.total; tied
# embeddings once).
PUBLISHED = {
    "Qwen/Qwen3-VL-2B-Instruct": 2_127_532_032,
    "Qwen/Qwen3-VL-4B-Instruct": 4_437_815_808,  # "4.44 B, 415 M in the vision tower"
    "Qwen/Qwen3-VL-8B-Instruct": 8_767_123_696,  # "8.77 B"
    "Qwen/Qwen3-VL-30B-A3B-Instruct": 31_070_754_032,  # "31B"
    "Qwen/Qwen2.5-VL-3B-Instruct": 3_754_622_976,
    "Qwen/Qwen2.5-VL-7B-Instruct": 8_292_166_656,  # "8.29 B"
    # Qwen3.5: BF16 plus a few thousand F32 parameters (the 9B: 9,653,100,528 + 3,840); the index's total_size
    # halved overcounts the F32 ones.
    "Qwen/Qwen3.5-0.8B": 873_438_784,
    "Qwen/Qwen3.5-4B": 4_659_865_088,
    "Qwen/Qwen3.5-9B": 9_653_104_368,
    "Qwen/Qwen3.5-27B": 27_781_427_952,
    "Qwen/Qwen3.5-35B-A3B": 35_951_822_704,
}
FAMILY = {
    "Qwen/Qwen3-VL-2B-Instruct": "qwen3_vl",
    "Qwen/Qwen3-VL-4B-Instruct": "qwen3_vl",
    "Qwen/Qwen3-VL-8B-Instruct": "qwen3_vl",
    "Qwen/Qwen3-VL-30B-A3B-Instruct": "qwen3_vl_moe",
    "Qwen/Qwen2.5-VL-3B-Instruct": "qwen2_5_vl",
    "Qwen/Qwen2.5-VL-7B-Instruct": "qwen2_5_vl",
    "Qwen/Qwen3.5-0.8B": "qwen3_5",
    "Qwen/Qwen3.5-4B": "qwen3_5",
    "Qwen/Qwen3.5-9B": "qwen3_5",
    "Qwen/Qwen3.5-27B": "qwen3_5",
    "Qwen/Qwen3.5-35B-A3B": "qwen3_5_moe",
}
# The Qwen3.5 checkpoints also hold a multi-token-prediction head that transformers does not build: 15 mtp.*
# tensors, the 2H -> H fusion with its two input norms, one full-attention decoder layer with its MLP (MoE in the
# 35B-A3B) and a final norm. Each is that head's size from the config and equals the Hub total minus what
# transformers builds, e.g. the 9B: 2*4096^2 + 4096*(8192+1024+1024) + 4096*4096 + 2*256 + 3*4096*12288 + 5*4096.
UNBUILT_MTP = {
    "Qwen/Qwen3.5-0.8B": 20_452_864,
    "Qwen/Qwen3.5-4B": 120_599_552,
    "Qwen/Qwen3.5-9B": 243_290_624,
    "Qwen/Qwen3.5-27B": 424_699_392,
    "Qwen/Qwen3.5-35B-A3B": 844_640_768,
}


# Stored checkpoints whose exact count is not to be had here, with their own tests
# (tests/test_nemotron_checkpoint.py).
COUNTED_ELSEWHERE = ["nvidia/Nemotron-3-Nano-Omni-30B-A3B-Reasoning-BF16"]


def test_every_published_checkpoint_is_stored():
    assert stored_checkpoints() == sorted([*PUBLISHED, *COUNTED_ELSEWHERE])
    assert sorted(PUBLISHED) == sorted(FAMILY)


@pytest.mark.parametrize("checkpoint", sorted(PUBLISHED))
def test_parameter_counts_match_the_published_sizes(checkpoint):
    """What transformers builds plus what it leaves out is the checkpoint, to the parameter."""
    summary = describe_model(f"random:{checkpoint}")
    spec = checkpoint_spec(f"random:{checkpoint}")
    assert spec["published_parameters"] == PUBLISHED[checkpoint]
    assert spec.get("unbuilt_parameters", {}) == ({"mtp": UNBUILT_MTP[checkpoint]} if checkpoint in UNBUILT_MTP else {})
    assert summary["parameters"] + UNBUILT_MTP.get(checkpoint, 0) == PUBLISHED[checkpoint]
    assert summary["family"] == FAMILY[checkpoint] == spec["config"]["model_type"]
    assert summary["dtype"] == "float32" and summary["attention"] == "sdpa"  # what a CPU load would use
    assert summary.get("unbuilt_parameters") == spec.get("unbuilt_parameters")
    assert ("note" in summary) == (checkpoint in UNBUILT_MTP)


@pytest.mark.parametrize("checkpoint", sorted(PUBLISHED))
def test_each_checkpoint_gets_its_familys_processor_with_its_own_settings(checkpoint):
    """Qwen3-VL and Qwen3.5, dense and MoE, ship Qwen3-VL's processor; Qwen2.5-VL keeps its own."""
    spec = checkpoint_spec(f"random:{checkpoint}")
    tokenizer = build_tokenizer()
    config = spec_config(spec, tokenizer)
    processor = spec_processor(spec, config.model_type, tokenizer)
    qwen2_5 = FAMILY[checkpoint] == "qwen2_5_vl"
    assert type(processor).__name__ == ("Qwen2_5_VLProcessor" if qwen2_5 else "Qwen3VLProcessor")
    assert type(processor.video_processor).__name__ == ("Qwen2VLVideoProcessor" if qwen2_5 else "Qwen3VLVideoProcessor")
    stored = spec["preprocessor"] if qwen2_5 else spec["video_preprocessor"]
    video, vision = processor.video_processor, spec["config"]["vision_config"]
    assert (video.patch_size, video.merge_size, video.temporal_patch_size) == (
        stored["patch_size"],
        stored["merge_size"],
        stored["temporal_patch_size"],
    )
    if not qwen2_5:  # Qwen2.5-VL's file states min/max pixels instead
        assert video.size == stored["size"]
    assert (video.patch_size, video.merge_size, video.temporal_patch_size) == (
        vision["patch_size"],
        vision["spatial_merge_size"],
        vision["temporal_patch_size"],
    )
    # The special-token ids (and the text config's pad/eos, whatever the family names them) are the tokenizer's.
    tokenizer_ids = special_token_ids(tokenizer)
    assert {key: getattr(config, key) for key in tokenizer_ids} == tokenizer_ids
    assert (config.text_config.pad_token_id, config.text_config.eos_token_id) == (
        tokenizer.pad_token_id,
        tokenizer.eos_token_id,
    )


def test_the_4b_is_the_published_architecture():
    summary = describe_model("random:Qwen/Qwen3-VL-4B-Instruct")
    assert summary["vision_parameters"] == pytest.approx(415e6, rel=0.01)
    config = checkpoint_spec("random:Qwen/Qwen3-VL-4B-Instruct")["config"]
    text, vision = config["text_config"], config["vision_config"]
    assert (
        text["hidden_size"],
        text["num_hidden_layers"],
        text["num_attention_heads"],
        text["num_key_value_heads"],
        text["head_dim"],
        text["intermediate_size"],
        text["vocab_size"],
    ) == (2560, 36, 32, 8, 128, 9728, 151936)
    assert text["rope_scaling"]["mrope_section"] == [24, 20, 20] and text["rope_scaling"]["mrope_interleaved"]
    assert (
        vision["depth"],
        vision["hidden_size"],
        vision["num_heads"],
        vision["intermediate_size"],
        vision["patch_size"],
        vision["temporal_patch_size"],
        vision["spatial_merge_size"],
        vision["num_position_embeddings"],
        vision["out_hidden_size"],
        vision["deepstack_visual_indexes"],
    ) == (24, 1024, 16, 4096, 16, 2, 2, 2304, 2560, [5, 11, 17])
    assert config["tie_word_embeddings"]


def test_the_qwen3_5_9b_is_the_published_architecture():
    summary = describe_model("random:Qwen/Qwen3.5-9B")
    assert (summary["family"], summary["parameters"], summary["vision_parameters"]) == (
        "qwen3_5",
        9_409_813_744,
        456_010_480,
    )
    assert summary["unbuilt_parameters"] == {"mtp": 243_290_624}
    assert summary["note"] == (
        "the checkpoint's 9,653,104,368 parameters also hold a 243,290,624-parameter multi-token-prediction head "
        "that transformers does not build (halving the Hub index's total_size gives 9,653,108,208, and so "
        "243,294,464 for what is not built, as it counts the 3,840 float32 parameters twice)"
    )
    config = checkpoint_spec("random:Qwen/Qwen3.5-9B")["config"]
    text, vision = config["text_config"], config["vision_config"]
    assert (
        text["hidden_size"],
        text["num_hidden_layers"],
        text["num_attention_heads"],
        text["num_key_value_heads"],
        text["head_dim"],
        text["intermediate_size"],
        text["vocab_size"],
        text["mtp_num_hidden_layers"],
    ) == (4096, 32, 16, 4, 256, 12288, 248320, 1)
    # Hybrid: three Gated DeltaNet (linear attention) layers, then one full-attention layer, eight times over.
    assert text["layer_types"] == (["linear_attention"] * 3 + ["full_attention"]) * 8
    assert text["full_attention_interval"] == 4 and text["attn_output_gate"]
    assert (
        text["linear_num_key_heads"],
        text["linear_num_value_heads"],
        text["linear_key_head_dim"],
        text["linear_value_head_dim"],
        text["linear_conv_kernel_dim"],
    ) == (16, 32, 128, 128, 4)
    assert text["rope_parameters"]["mrope_section"] == [11, 11, 10] and text["rope_parameters"]["mrope_interleaved"]
    assert text["rope_parameters"]["partial_rotary_factor"] == 0.25
    assert (
        vision["depth"],
        vision["hidden_size"],
        vision["num_heads"],
        vision["intermediate_size"],
        vision["patch_size"],
        vision["temporal_patch_size"],
        vision["spatial_merge_size"],
        vision["out_hidden_size"],
        vision["deepstack_visual_indexes"],
    ) == (27, 1152, 16, 4304, 16, 2, 2, 4096, [])
    assert not config["tie_word_embeddings"]


@pytest.mark.parametrize("checkpoint", ["Qwen/Qwen3-VL-8B-Instruct", "Qwen/Qwen3.5-9B"])
def test_describe_on_the_command_line_ends_with_one_json_line(checkpoint):
    result = subprocess.run(
        [sys.executable, "-m", "engine", "--describe", "--model", f"random:{checkpoint}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert {"parameters", "vision_parameters", "family", "dtype", "attention"} <= set(summary)
    assert summary["parameters"] + UNBUILT_MTP.get(checkpoint, 0) == PUBLISHED[checkpoint]
    if checkpoint in UNBUILT_MTP:
        assert summary["unbuilt_parameters"] == {"mtp": UNBUILT_MTP[checkpoint]}
        assert "multi-token-prediction head" in summary["note"] and f"{PUBLISHED[checkpoint]:,}" in summary["note"]
    else:
        assert "unbuilt_parameters" not in summary and "note" not in summary


def test_an_unknown_checkpoint_is_one_sentence():
    with pytest.raises(ModelUnavailable, match="is neither a stored checkpoint"):
        describe_model("random:Qwen/Qwen9-VL-1T")
    result = subprocess.run(
        [sys.executable, "-m", "engine", "--describe", "--model", "random:nope"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and result.stderr.startswith("error: 'random:nope' is neither")
    assert "Traceback" not in result.stderr


# Each family's real spec with fewer and narrower layers, so the whole path runs on a CPU in seconds: the
# real vocabulary, processors, patch/merge geometry, (Qwen3-VL) DeepStack and (Qwen3.5) hybrid layers stay.
SHRINK = {
    "Qwen/Qwen3-VL-4B-Instruct": dict(
        text=dict(
            hidden_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            intermediate_size=256,
            rope_scaling={"rope_type": "default", "mrope_section": [6, 5, 5], "mrope_interleaved": True},
        ),
        vision=dict(
            depth=2,
            hidden_size=64,
            num_heads=2,
            intermediate_size=128,
            out_hidden_size=128,
            deepstack_visual_indexes=[0, 1],
        ),
    ),
    "Qwen/Qwen2.5-VL-3B-Instruct": dict(
        text=dict(
            hidden_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=256,
            rope_scaling={"type": "mrope", "mrope_section": [4, 6, 6]},
        ),
        vision=dict(
            depth=2, hidden_size=64, num_heads=2, intermediate_size=128, out_hidden_size=128, fullatt_block_indexes=[1]
        ),
    ),
    # Hybrid: one group of three Gated DeltaNet layers and a full-attention one; a quarter of head_dim 32 is
    # rotary (8 dims -> 4 frequencies, split 2/1/1 and interleaved).
    "Qwen/Qwen3.5-0.8B": dict(
        text=dict(
            hidden_size=128,
            num_hidden_layers=4,
            layer_types=["linear_attention"] * 3 + ["full_attention"],
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            intermediate_size=256,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=32,
            linear_value_head_dim=32,
            rope_parameters={
                "mrope_interleaved": True,
                "mrope_section": [2, 1, 1],
                "rope_type": "default",
                "rope_theta": 10000000,
                "partial_rotary_factor": 0.25,
            },
        ),
        vision=dict(depth=2, hidden_size=64, num_heads=2, intermediate_size=128, out_hidden_size=128),
    ),
    "Qwen/Qwen3.5-35B-A3B": dict(
        text=dict(
            hidden_size=128,
            num_hidden_layers=4,
            layer_types=["linear_attention"] * 3 + ["full_attention"],
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            shared_expert_intermediate_size=64,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=32,
            linear_value_head_dim=32,
            rope_parameters={
                "mrope_interleaved": True,
                "mrope_section": [2, 1, 1],
                "rope_type": "default",
                "rope_theta": 10000000,
                "partial_rotary_factor": 0.25,
            },
        ),
        vision=dict(depth=2, hidden_size=64, num_heads=2, intermediate_size=128, out_hidden_size=128),
    ),
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
        answer = engine.submit(
            video=clip("moving_object"),
            question="What moves?",
            params=GenerationParams(pruning_rate=0.5, max_new_tokens=4, ignore_eos=True),
        ).result(timeout_s=120)
        loaded = engine.loaded
    finally:
        engine.shutdown()
    spec = checkpoint_spec(f"random:{checkpoint}")
    config = loaded.model.config
    published_vocab = spec["config"].get("text_config", spec["config"])["vocab_size"]  # 151936; Qwen3.5: 248320
    assert config.text_config.vocab_size == loaded.model.get_input_embeddings().weight.shape[0] == published_vocab
    assert loaded.family == config.model_type == FAMILY[checkpoint]
    tokenizer_ids = special_token_ids(build_tokenizer())
    assert {key: getattr(config, key) for key in tokenizer_ids} == tokenizer_ids
    video = loaded.processor.video_processor
    stored = spec.get("video_preprocessor", spec["preprocessor"])
    assert (video.patch_size, video.merge_size, video.temporal_patch_size) == (
        stored["patch_size"],
        stored["merge_size"],
        stored["temporal_patch_size"],
    )
    assert loaded.random_weights and not loaded.is_tiny
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in loaded.model.parameters())
    assert answer.stats["generated_tokens"] == 4
    assert 0 < answer.stats["video_tokens_kept"] < answer.stats["video_tokens_total"]
