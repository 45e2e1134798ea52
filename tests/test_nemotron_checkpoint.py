"""`random:nvidia/Nemotron-3-Nano-Omni-30B-A3B-Reasoning-BF16`: the released config, mapped to transformers'
`nemotron_h_omni`, built at its published size, served through the engine when shrunk, and planned."""

import json

import torch

from engine import Engine, EngineConfig, GenerationParams
from engine.checkpoints.random_weights import checkpoint_spec, spec_config
from engine.loading.load import describe_model
from engine.memory.dims import GIB, MIB
from engine.memory.plan import checkpoint_plan

CHECKPOINT = "nvidia/Nemotron-3-Nano-Omni-30B-A3B-Reasoning-BF16"
# What transformers builds from the spec, and its parts: the language model (NVIDIA-Nemotron-3-Nano-30B-A3B's,
# "31.6B"), RADIO-H and the projector, the Parakeet encoder and its projector.
BUILT = 33_015_727_040
# All but the 122 routed experts of each MoE layer's 128 a token does not use (6 run): 3.58 B of it in the
# language model, the "A3B" ("3.5B active" for the Nano text model), plus the towers and projectors in full.
ACTIVE = 5_017_863_104


def test_the_released_config_maps_to_nemotron_h_omni():
    """The spec keeps the config as released: the remote-code model_type and legacy field names (llm_config,
    sound_config, img_context_token_id, vit_hidden_size, ...), which the mapping and transformers' config class
    turn into the nemotron_h_omni fields."""
    spec = checkpoint_spec(f"random:{CHECKPOINT}")
    assert spec["config"]["model_type"] == "NemotronH_Nano_Omni_Reasoning_V3" and "llm_config" in spec["config"]
    config = spec_config(spec)
    assert config.model_type == "nemotron_h_omni"
    assert (config.image_token_id, config.video_token_id, config.audio_token_id) == (18, 131081, 27)
    assert (config.vision_hidden_size, config.projector_hidden_size, config.video_pruning_rate) == (1280, 20480, 0.7)
    kinds = config.text_config.layer_types
    assert len(kinds) == 52 and [kinds.count(kind) for kind in ("linear_attention", "moe", "full_attention")] == [
        23,
        23,
        6,
    ]
    assert config.audio_config.model_type == "parakeet_encoder" and config.audio_config.num_mel_bins == 128


def test_describe_gives_the_published_size_and_the_active_parameters():
    summary = describe_model(f"random:{CHECKPOINT}")
    spec = checkpoint_spec(f"random:{CHECKPOINT}")
    assert (summary["family"], summary["parameters"], summary["active_parameters"]) == (
        "nemotron_h_omni",
        BUILT,
        ACTIVE,
    )
    assert round(summary["parameters"] / 1e8) * 1e8 == spec["published_parameters_rounded"]  # the Hub's "33.0B"
    assert "unbuilt_parameters" not in summary


def test_the_memory_plan_counts_the_mamba_state():
    """23 Mamba-2 layers keep a conv state (x, B and C: 4,096 + 2 x 8 x 128 channels x 4 taps, bf16) and a
    float32 SSM state (64 heads x 64 x 128) per sequence; 6 of 52 layers keep KV. On an 80 GiB GPU the bf16
    weights (61.5 GiB) leave about 18.5 GiB: room for 9 requests, each with 10 minutes of soundtrack, beside the
    configured 4 live sessions (tests/test_memory_plan.py)."""
    config = spec_config(checkpoint_spec(f"random:{CHECKPOINT}"))
    plan = checkpoint_plan(config, int(18.5 * GIB))
    assert plan.state_bytes_per_sequence == 23 * (6144 * 4 * 2 + 64 * 64 * 128 * 4)
    assert round(plan.state_bytes_per_sequence / MIB, 1) == 47.1
    assert plan.kv_bytes_per_token == 2 * 6 * 2 * 128 * 2
    assert plan.max_running == 9 and plan.max_live_sessions == 4 and plan.max_video_tokens >= 12_544


def shrunk_spec(tmp_path):
    """The spec with few, narrow layers (the released vocabulary, processors and layer kinds stay)."""
    spec = checkpoint_spec(f"random:{CHECKPOINT}")
    config = spec["config"]
    config["llm_config"].update(
        hidden_size=64,
        hybrid_override_pattern="ME*M",
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        mamba_num_heads=4,
        mamba_head_dim=16,
        ssm_state_size=16,
        n_groups=2,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=32,
    )
    config["vision_config"].update(hidden_size=32, num_hidden_layers=1, num_attention_heads=2)
    config["sound_config"].update(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        subsampling_conv_channels=8,
        projection_hidden_size=32,
    )
    config.update(vit_hidden_size=32, projector_hidden_size=64)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def test_a_shrunk_checkpoint_serves_through_the_engine(tmp_path, clip):
    spec_path = shrunk_spec(tmp_path)
    with Engine(EngineConfig(model=f"random:{spec_path}", device="cpu", cache_dir=tmp_path)) as engine:
        answer = engine.submit(
            video=clip("moving_object"),
            question="What moves?",
            params=GenerationParams(pruning_rate=0.5, max_new_tokens=4, ignore_eos=True),
        ).result(120)
        loaded = engine.loaded
        default_rate = engine.model_info["default_pruning_rate"]
    assert loaded.family == "nemotron_h_omni" and loaded.random_weights
    assert loaded.model.get_input_embeddings().weight.shape[0] == 131072
    assert default_rate == 0.7  # the checkpoint's video_pruning_rate
    assert all(p.dtype == torch.float32 for p in loaded.model.parameters())
    assert answer.stats["generated_tokens"] == 4
    assert 0 < answer.stats["video_tokens_kept"] < answer.stats["video_tokens_total"]
