"""Device defaults and the GPU memory plan: the arithmetic on fake free-memory figures for real model sizes,
and an over-plan request through a real tiny-model engine."""

import types
from dataclasses import replace

import numpy as np
import pytest
import torch
from transformers import Qwen3_5Config
from transformers.cache_utils import DynamicCache, LinearAttentionCacheLayerMixin
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextModel
from transformers.video_utils import VideoMetadata

from engine import BusyError, Engine, EngineConfig, GenerationParams, InputError
from engine.__main__ import main as engine_main
from engine.checkpoints.random_weights import checkpoint_spec, spec_config, spec_processor
from engine.checkpoints.tokenizer import build_tokenizer
from engine.config import (
    CPU_FRAME_SAMPLING_LIMITS,
    DEFAULT_PRUNING_RATE,
    GPU_FRAME_SAMPLING,
    GPU_FRAME_SAMPLING_LIMITS,
    FrameSampling,
    default_frame_sampling,
    frame_sampling_limits,
    video_tokens,
)
from engine.families.registry import family_for
from engine.front.metrics import Metrics
from engine.memory.dims import GIB, ModelDims
from engine.memory.plan import InsufficientMemory, PlanSettings, checkpoint_audio_tokens, plan_memory
from engine.prompt.audio import audio_token_count
from engine.reading.frame_sampling import sample_frame_indices

QWEN3_4B = "Qwen/Qwen3-VL-4B-Instruct"
QWEN35_9B = "Qwen/Qwen3.5-9B"
NEMOTRON = "nvidia/Nemotron-3-Nano-Omni-30B-A3B-Reasoning-BF16"
FRAME_SAMPLING = FrameSampling(fps=4.0, max_frames=8, max_pixels_per_frame=160 * 128)  # 4 groups x 5x4 tokens


def config_of(checkpoint: str):
    return spec_config(checkpoint_spec(checkpoint))


def gpu_video_tokens(checkpoint: str, frames: int, pixels: int = GPU_FRAME_SAMPLING.max_pixels_per_frame) -> int:
    vision = config_of(checkpoint).vision_config
    return video_tokens(frames, pixels, vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size)


@pytest.fixture(scope="module")
def qwen3_4b() -> ModelDims:
    return ModelDims.from_config(config_of(QWEN3_4B), dtype_bytes=2)


@pytest.fixture(scope="module")
def qwen35_9b() -> ModelDims:
    return ModelDims.from_config(config_of(QWEN35_9B), dtype_bytes=2)


def settings(planned_video_tokens: int = 12_544, **overrides) -> PlanSettings:
    return PlanSettings(planned_video_tokens=planned_video_tokens, **overrides)


# --- default sampling by device ------------------------------------------------------------------


def test_cpu_defaults_are_unchanged():
    """The CPU tests and tiny models are sized for 32 frames at 224x224; the GPU defaults must not leak."""
    assert (
        default_frame_sampling("cpu")
        == FrameSampling()
        == FrameSampling(fps=2.0, max_frames=32, max_pixels_per_frame=224 * 224)
    )
    assert frame_sampling_limits("cpu") == CPU_FRAME_SAMPLING_LIMITS
    assert (CPU_FRAME_SAMPLING_LIMITS.max_fps, CPU_FRAME_SAMPLING_LIMITS.max_frames) == (8.0, 128)
    assert CPU_FRAME_SAMPLING_LIMITS.max_pixels_per_frame == 32 * 112 * 112


def test_gpu_defaults_give_a_90_second_clip_about_ten_thousand_video_tokens():
    """On a GPU the old defaults (about 800 video tokens) showed almost nothing of EVS."""
    assert (
        default_frame_sampling("cuda")
        == GPU_FRAME_SAMPLING
        == FrameSampling(fps=2.0, max_frames=128, max_pixels_per_frame=448 * 448)
    )
    assert frame_sampling_limits("cuda") == GPU_FRAME_SAMPLING_LIMITS
    frames = len(sample_frame_indices(90.0, 90 * 30, GPU_FRAME_SAMPLING))  # 180 frames at 2 fps, capped
    assert frames == 128
    # Qwen3-VL: 32x32 pixels x 2 frames per token -> 64 groups x (448/32)^2 = 64 x 196.
    assert gpu_video_tokens(QWEN3_4B, frames) == 64 * 196 == 12_544
    # Qwen2.5-VL: 28x28 pixels -> 64 x 16^2.
    assert gpu_video_tokens("Qwen/Qwen2.5-VL-7B-Instruct", frames) == 64 * 256
    assert gpu_video_tokens(QWEN3_4B, 32, 224 * 224) == 16 * 49  # the CPU defaults: 784
    assert gpu_video_tokens(QWEN3_4B, 127) == 63 * 196  # frames go in whole temporal groups


