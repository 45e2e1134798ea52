"""Device defaults and the GPU memory plan: the arithmetic on fake free-memory figures for real model sizes,
and an over-plan request through a real tiny-model engine."""

import types

import numpy as np
import pytest
from transformers.video_utils import VideoMetadata

from engine import Engine, EngineConfig, GenerationParams, InputError
from engine.config import (
    CPU_SAMPLING_LIMITS,
    GPU_SAMPLING,
    GPU_SAMPLING_LIMITS,
    SamplingParams,
    default_sampling,
    sampling_limits,
    video_tokens,
)
from engine.memory_plan import GIB, InsufficientMemory, ModelDims, PlanSettings, plan_memory
from engine.models import processor_video_kwargs
from engine.random_checkpoints import checkpoint_spec, spec_config, spec_processor
from engine.tiny import build_tokenizer
from engine.video import sample_frame_indices

QWEN3_4B = "Qwen/Qwen3-VL-4B-Instruct"
SAMPLING = SamplingParams(fps=4.0, max_frames=8, max_pixels_per_frame=160 * 128)  # 4 groups x 5x4 tokens


def config_of(checkpoint: str):
    return spec_config(checkpoint_spec(checkpoint))


def gpu_video_tokens(checkpoint: str, frames: int, pixels: int = GPU_SAMPLING.max_pixels_per_frame) -> int:
    vision = config_of(checkpoint).vision_config
    return video_tokens(frames, pixels, vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size)


@pytest.fixture(scope="module")
def qwen3_4b() -> ModelDims:
    return ModelDims.from_config(config_of(QWEN3_4B), dtype_bytes=2)


def settings(planned_video_tokens: int = 12_544, **overrides) -> PlanSettings:
    return PlanSettings(planned_video_tokens=planned_video_tokens, **overrides)


# --- default sampling by device ------------------------------------------------------------------

def test_cpu_defaults_are_unchanged():
    """The CPU tests and tiny models are sized for 32 frames at 224x224; the GPU defaults must not leak."""
    assert default_sampling("cpu") == SamplingParams() == SamplingParams(fps=2.0, max_frames=32,
                                                                         max_pixels_per_frame=224 * 224)
    assert sampling_limits("cpu") == CPU_SAMPLING_LIMITS
    assert (CPU_SAMPLING_LIMITS.max_fps, CPU_SAMPLING_LIMITS.max_frames) == (8.0, 128)
    assert CPU_SAMPLING_LIMITS.max_pixels_per_frame == 32 * 112 * 112


def test_gpu_defaults_give_a_90_second_clip_about_ten_thousand_video_tokens():
    """On a GPU the old defaults (about 800 video tokens) showed almost nothing of EVS."""
    assert default_sampling("cuda") == GPU_SAMPLING == SamplingParams(fps=2.0, max_frames=128,
                                                                      max_pixels_per_frame=448 * 448)
    assert sampling_limits("cuda") == GPU_SAMPLING_LIMITS
    frames = len(sample_frame_indices(90.0, 90 * 30, GPU_SAMPLING))  # 180 frames at 2 fps, capped
    assert frames == 128
    # Qwen3-VL: 32x32 pixels x 2 frames per token -> 64 groups x (448/32)^2 = 64 x 196.
    assert gpu_video_tokens(QWEN3_4B, frames) == 64 * 196 == 12_544
    # Qwen2.5-VL: 28x28 pixels -> 64 x 16^2.
    assert gpu_video_tokens("Qwen/Qwen2.5-VL-7B-Instruct", frames) == 64 * 256
    assert gpu_video_tokens(QWEN3_4B, 32, 224 * 224) == 16 * 49  # the CPU defaults: 784
    assert gpu_video_tokens(QWEN3_4B, 127) == 63 * 196  # frames go in whole temporal groups


@pytest.mark.parametrize("checkpoint, family, per_group", [(QWEN3_4B, "qwen3_vl", 196),
                                                           ("Qwen/Qwen2.5-VL-7B-Instruct", "qwen2_5_vl", 256)])
