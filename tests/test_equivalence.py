"""The backbone: q=0 equals stock transformers generate; pruned logits equal full-sequence logits with the
pruned tokens masked out of attention (DeepStack included), for every pruning method; and pruning does change
the logits."""

import pytest
import torch

import pruning
from engine import Engine, EngineConfig, GenerationParams
from engine.config import FrameSampling
from engine.prompt.pruned import prune_prompt
from engine.prompt.unpruned import chat_text, processor_inputs, unpruned_prompt
from engine.reading.video import read_video
from engine.worker.lm import LMInput, embed_prompt, lm_logits

SYSTEM = "You are a helpful assistant."
QUESTION = "What moves?"
# 2 s at 4 fps -> 8 frames, 4 temporal groups; 224x224 -> 7x7 (Qwen3) or 8x8 (Qwen2.5) tokens per group.
# For Qwen2.5 the video's temporal extent (3 groups x 1 position) stays below its spatial extent, where
# stock transformers' text-after-video offset agrees with the original Qwen rule.
FRAME_SAMPLING = FrameSampling(fps=4.0, max_frames=8, max_pixels_per_frame=224 * 224)
MODELS = ["tiny-random", "tiny-random-qwen2.5-vl"]


def sampled(path):
    return read_video(path, FRAME_SAMPLING, max_seconds=60, max_bytes=10**8, timeout_s=60)


@pytest.mark.parametrize("name", MODELS)
def test_q0_equals_stock_generate(name, tiny_models, tiny_cache_dir, clip):
    path = clip("moving_object", seconds=2.0, fps=8, size=(224, 224))
    loaded, family = tiny_models(name)
    inputs = processor_inputs(loaded, sampled(path), chat_text(family, SYSTEM, QUESTION, []), 224 * 224)
    with torch.inference_mode():
        stock = loaded.model.generate(
            **inputs, max_new_tokens=16, do_sample=False, output_logits=True, return_dict_in_generate=True
        )
    stock_tokens = stock.sequences[0, inputs["input_ids"].shape[1] :].tolist()

    engine = Engine(EngineConfig(model=name, device="cpu", cache_dir=tiny_cache_dir, frame_sampling=FRAME_SAMPLING))
    try:
        params = GenerationParams(pruning_rate=0.0, max_new_tokens=16, return_logits=True)
        answer = engine.submit(video=path, question=QUESTION, params=params).result(timeout_s=300)
    finally:
        engine.shutdown()
    eos = set(engine._worker.runner.eos_ids)
    stock_tokens = stock_tokens[: next((i for i, t in enumerate(stock_tokens) if t in eos), len(stock_tokens))]
    assert list(answer.token_ids) == stock_tokens
    # Every step's distribution, not only its argmax: a small error in the engine's positions or KV would
    # leave a random model's greedy tokens unchanged.
    stock_logits = torch.cat(stock.logits).float()[: len(answer.logits)]
    torch.testing.assert_close(torch.from_numpy(answer.logits), stock_logits, atol=1e-5, rtol=0)
    assert answer.stats["video_tokens_kept"] == answer.stats["video_tokens_total"]


def full_logits_with_mask(loaded, family, prompt, features, retention):
    """Unpruned prompt, every feature in place, pruned video tokens masked out of attention."""
    model = loaded.model
    length = prompt.input_ids.numel()
    embeds = embed_prompt(model, prompt.input_ids, prompt.is_visual, features)
    positions = torch.cat([torch.arange(length)[None], prompt.positions])[:, None]
    attention = torch.ones(1, length, dtype=torch.long)
    attention[0, prompt.is_visual] = retention.long()
    batch = LMInput(embeds[None], positions, attention, prompt.is_visual[None], features.deepstack)
    return lm_logits(model, family, batch, cache=None)[0]


def pruned_logits(loaded, family, pruned):
    embeds = embed_prompt(loaded.model, pruned.input_ids, pruned.visual_mask, pruned.features)
    batch = LMInput(embeds[None], pruned.positions[:, None], None, pruned.visual_mask[None], pruned.features.deepstack)
    return lm_logits(loaded.model, family, batch, cache=None)[0]


@pytest.mark.parametrize("method", pruning.PRUNING_METHODS)
@pytest.mark.parametrize("name", MODELS)
def test_pruned_logits_equal_masked_full_sequence(name, method, tiny_models, clip):
    """For every pruning method: the mask is all that differs, so each keeps the unpruned positions and prunes
    DeepStack with the same mask."""
    loaded, family = tiny_models(name)
    prompt = unpruned_prompt(
        loaded, family, sampled(clip("moving_object", seconds=2.0, size=(224, 224))), QUESTION, [], SYSTEM, 224 * 224
    )
    with torch.inference_mode():
        features = family.encode_media(loaded.model, prompt.media)
        assert bool(features[0].deepstack) == (name == "tiny-random")  # Qwen3-VL carries DeepStack
        pruned = prune_prompt(prompt, features, 0.5, method)
        T, h, w = prompt.media[0].grid_thw
        assert int(pruned.retention[0].sum()) == pruning.kept_token_count(method, h * w, T, 0.5) < T * h * w
        if method != "evs":  # another choice of tokens than EVS's, or the test would repeat EVS's
            assert not torch.equal(pruned.retention[0], prune_prompt(prompt, features, 0.5, "evs").retention[0])
        got = pruned_logits(loaded, family, pruned)
        want = full_logits_with_mask(loaded, family, prompt, features[0], pruned.retention[0])
        unpruned = pruned_logits(loaded, family, prune_prompt(prompt, features, 0.0, method))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert (got - unpruned).abs().max() > 1e-3


def test_deepstack_reaches_the_pruned_path(tiny_models, clip):
    """Dropping DeepStack changes the logits, so the equivalence above covers it."""
    loaded, family = tiny_models("tiny-random")
    prompt = unpruned_prompt(
        loaded, family, sampled(clip("moving_object", seconds=2.0, size=(224, 224))), QUESTION, [], SYSTEM, 224 * 224
    )
    with torch.inference_mode():
        features = family.encode_media(loaded.model, prompt.media)
        pruned = prune_prompt(prompt, features, 0.5, "evs")
        with_deepstack = pruned_logits(loaded, family, pruned)
        pruned.features.deepstack = [torch.zeros_like(level) for level in pruned.features.deepstack]
        without = pruned_logits(loaded, family, pruned)
    assert (with_deepstack - without).abs().max() > 1e-4