@pytest.mark.parametrize(
    "checkpoint, family, per_group", [(QWEN3_4B, "qwen3_vl", 196), ("Qwen/Qwen2.5-VL-7B-Instruct", "qwen2_5_vl", 256)]
)
def test_the_checkpoints_own_processor_agrees_with_the_token_arithmetic(checkpoint, family, per_group):
    """video_tokens is an upper bound the plan relies on: the real processor never gives a group more."""
    processor = spec_processor(checkpoint_spec(checkpoint), family, build_tokenizer())
    config = config_of(checkpoint)
    assert config.model_type == family
    loaded = types.SimpleNamespace(processor=processor, model=types.SimpleNamespace(config=config))
    merge = config.vision_config.spatial_merge_size
    for height, width in [(448, 448), (720, 1280), (1080, 1920)]:
        frames = np.zeros((4, height, width, 3), np.uint8)
        metadata = VideoMetadata(
            total_num_frames=4, fps=2.0, frames_indices=[0, 1, 2, 3], duration=2.0, height=height, width=width
        )
        size_kwargs = family_for(loaded.model).sized_processor(processor, 4, GPU_FRAME_SAMPLING.max_pixels_per_frame)[1]
        out = processor.video_processor(
            videos=[frames], video_metadata=[metadata], do_sample_frames=False, return_tensors="pt", **size_kwargs
        )
        groups, h, w = out["video_grid_thw"][0].tolist()
        assert groups == 2 and (h // merge) * (w // merge) <= per_group
        if height == width:
            assert (h // merge) * (w // merge) == per_group


# --- the plan's arithmetic -----------------------------------------------------------------------


def test_kv_bytes_per_token_of_qwen3_vl_4b(qwen3_4b):
    """2 (K and V) x 36 layers x 8 KV heads x head_dim 128 x 2 bytes (bf16)."""
    assert (qwen3_4b.text_layers, qwen3_4b.kv_heads, qwen3_4b.head_dim) == (36, 8, 128)
    assert qwen3_4b.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2 == 147_456
    plan = plan_memory(qwen3_4b, 40 * GIB, settings())
    assert plan.kv_bytes_per_token == 147_456
    # Qwen2.5-VL has no head_dim in its config: hidden 3584 / 28 heads = 128.
    qwen25 = ModelDims.from_config(config_of("Qwen/Qwen2.5-VL-7B-Instruct"), dtype_bytes=2)
    assert qwen25.kv_bytes_per_token == 2 * 28 * 4 * 128 * 2


def planned_peak_bytes(dims: ModelDims, s: PlanSettings, rows: int, video: int) -> int:
    """The memory model written out again, independently of plan_memory's code."""
    kv_row = s.kv_copies * (
        dims.kv_bytes_per_token * (video + s.text_tokens + s.new_tokens + s.spare_tokens)
        + dims.state_bytes_per_sequence
    )
    row = kv_row + dims.feature_bytes_per_video_token * video
    vit = dims.vit_bytes(max(s.vit_patch_budget, video * dims.merge_patches))
    prefill = dims.prefill_bytes(video + s.text_tokens + s.new_tokens)
    return rows * row + max(vit, prefill)


@pytest.mark.parametrize("free_gib, running", [(40, 4), (130, 14)])
def test_plans_for_an_l40s_and_an_h200(qwen3_4b, free_gib, running):
    """Qwen3-VL-4B at the GPU defaults (12,544 video tokens, worst case q = 0): a request's KV row is
    17,920 tokens x 147,456 bytes x 3 (batch rebuild) plus 12,544 x 40,960 bytes of features = 7.86 GiB;
    40 GiB leaves 34 GiB after the 10% margin and 2 GiB of caches, less 2.4 GiB for one ViT forward:
    4 rows. 130 GiB (an H200 after loading) leaves 112.6 GiB: 14 rows."""
    s = settings()
    plan = plan_memory(qwen3_4b, free_gib * GIB, s)
    assert plan.max_running == running
    assert plan.max_video_tokens == 12_544  # the planned size: 16 rows of anything larger do not fit
    assert plan.max_request_tokens == 12_544 + s.text_tokens + s.new_tokens
    usable = int(free_gib * GIB * (1 - s.margin_fraction)) - s.reserved_bytes
    assert planned_peak_bytes(qwen3_4b, s, plan.max_running, plan.max_video_tokens) <= usable
    assert planned_peak_bytes(qwen3_4b, s, plan.max_running + 1, plan.max_video_tokens) > usable  # tight
    assert f"{free_gib:.1f} GiB free" in plan.summary() and "147456 bytes/token" in plan.summary()


def test_a_capped_plan_lets_one_request_grow_while_every_row_still_fits(qwen3_4b):
    """When the configured max_running rows of the planned size fit with room to spare, the room goes to
    larger videos, and max_running rows of that larger size must still fit."""
    s = settings(max_running=4)
    plan = plan_memory(qwen3_4b, 130 * GIB, s)
    usable = int(130 * GIB * (1 - s.margin_fraction)) - s.reserved_bytes
    assert plan.max_running == 4 and plan.max_video_tokens > 12_544
    assert planned_peak_bytes(qwen3_4b, s, 4, plan.max_video_tokens) <= usable
    assert planned_peak_bytes(qwen3_4b, s, 4, plan.max_video_tokens + 1) > usable


def test_more_memory_never_lowers_a_limit(qwen3_4b):
    previous = None
    for free_gib in np.arange(4.0, 200.0, 0.25):
        plan = plan_memory(qwen3_4b, int(free_gib * GIB), settings())
        if previous is not None:
            assert plan.max_running >= previous.max_running, free_gib
            assert plan.max_video_tokens >= previous.max_video_tokens, free_gib
            assert plan.max_request_tokens >= previous.max_request_tokens, free_gib
        previous = plan
    assert previous.max_running == 16  # the configured ceiling


def test_more_frames_per_request_lower_max_running(qwen3_4b):
    counts = [
        plan_memory(qwen3_4b, 130 * GIB, settings(gpu_video_tokens(QWEN3_4B, frames))).max_running
        for frames in (16, 32, 64, 128, 256, 512)
    ]
    assert counts == sorted(counts, reverse=True)
    assert counts[0] == 16 and counts[-1] < counts[3] < counts[0]


def test_too_little_memory_serves_one_smaller_request_at_a_time(qwen3_4b):
    plan = plan_memory(qwen3_4b, 10 * GIB, settings())
    assert plan.max_running == 1 and 0 < plan.max_video_tokens < 12_544
    assert "not even one request" in plan.reasons[-1]
    starved = plan_memory(qwen3_4b, 1 * GIB, settings())  # less than the caches' own bounds
    assert starved.max_running == 1 and starved.max_video_tokens == 0
    with pytest.raises(InputError, match="fewer frames or fewer pixels per frame"):
        starved.check_fits(video_tokens=4, prompt_tokens=40, max_new_tokens=8)


def test_the_refusals_say_what_to_lower(qwen3_4b):
    plan = plan_memory(qwen3_4b, 40 * GIB, settings())
    plan.check_fits(video_tokens=12_544, prompt_tokens=13_300, max_new_tokens=1024)  # fits: no error
    with pytest.raises(InputError, match=r"12,545 video tokens.*choose fewer frames or fewer pixels per frame\.$"):
        plan.check_fits(video_tokens=12_545, prompt_tokens=13_000, max_new_tokens=16)
    with pytest.raises(InputError, match="ask for fewer new tokens, start a new conversation"):
        plan.check_fits(video_tokens=12_544, prompt_tokens=14_000, max_new_tokens=4096)


# --- hybrid models (Qwen3.5 / 3.6) and mixtures of experts ---------------------------------------


def test_a_hybrid_model_keeps_kv_only_in_its_full_attention_layers(qwen35_9b, qwen3_4b):
    """Qwen3.5-9B (the published config: 32 layers, every 4th full attention, 4 KV heads of 256): KV in 8
    layers, and per sequence 24 Gated DeltaNet layers' conv state (2 x 16 x 128 + 32 x 128 = 8,192 channels
    x kernel 4, bf16) and recurrent state (32 value heads x 128 x 128, float32)."""
    text = config_of(QWEN35_9B).text_config
    assert (text.hidden_size, text.num_hidden_layers, text.num_key_value_heads, text.head_dim) == (4096, 32, 4, 256)
    assert text.layer_types == (["linear_attention"] * 3 + ["full_attention"]) * 8
    assert (
        text.linear_num_key_heads,
        text.linear_num_value_heads,
        text.linear_key_head_dim,
        text.linear_value_head_dim,
        text.linear_conv_kernel_dim,
    ) == (16, 32, 128, 128, 4)
    assert (qwen35_9b.text_layers, qwen35_9b.kv_layers) == (32, 8)
    assert qwen35_9b.kv_bytes_per_token == 2 * 8 * 4 * 256 * 2 == 32_768
    assert qwen35_9b.linear.conv_dim == 8192
    assert qwen35_9b.state_bytes_per_sequence == 24 * (8192 * 4 * 2 + 32 * 128 * 128 * 4) == 51_904_512
    plan = plan_memory(qwen35_9b, 40 * GIB, settings())
    assert (plan.kv_bytes_per_token, plan.state_bytes_per_sequence) == (32_768, 51_904_512)
    assert "state 49.5 MiB/sequence + KV 32768 bytes/token (8 of 32 layers)" in plan.summary()
    assert any(line.startswith("linear-attention state: 49.5 MiB per sequence (24 layers") for line in plan.reasons)
    # KV-only families: every layer keeps KV, no state.
    assert qwen3_4b.kv_layers == qwen3_4b.text_layers == 36 and qwen3_4b.state_bytes_per_sequence == 0
    assert "state" not in plan_memory(qwen3_4b, 40 * GIB, settings()).summary()


TINY_HYBRID_TEXT = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=4,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=16,
    layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
    # Key and value head dims differ, and the kernel is not 4, so a swapped or misread size shows.
    linear_num_key_heads=2,
    linear_num_value_heads=6,
    linear_key_head_dim=8,
    linear_value_head_dim=12,
    linear_conv_kernel_dim=3,
)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_state_and_kv_bytes_are_what_transformers_allocates(dtype):
    """A tiny Qwen3.5 text model run through one prefill: the conv and recurrent states its cache holds sum to
    ModelDims' state per sequence, and its KV to kv_bytes_per_token per token."""
    config = Qwen3_5Config(
        text_config=TINY_HYBRID_TEXT,
        vision_config=dict(depth=1, hidden_size=16, num_heads=2, intermediate_size=32, out_hidden_size=32),
    )
    dims = ModelDims.from_config(config, dtype_bytes=dtype.itemsize)
    torch.manual_seed(0)
    model = Qwen3_5TextModel(config.text_config).to(dtype).eval()
    cache = DynamicCache(config=config.text_config)
    tokens = 7
    with torch.inference_mode():
        model(input_ids=torch.arange(tokens)[None], cache=cache, use_cache=True)
    state = kv = 0
    for layer in cache.layers:
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            assert layer.recurrent_states[0].dtype == torch.float32  # whatever the model dtype
            state += layer.conv_states[0].nbytes + layer.recurrent_states[0].nbytes
        else:
            kv += layer.keys.nbytes + layer.values.nbytes
    assert (dims.kv_layers, dims.linear.layers) == (1, 3)
    assert state == dims.state_bytes_per_sequence > 0
    assert kv == tokens * dims.kv_bytes_per_token


@pytest.mark.parametrize("free_gib, running, video", [(40, 15, 12_544), (130, 16, 53_477)])
def test_qwen35_9b_plans_for_an_l40s_and_an_h200(qwen35_9b, free_gib, running, video):
    """Qwen3.5-9B at the GPU defaults: a row is 3 x (17,920 tokens x 32,768 bytes + 49.5 MiB of state) plus
    12,544 x 16,384 bytes of features = 1.98 GiB; one prefill of 17,664 tokens peaks in a linear-attention
    layer at 245,760 bytes a token (4.04 GiB, more than the ViT's 2.30). 40 GiB leaves 34 GiB usable:
    15 rows. 130 GiB leaves 115 GiB: 56 rows, capped at 16, and 16 rows of up to 53,477 video tokens fit."""
    s = settings()
    plan = plan_memory(qwen35_9b, free_gib * GIB, s)
    assert (plan.max_running, plan.max_video_tokens) == (running, video)
    assert qwen35_9b.prefill_bytes(1) == 245_760
    usable = int(free_gib * GIB * (1 - s.margin_fraction)) - s.reserved_bytes
    assert planned_peak_bytes(qwen35_9b, s, running, video) <= usable
    if running < s.max_running:
        assert planned_peak_bytes(qwen35_9b, s, running + 1, video) > usable
    else:
        assert planned_peak_bytes(qwen35_9b, s, running, video + 1) > usable


@pytest.mark.parametrize("free_gib, hybrid, kv_only", [(40, 15, 4), (130, 56, 16)])
def test_a_hybrid_model_fits_more_requests_than_if_every_layer_kept_kv(qwen35_9b, free_gib, hybrid, kv_only):
    """The same model with all 32 layers attending (131,072 bytes a token, no state) fits under a third as many
    rows: the state costs 49.5 MiB a row, the 24 layers' KV would cost 1.64 GiB at 17,920 tokens."""
    everywhere = replace(qwen35_9b, kv_layers=32, linear=None)
    assert everywhere.kv_bytes_per_token == 4 * qwen35_9b.kv_bytes_per_token == 131_072
    s = settings(max_running=64)  # above both, to compare the uncapped counts
    assert plan_memory(qwen35_9b, free_gib * GIB, s).max_running == hybrid
    assert plan_memory(everywhere, free_gib * GIB, s).max_running == kv_only


def test_more_memory_never_lowers_a_hybrid_limit(qwen35_9b):
    previous = None
    for free_gib in np.arange(4.0, 200.0, 0.5):
        plan = plan_memory(qwen35_9b, int(free_gib * GIB), settings())
        if previous is not None:
            assert plan.max_running >= previous.max_running, free_gib
            assert plan.max_video_tokens >= previous.max_video_tokens, free_gib
            assert plan.max_request_tokens >= previous.max_request_tokens, free_gib
        previous = plan
    assert previous.max_running == 16


def test_mixtures_of_experts_plan_their_routed_width():
    """Qwen3.5-35B-A3B (hybrid MoE, no dense intermediate_size): 8 routed experts of 512 plus a shared one of
    512; its prefill still peaks in a linear-attention layer. Qwen3-VL-30B-A3B (KV-only MoE): 8 experts of
    768, and the grouped experts kernel's 4 copies of each token's hidden state per expert dominate."""
    moe35 = ModelDims.from_config(config_of("Qwen/Qwen3.5-35B-A3B"), dtype_bytes=2)
    assert (moe35.text_intermediate, moe35.experts_per_token) == (8 * 512 + 512, 8)
    assert (moe35.kv_layers, moe35.linear.layers) == (10, 30)
    experts = 2 * (4 * 2048 + 3 * 4608 + 4 * 8 * 2048)  # 175,104 bytes a token
    linear = 4 * (6 * 4096 + 4 * 4096 + 3 * 32 * 64) + 2 * (4 * 2048 + 8192 + 4096)
    assert moe35.prefill_bytes(1) == max(experts, linear) == linear == 229_376
    vl_moe = ModelDims.from_config(config_of("Qwen/Qwen3-VL-30B-A3B-Instruct"), dtype_bytes=2)
    assert vl_moe.kv_layers == vl_moe.text_layers == 48 and vl_moe.state_bytes_per_sequence == 0
    assert (vl_moe.text_intermediate, vl_moe.experts_per_token) == (8 * 768, 8)
    assert vl_moe.prefill_bytes(1) == 2 * (4 * 2048 + 3 * 6144 + 4 * 8 * 2048) == 184_320


def test_a_model_that_hears_plans_its_longest_soundtrack():
    """Nemotron-H Omni hears up to max_soundtrack_seconds (10 minutes) of each upload: 7,501 audio tokens (12.5 a
    second) in every row's KV and in the prefill, and the audio tower's forward, whose relative-position scores
    (8 heads x 7,501 x 2 x 7,501 in bf16, three alive at once) alone take 5.0 GiB. With 18.5 GiB free (an 80 GiB
    GPU after loading) 10 requests fit where 16 would without a soundtrack; a model that cannot hear plans none."""
    config = config_of(NEMOTRON)
    dims = ModelDims.from_config(config, dtype_bytes=2)
    audio = checkpoint_audio_tokens(config, 600.0)
    assert audio == 7_501
    scores = 3 * 8 * 7_501 * 2 * 7_501 * 2
    assert scores < dims.audio_bytes(audio) < 1.1 * scores
    free = int(18.5 * GIB)
    heard, deaf = plan_memory(dims, free, settings(planned_audio_tokens=audio)), plan_memory(dims, free, settings())
    assert (heard.max_running, deaf.max_running) == (10, 16)
    assert heard.max_request_tokens == heard.max_video_tokens + audio + 4096 + 1024
    assert any(f"+{audio:,} audio" in reason for reason in heard.reasons)
    assert ModelDims.from_config(config_of(QWEN3_4B), dtype_bytes=2).audio is None
    # Half an hour (22,501 tokens): the audio forward alone, 46 GiB, is more than the 80 GiB GPU has left,
    # though the prefill of so many tokens (11 GiB) would fit: no request fits.
    too_long = plan_memory(dims, free, settings(planned_audio_tokens=checkpoint_audio_tokens(config, 1800.0)))
    assert too_long.max_video_tokens == 0


def test_an_engine_that_hears_plans_with_its_processors_count(tiny_cache_dir):
    """The engine counts the longest soundtrack's tokens with its processor, as it counts them for each request;
    the plan of a checkpoint's config alone (checkpoint_audio_tokens) comes to the same count."""
    config = EngineConfig(
        model="tiny-random-nemotron-omni",
        device="cpu",
        cache_dir=tiny_cache_dir,
        frame_sampling=FRAME_SAMPLING,
        memory_budget_bytes=3 * GIB,
        max_soundtrack_seconds=60.0,
    )
    with Engine(config) as engine:
        plan, loaded = engine.memory_plan, engine.loaded
    audio = audio_token_count(loaded.processor, 60 * 16000)
    assert audio == checkpoint_audio_tokens(loaded.model.config, 60.0) == 751
    assert plan.max_request_tokens == plan.max_video_tokens + audio + PlanSettings.text_tokens + PlanSettings.new_tokens


def test_the_command_line_prints_a_checkpoints_plan_without_a_gpu(capsys):
    assert engine_main(["--model", f"random:{QWEN35_9B}", "--plan-gib", "40", "130"]) == 0
    out = capsys.readouterr().out
    assert (
        "memory plan: 40.0 GiB free, state 49.5 MiB/sequence + KV 32768 bytes/token (8 of 32 layers), "
        "at most 12,544 video tokens per request, 14 requests decoding together, 4 live sessions" in out
    )
    assert "live sessions: 4 of the 4 configured, 0.56 GiB each" in out
    assert "at most 52,313 video tokens per request, 16 requests decoding together" in out
    assert "54 requests of 12,544 video tokens fit, capped at the configured 16" in out
    assert engine_main(["--model", "random:no/such-checkpoint", "--plan-gib", "40"]) == 2
    assert "error: cannot plan 'random:no/such-checkpoint': " in capsys.readouterr().err


# --- through a real engine -----------------------------------------------------------------------


def test_a_cpu_engine_has_no_memory_plan_and_the_cpu_defaults(tiny_cache_dir):
    with Engine(EngineConfig(model="tiny-random", device="cpu", cache_dir=tiny_cache_dir)) as engine:
        assert engine.default_frame_sampling == FrameSampling()
        assert engine.frame_sampling_limits == CPU_FRAME_SAMPLING_LIMITS
        plan = engine.memory_plan
        assert not plan.bounded and plan.max_video_tokens is None and plan.max_running == 16
        plan.check_fits(video_tokens=10**9, prompt_tokens=10**9, max_new_tokens=4096)  # never refuses
        assert "memory plan: none" in plan.summary()


@pytest.fixture(scope="module")
def small_plan_engine(tiny_cache_dir):
    """A tiny-model engine whose plan is forced: the caches' bounds plus 100 MiB after the 10% margin. The
    tiny model's KV is 768 bytes a token (2 x 3 layers x 2 heads x 16 x 4 bytes, float32), so a row planned
    for the default 80 video tokens (+5,376 others, x3) is 12.7 MB; one ViT forward over the CPU's
    4,096-patch budget takes 55 MB (float32 pixels): 3 rows fit, 16 rows of anything more do not."""
    budget = int((2 * GIB + 100 * 1024**2) / 0.9)
    config = EngineConfig(
        model="tiny-random",
        device="cpu",
        cache_dir=tiny_cache_dir,
        frame_sampling=FRAME_SAMPLING,
        memory_budget_bytes=budget,
        max_live_sessions=0,
    )
    with Engine(config) as engine:
        yield engine


def test_a_forced_plan_bounds_the_engine(small_plan_engine):
    plan = small_plan_engine.memory_plan
    assert plan.bounded and plan.kv_bytes_per_token == 768
    assert plan.max_video_tokens == 80 and plan.max_running == 3


def test_an_over_plan_video_is_refused_with_a_sentence_and_the_engine_keeps_serving(small_plan_engine, clip):
    video = clip("moving_object", seconds=2.0)  # 16 frames at 8 fps
    larger = GenerationParams(
        max_new_tokens=4, frame_sampling=FrameSampling(fps=8.0, max_frames=16, max_pixels_per_frame=160 * 128)
    )
    refused = small_plan_engine.submit(video, "What moves?", larger)
    with pytest.raises(
        InputError,
        match=r"^This video comes to 160 video tokens, more than the 80 .*"
        r"choose fewer frames or fewer pixels per frame\.$",
    ):
        refused.result(60)
    served = small_plan_engine.submit(video, "What moves?", GenerationParams(max_new_tokens=4)).result(60)
    assert served.stats["video_tokens_total"] == 80 and served.stats["generated_tokens"] == 4


def test_a_conversation_over_the_plan_is_refused_with_a_sentence(small_plan_engine, clip):
    """The tiny tokenizer is one token per byte: 6,000 characters of history pass 80 + 4,096 + 1,024."""
    history = [("What moves?", "A square " * 700)]
    refused = small_plan_engine.submit(
        clip("moving_object"), "And then?", GenerationParams(max_new_tokens=4), history=history
    )
    with pytest.raises(InputError, match="ask for fewer new tokens, start a new conversation"):
        refused.result(60)


def test_the_plan_caps_requests_decoding_together(small_plan_engine, clip):
    videos = [clip(kind) for kind in ("moving_object", "pan", "scene_cut")]
    with small_plan_engine.paused():
        streams = [
            small_plan_engine.submit(
                videos[i % 3],
                "What happens?",
                GenerationParams(pruning_rate=0.1 * i, max_new_tokens=6, ignore_eos=True),
            )
            for i in range(5)
        ]
    most = max(stream.result(120).stats["decode_batch_max"] for stream in streams)
    assert most == 3  # 5 requests, EngineConfig.max_running 16, the plan's 3


# --- the UI follows the engine's device ----------------------------------------------------------


class GpuLikeEngine:
    """What build_demo reads from an engine, as a GPU engine answers it (no model behind it)."""

    model_info = {
        "name": "Qwen/Qwen3-VL-4B-Instruct",
        "device": "cuda:0",
        "is_tiny": False,
        "default_pruning_rate": DEFAULT_PRUNING_RATE,
        "thinks": False,
        "hears": False,
        "skips_still_patches": True,
    }
    default_frame_sampling = GPU_FRAME_SAMPLING
    frame_sampling_limits = GPU_FRAME_SAMPLING_LIMITS
    metrics = Metrics(running=lambda: 0)


def test_sliders_and_api_defaults_follow_the_engines_device():
    import ui

    demo = ui.build_demo(GpuLikeEngine())
    sliders = {block.elem_id: block for block in demo.blocks.values() if getattr(block, "elem_id", None)}
    assert (sliders["evs-fps"].value, sliders["evs-max-frames"].value) == (2.0, 128)
    assert sliders["evs-max-frames"].maximum == GPU_FRAME_SAMPLING_LIMITS.max_frames
    assert sliders["evs-max-pixels"].value == 448 * 448
    assert sliders["evs-max-pixels"].maximum == 896 * 896 and "448 × 448 = 200,704" in sliders["evs-max-pixels"].info
    parameters = demo.get_api_info()["named_endpoints"]["/ask"]["parameters"]
    names = [p["parameter_name"] for p in parameters]
    assert names == [
        "video",
        "question",
        "pruning_rate",
        "fps",
        "max_frames",
        "max_pixels_per_frame",
        "max_new_tokens",
        "temperature",
        "compare",
        "history",
        "enable_thinking",
        "hear_soundtrack",
        "pruning_method",
        "compare_methods",
        "media",
        "skip_still_patches",
    ]
    defaults = {p["parameter_name"]: p["parameter_default"] for p in parameters}
    assert (defaults["fps"], defaults["max_frames"], defaults["max_pixels_per_frame"]) == (2.0, 128, 200_704)


def test_ask_called_without_sampling_uses_the_engines_device_defaults(clip):
    """Python callers of Handlers.ask (not the API, whose defaults are the sliders') get the device's too."""
    import asyncio

    import gradio as gr

    from ui.handlers import Handlers

    class Recording(GpuLikeEngine):
        submitted: list = []

        def submit(self, video=None, question=None, params=None, history=(), media=None, client=None):
            self.submitted.append(params)
            raise InputError("recorded")

    engine = Recording()

    async def ask():
        async for _ in Handlers(engine).ask(str(clip("moving_object")), "What moves?"):
            pass

    with pytest.raises(gr.Error, match="recorded"):
        asyncio.run(ask())
    assert engine.submitted[0].frame_sampling == GPU_FRAME_SAMPLING


def test_an_engine_without_room_for_a_small_request_refuses_to_start(tiny_cache_dir):
    """Less device memory than the caches' own bounds: one sentence at start, not a server that refuses all."""
    config = EngineConfig(
        model="tiny-random",
        device="cpu",
        cache_dir=tiny_cache_dir,
        frame_sampling=FRAME_SAMPLING,
        memory_budget_bytes=1 * GIB,
    )
    with pytest.raises(
        InsufficientMemory,
        match=r"GPU has 1\.0 GiB free, room for 0 video tokens per request, "
        r"fewer than the 80 of a small clip",
    ):
        Engine(config)


def test_live_sessions_are_planned_first_and_only_as_many_as_leave_room_for_one_request(qwen3_4b):
    """Each live session keeps its window's KV once, outside the batch: 4 sessions of 12,544 tokens on
    Qwen3-VL-4B (147,456 bytes a token, with 4,096 text and 256 spare) take 2.3 GiB before the rows are planned;
    with too little memory, fewer sessions are allowed so that one request still fits."""
    live_row = 147_456 * (12_544 + 4096 + 256)
    none = plan_memory(qwen3_4b, 40 * GIB, settings())
    four = plan_memory(qwen3_4b, 40 * GIB, settings(live_sessions=4, live_window_tokens=12_544))
    assert four.max_live_sessions == 4 and none.max_live_sessions == 0
    assert four.max_running == plan_memory(qwen3_4b, 40 * GIB - round(4 * live_row / 0.9), settings()).max_running
    assert four.max_running < none.max_running
    tight = plan_memory(qwen3_4b, 20 * GIB, settings(live_sessions=4, live_window_tokens=12_544))
    assert 0 < tight.max_live_sessions < 4 and tight.max_running >= 1
    assert any(f"live sessions: {tight.max_live_sessions} of the 4 configured" in r for r in tight.reasons)


def test_a_forced_plan_refuses_the_session_past_what_it_allows_with_a_sentence(tiny_cache_dir):
    """The small plan's engine with a window of 80 tokens: each session 3.4 MB of KV (768 bytes x (80 +
    4,096 + 256)); the configured 1,000 cannot fit, the plan allows what leaves room for one request."""
    budget = int((2 * GIB + 100 * 1024**2) / 0.9)
    config = EngineConfig(
        model="tiny-random",
        device="cpu",
        cache_dir=tiny_cache_dir,
        frame_sampling=FRAME_SAMPLING,
        memory_budget_bytes=budget,
        max_live_sessions=1000,
    )
    with Engine(config) as engine:
        allowed = engine.memory_plan.max_live_sessions
        assert 0 < allowed < 1000 and engine.memory_plan.max_running == 1
        sessions = [engine.open_live() for _ in range(allowed)]
        with pytest.raises(BusyError, match=f"already has {allowed} live sessions open"):
            engine.open_live()
        for session in sessions:
            session.close()