def test_the_checkpoints_own_processor_agrees_with_the_token_arithmetic(checkpoint, family, per_group):
    """video_tokens is an upper bound the plan relies on: the real processor never gives a group more."""
    processor = spec_processor(checkpoint_spec(checkpoint), family, build_tokenizer())
    config = config_of(checkpoint)
    assert config.model_type == family
    loaded = types.SimpleNamespace(processor=processor, model=types.SimpleNamespace(config=config))
    merge = config.vision_config.spatial_merge_size
    for height, width in [(448, 448), (720, 1280), (1080, 1920)]:
        frames = np.zeros((4, height, width, 3), np.uint8)
        metadata = VideoMetadata(total_num_frames=4, fps=2.0, frames_indices=[0, 1, 2, 3], duration=2.0,
                                 height=height, width=width)
        out = processor.video_processor(videos=[frames], video_metadata=[metadata], do_sample_frames=False,
                                        return_tensors="pt",
                                        **processor_video_kwargs(loaded, 4, GPU_SAMPLING.max_pixels_per_frame))
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
    kv_row = s.kv_copies * dims.kv_bytes_per_token * (video + s.text_tokens + s.new_tokens + s.spare_tokens)
    row = kv_row + dims.feature_bytes_per_video_token * video
    vit = dims.vit_bytes(max(s.vit_patches, video * dims.merge_patches))
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
    counts = [plan_memory(qwen3_4b, 130 * GIB, settings(gpu_video_tokens(QWEN3_4B, frames))).max_running
              for frames in (16, 32, 64, 128, 256, 512)]
    assert counts == sorted(counts, reverse=True)
    assert counts[0] == 16 and counts[-1] < counts[3] < counts[0]


def test_too_little_memory_serves_one_smaller_request_at_a_time(qwen3_4b):
    plan = plan_memory(qwen3_4b, 10 * GIB, settings())
    assert plan.max_running == 1 and 0 < plan.max_video_tokens < 12_544
    assert "not even one request" in plan.reasons[-1]
    starved = plan_memory(qwen3_4b, 1 * GIB, settings())  # less than the caches' own bounds
    assert starved.max_running == 1 and starved.max_video_tokens == 0
    with pytest.raises(InputError, match="fewer frames or fewer pixels per frame"):
        starved.check_request(video_tokens=4, prompt_tokens=40, max_new_tokens=8)


def test_the_refusals_say_what_to_lower(qwen3_4b):
    plan = plan_memory(qwen3_4b, 40 * GIB, settings())
    plan.check_request(video_tokens=12_544, prompt_tokens=13_300, max_new_tokens=1024)  # fits: no error
    with pytest.raises(InputError, match=r"12,545 video tokens.*choose fewer frames or fewer pixels per frame\.$"):
        plan.check_request(video_tokens=12_545, prompt_tokens=13_000, max_new_tokens=16)
    with pytest.raises(InputError, match="ask for fewer new tokens, start a new conversation"):
        plan.check_request(video_tokens=12_544, prompt_tokens=14_000, max_new_tokens=4096)


# --- through a real engine -----------------------------------------------------------------------

def test_a_cpu_engine_has_no_memory_plan_and_the_cpu_defaults(tiny_cache_dir):
    with Engine(EngineConfig(model="tiny-random", device="cpu", cache_dir=tiny_cache_dir)) as engine:
        assert engine.default_sampling == SamplingParams()
        assert engine.sampling_limits == CPU_SAMPLING_LIMITS
        plan = engine.memory_plan
        assert not plan.bounded and plan.max_video_tokens is None and plan.max_running == 16
        plan.check_request(video_tokens=10**9, prompt_tokens=10**9, max_new_tokens=4096)  # never refuses
        assert "memory plan: none" in plan.summary()


@pytest.fixture(scope="module")
def small_plan_engine(tiny_cache_dir):
    """A tiny-model engine whose plan is forced: the caches' bounds plus 100 MiB after the 10% margin. The
    tiny model's KV is 768 bytes a token (2 x 3 layers x 2 heads x 16 x 4 bytes, float32), so a row planned
    for the default 80 video tokens (+5,376 others, x3) is 12.7 MB; one ViT forward over the CPU's
    4,096-patch budget takes 55 MB (float32 pixels): 3 rows fit, 16 rows of anything more do not."""
    budget = int((2 * GIB + 100 * 1024**2) / 0.9)
    config = EngineConfig(model="tiny-random", device="cpu", cache_dir=tiny_cache_dir, sampling=SAMPLING,
                          memory_budget_bytes=budget)
    with Engine(config) as engine:
        yield engine


def test_a_forced_plan_bounds_the_engine(small_plan_engine):
    plan = small_plan_engine.memory_plan
    assert plan.bounded and plan.kv_bytes_per_token == 768
    assert plan.max_video_tokens == 80 and plan.max_running == 3


