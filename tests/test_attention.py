"""The vision towers on torch's varlen kernel (engine.loading.kernels): the same features as sdpa, one kernel call
per layer for a whole batch of videos where sdpa makes one per frame group (or window), the language model
left on sdpa, and the per-device kernel choice.

varlen_attn runs on CUDA only, so on CPU a pure-torch reference of what it computes stands in for it
through `engine.loading.kernels.kernel`.
"""

import logging
import math

import pytest
import torch

from engine.config import FrameSampling
from engine.loading import kernels, load
from engine.loading.load import _pick_attention, load_model
from engine.prompt.unpruned import unpruned_prompt
from engine.reading.video import read_video

MODELS = ["tiny-random", "tiny-random-qwen2.5-vl"]  # Qwen3-VL (DeepStack), Qwen2.5-VL (windowed blocks)
PIXELS = 224 * 224


def reference_varlen(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, scale):
    """What varlen_attn computes, non-causal: each query attends to the keys of its own segment only.

    q, k, v: (T, H, D); cu_seq_q/k: (N+1,) int32 segment boundaries; max_q/k: the longest segment.
    """
    assert cu_seq_q.dtype == torch.int32 and torch.equal(cu_seq_q, cu_seq_k)
    lengths = cu_seq_q.diff()
    assert int(cu_seq_q[0]) == 0 and int(cu_seq_q[-1]) == q.shape[0]
    assert max_q == max_k == int(lengths.max())  # the real kernel sizes its work by these
    segment = torch.repeat_interleave(torch.arange(lengths.numel()), lengths.long())
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    scores = scores.masked_fill(segment[:, None] != segment[None, :], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


@pytest.fixture
def kernel_calls(monkeypatch) -> list[dict]:
    """Stands the reference in for the CUDA kernel; one entry per call: tokens and segments it saw."""
    calls = []

    def counted(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, scale):
        calls.append({"tokens": q.shape[0], "segments": cu_seq_q.numel() - 1})
        return reference_varlen(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, scale)

    monkeypatch.setattr(kernels, "kernel", counted)
    return calls


@pytest.fixture
def sdpa_calls(monkeypatch) -> list[int]:
    """Counts torch's scaled_dot_product_attention calls (transformers' sdpa path looks it up per call)."""
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counted(query, *args, **kwargs):
        calls.append(query.shape[-2])
        return sdpa(query, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counted)
    return calls


@pytest.fixture(scope="module")
def varlen_models(tiny_cache_dir):
    """name -> LoadedModel whose load_model picked TORCH_VARLEN, as it does on a GPU without flash_attn.
    Separate from the shared sdpa models (same weights), which must stay untouched."""
    loaded = {}

    def get(name):
        if name not in loaded:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(load, "_pick_attention", lambda device, dtype: kernels.TORCH_VARLEN)
                loaded[name] = load_model(name, "cpu", tiny_cache_dir)
        return loaded[name]

    return get


@pytest.fixture(scope="module")
def batch(clip):
    """name -> (pixel_values (P, C), grid_thw_patches (n, 3)) of three videos of different sizes and lengths,
    concatenated as the vision batcher does (engine/worker/vision.py)."""
    videos = [  # (kind, seconds, (width, height), sampled fps, max frames)
        ("moving_object", 2.0, (224, 224), 4.0, 8),
        ("pan", 3.0, (160, 96), 2.0, 6),
        ("scene_cut", 1.0, (96, 128), 2.0, 2),
    ]
    sampled = [
        read_video(
            clip(kind, seconds=seconds, fps=8, size=size),
            FrameSampling(fps=fps, max_frames=frames, max_pixels_per_frame=PIXELS),
            max_seconds=60,
            max_bytes=10**8,
            timeout_s=60,
        )
        for kind, seconds, size, fps, frames in videos
    ]

    def get(loaded, family):
        prompts = [unpruned_prompt(loaded, family, video, "What moves?", [], "", PIXELS) for video in sampled]
        grids = torch.stack([p.media[0].grid_thw_patches for p in prompts])
        assert len({tuple(g.tolist()) for g in grids}) == len(prompts)  # really different sizes
        return torch.cat([p.media[0].pixel_values for p in prompts]), grids

    return get


def segments_per_block(vision_config, grids: torch.Tensor) -> list[int]:
    """Attention segments in each ViT block for these patch grids: one per frame group, except in
    Qwen2.5-VL's windowed blocks, one per window of window_size pixels (edge windows partial)."""
    groups = int(grids[:, 0].sum())
    full_blocks = getattr(vision_config, "fullatt_block_indexes", None)
    if full_blocks is None:  # Qwen3-VL: every block attends over whole frame groups
        return [groups] * vision_config.depth
    merge = vision_config.spatial_merge_size
    side = vision_config.window_size // merge // vision_config.patch_size  # window side in merged tokens
    windows = sum(int(t) * math.ceil(int(h) // merge / side) * math.ceil(int(w) // merge / side) for t, h, w in grids)
    assert windows > groups  # the windowed blocks really cut frames up
    return [groups if block in full_blocks else windows for block in range(vision_config.depth)]


@pytest.mark.parametrize("name", MODELS)
def test_varlen_vision_features_equal_sdpa(name, tiny_models, varlen_models, batch, kernel_calls):
    sdpa_loaded, family = tiny_models(name)
    pixels, grids = batch(sdpa_loaded, family)
    with torch.inference_mode():
        want = family.encode(sdpa_loaded.model, pixels, grids)
        got = family.encode(varlen_models(name).model, pixels, grids)
    assert len(kernel_calls) == sdpa_loaded.model.config.vision_config.depth  # the varlen path really ran
    assert len(got) == len(want) == len(grids)
    # Relative as well as absolute: the two kernels sum in another order, and Qwen2.5-VL's embeddings reach ~10,
    # where float32's spacing is 1e-6 (a CI run under load saw 1.05e-5 once); a wrong kernel is off by 1e-1.
    for g, w in zip(got, want):
        torch.testing.assert_close(g.embeds, w.embeds, atol=1e-5, rtol=1e-5)
        assert len(g.deepstack) == len(w.deepstack) == (2 if name == "tiny-random" else 0)
        for g_level, w_level in zip(g.deepstack, w.deepstack):
            torch.testing.assert_close(g_level, w_level, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_varlen_is_one_call_per_layer_sdpa_one_per_segment(
    name, tiny_models, varlen_models, batch, kernel_calls, sdpa_calls
):
    sdpa_loaded, family = tiny_models(name)
    pixels, grids = batch(sdpa_loaded, family)
    expected = segments_per_block(sdpa_loaded.model.config.vision_config, grids)

    with torch.inference_mode():
        family.encode(varlen_models(name).model, pixels, grids)
    assert sdpa_calls == []
    # One call per layer, each over every patch of every video, cut at that block's boundaries.
    assert kernel_calls == [{"tokens": pixels.shape[0], "segments": n} for n in expected]

    kernel_calls.clear()
    with torch.inference_mode():
        family.encode(sdpa_loaded.model, pixels, grids)
    assert kernel_calls == []
    assert len(sdpa_calls) == sum(expected) > 2 * len(expected)
    assert sum(sdpa_calls) == pixels.shape[0] * len(expected)  # every patch, once per layer


@pytest.mark.parametrize("name", MODELS)
def test_varlen_is_the_vision_towers_only(name, varlen_models):
    loaded = varlen_models(name)
    config = loaded.model.config
    assert loaded.attn_implementation == kernels.TORCH_VARLEN
    # What Engine.model_info reports as attn_vision / attn_text.
    assert config.vision_config._attn_implementation == kernels.TORCH_VARLEN
    assert config.text_config._attn_implementation == "sdpa"
    assert loaded.model.model.visual.config._attn_implementation == kernels.TORCH_VARLEN
    assert loaded.model.model.language_model.config._attn_implementation == "sdpa"


def test_real_kernel_is_called_with_its_signature():
    """torch's varlen_attn has a shape-only implementation for the meta device: the call the engine makes
    binds to the real op and gives (T, H, D) back, without a GPU."""
    q, k, v = (torch.empty(10, 2, 8, device="meta") for _ in range(3))
    cu = torch.tensor([0, 4, 10], dtype=torch.int32, device="meta")
    out = kernels._torch_varlen_kernel(q, k, v, cu, cu, 6, 6, 0.25)
    assert out.shape == (10, 2, 8) and out.device.type == "meta"


@pytest.mark.parametrize(
    "misuse",
    [
        dict(cu_seq_lens_q=None),
        dict(is_causal=True),
        dict(attention_mask=torch.ones(1, 1, 4, 4, dtype=torch.bool)),
    ],
)
def test_varlen_refuses_what_it_does_not_compute(misuse, kernel_calls):
    q = torch.zeros(1, 2, 4, 8)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    kwargs = dict(attention_mask=None, scaling=0.5, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=4, max_length_k=4)
    with pytest.raises(ValueError):
        kernels.varlen_attention_forward(None, q, q, q, **{**kwargs, **misuse})
    assert kernel_calls == []


CUDA = torch.device("cuda")


@pytest.mark.parametrize(
    "device, dtype, capability, flash_attn, varlen, expected",
    [
        (torch.device("cpu"), torch.bfloat16, (9, 0), True, True, "sdpa"),
        (torch.device("cpu"), torch.float32, (9, 0), True, True, "sdpa"),
        (CUDA, torch.float32, (9, 0), True, True, "sdpa"),  # tiny models on a GPU
        (CUDA, torch.bfloat16, (7, 5), True, True, "sdpa"),  # pre-Ampere
        (CUDA, torch.bfloat16, (9, 0), True, True, "flash_attention_2"),
        (CUDA, torch.float16, (8, 0), True, False, "flash_attention_2"),
        (CUDA, torch.bfloat16, (9, 0), False, True, kernels.TORCH_VARLEN),
        (CUDA, torch.float16, (8, 0), False, True, kernels.TORCH_VARLEN),
        (CUDA, torch.bfloat16, (9, 0), False, False, "sdpa"),  # a torch without varlen_attn
    ],
)
def test_pick_attention(device, dtype, capability, flash_attn, varlen, expected, monkeypatch, caplog):
    # Scoped fakes: restored after the test, and a CPU device never asks for the capability.
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(load, "_flash_attn_importable", lambda: flash_attn)
    monkeypatch.setattr(kernels, "torch_varlen_available", lambda: varlen)
    with caplog.at_level(logging.INFO, logger="engine.loading.load"):
        assert _pick_attention(device, dtype) == expected
    assert [r.getMessage().split(" ")[1] for r in caplog.records] == [expected]


def test_built_implementation_keeps_the_language_model_off_varlen():
    assert kernels.built_implementation(kernels.TORCH_VARLEN) == "sdpa"
    assert kernels.built_implementation("flash_attention_2") == "flash_attention_2"
    assert kernels.built_implementation("sdpa") == "sdpa"
    assert kernels.torch_varlen_available()  # torch 2.14 ships it; the GPU path depends on it


def test_the_cpu_environment_keeps_the_linear_attention_kernels_out():
    """Once `fla` or `causal_conv1d` imports, transformers runs their Triton / CUDA kernels even on CPU tensors,
    and every hybrid model here would fail: the test environment (requirements-test.txt) must not bring them."""
    import importlib.util

    assert importlib.util.find_spec("fla") is None and importlib.util.find_spec("causal_conv1d") is None
    assert kernels.linear_attention_kernels(torch.device("cpu")) == "delta rule torch, short convolution torch"


def test_the_linear_attention_kernels_are_named_as_transformers_picks_them(monkeypatch):
    importable = {"fla"}
    monkeypatch.setattr(kernels, "_importable", lambda module: module in importable)
    assert kernels.linear_attention_kernels(torch.device("cuda")) == (
        "delta rule flash-linear-attention (Triton), short convolution torch"
    )
    assert kernels.linear_attention_kernels(torch.device("cpu")).endswith("these kernels need CUDA tensors")