def test_an_over_plan_video_is_refused_with_a_sentence_and_the_engine_keeps_serving(small_plan_engine, clip):
    video = clip("moving_object", seconds=2.0)  # 16 frames at 8 fps
    larger = GenerationParams(max_new_tokens=4, sampling=SamplingParams(fps=8.0, max_frames=16,
                                                                        max_pixels_per_frame=160 * 128))
    refused = small_plan_engine.submit(video, "What moves?", larger)
    with pytest.raises(InputError, match=r"^This video comes to 160 video tokens, more than the 80 .*"
                                         r"choose fewer frames or fewer pixels per frame\.$"):
        refused.result(60)
    served = small_plan_engine.submit(video, "What moves?", GenerationParams(max_new_tokens=4)).result(60)
    assert served.stats["video_tokens_total"] == 80 and served.stats["generated_tokens"] == 4


def test_a_conversation_over_the_plan_is_refused_with_a_sentence(small_plan_engine, clip):
    """The tiny tokenizer is one token per byte: 6,000 characters of history pass 80 + 4,096 + 1,024."""
    history = [("What moves?", "A square " * 700)]
    refused = small_plan_engine.submit(clip("moving_object"), "And then?", GenerationParams(max_new_tokens=4),
                                       history=history)
    with pytest.raises(InputError, match="ask for fewer new tokens, start a new conversation"):
        refused.result(60)


def test_the_plan_caps_requests_decoding_together(small_plan_engine, clip):
    videos = [clip(kind) for kind in ("moving_object", "pan", "scene_cut")]
    with small_plan_engine.paused():
        streams = [small_plan_engine.submit(videos[i % 3], "What happens?",
                                            GenerationParams(pruning_rate=0.1 * i, max_new_tokens=6, ignore_eos=True))
                   for i in range(5)]
    most = max(stream.result(120).stats["decode_batch_max"] for stream in streams)
    assert most == 3  # 5 requests, EngineConfig.max_running 16, the plan's 3


# --- the UI follows the engine's device ----------------------------------------------------------

class GpuLikeEngine:
    """What build_demo reads from an engine, as a GPU engine answers it (no model behind it)."""

    model_info = {"name": "Qwen/Qwen3-VL-4B-Instruct", "device": "cuda:0", "is_tiny": False}
    default_sampling = GPU_SAMPLING
    sampling_limits = GPU_SAMPLING_LIMITS


def test_sliders_and_api_defaults_follow_the_engines_device():
    import ui

    demo = ui.build_demo(GpuLikeEngine())
    sliders = {block.elem_id: block for block in demo.blocks.values() if getattr(block, "elem_id", None)}
    assert (sliders["evs-fps"].value, sliders["evs-max-frames"].value) == (2.0, 128)
    assert sliders["evs-max-frames"].maximum == GPU_SAMPLING_LIMITS.max_frames
    assert sliders["evs-max-pixels"].value == 448 * 448
    assert sliders["evs-max-pixels"].maximum == 896 * 896 and "448 × 448 = 200,704" in sliders["evs-max-pixels"].info
    parameters = demo.get_api_info()["named_endpoints"]["/ask"]["parameters"]
    names = [p["parameter_name"] for p in parameters]
    assert names == ["video", "question", "pruning_rate", "fps", "max_frames", "max_pixels_per_frame",
                     "max_new_tokens", "temperature", "compare", "history"]
    defaults = {p["parameter_name"]: p["parameter_default"] for p in parameters}
    assert (defaults["fps"], defaults["max_frames"], defaults["max_pixels_per_frame"]) == (2.0, 128, 200_704)


def test_ask_called_without_sampling_uses_the_engines_device_defaults(clip):
    """Python callers of Handlers.ask (not the API, whose defaults are the sliders') get the device's too."""
    import asyncio

    import gradio as gr

    from ui.handlers import Handlers

    class Recording(GpuLikeEngine):
        submitted: list = []

        def submit(self, video, question, params, history):
            self.submitted.append(params)
            raise InputError("recorded")

    engine = Recording()

    async def ask():
        async for _ in Handlers(engine).ask(str(clip("moving_object")), "What moves?"):
            pass

    with pytest.raises(gr.Error, match="recorded"):
        asyncio.run(ask())
    assert engine.submitted[0].sampling == GPU_SAMPLING


def test_an_engine_without_room_for_a_small_request_refuses_to_start(tiny_cache_dir):
    """Less device memory than the caches' own bounds: one sentence at start, not a server that refuses all."""
    config = EngineConfig(model="tiny-random", device="cpu", cache_dir=tiny_cache_dir, sampling=SAMPLING,
                          memory_budget_bytes=1 * GIB)
    with pytest.raises(InsufficientMemory, match=r"GPU has 1\.0 GiB free, room for 0 video tokens per request, "
                                                 r"fewer than the 80 of a small clip"):
        Engine(config)
