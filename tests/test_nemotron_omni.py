"""Nemotron-H Omni (hybrid Mamba-2 / attention / MoE, two-frame tubelets, no rotary positions) on the tiny model,
at the logit level: the engine against the model's own EVS, against stock `generate`, batched against alone,
and a follow-up against the same conversation asked cold.

float32 sums in another order when the prompt is prefilled in segments (the snapshots at the end of the video
and where the answer opens) or the batch shape changes: measured up to 1e-5 on these logits, where a wrong
state or a wrong token moves them by 1e-2 and more."""

import contextlib
import re

import numpy as np
import pytest
import torch
from transformers.models.nemotron_h_omni.modeling_nemotron_h_omni import compute_retention_mask

from batched_rows import answered_in_one_batch, first_tokens, staggered
from engine import Engine, EngineConfig, GenerationParams, InputError
from engine.config import FrameSampling
from engine.prompt.pruned import prune_prompt
from engine.prompt.unpruned import chat_text, processor_inputs, unpruned_prompt
from engine.reading.video import read_video

NAME = "tiny-random-nemotron-omni"
# 8 frames (4 tubelets) of at most 64 patches: 4 x 3 x 4 = 48 video tokens for the first clip, 4 x 3 x 5 = 60
# for the second, small enough for seconds per test; at each rate used with the model's own EVS, transformers'
# float count (int(T * h * w * (1 - q))) and our exact one agree.
FRAME_SAMPLING = FrameSampling(fps=4.0, max_frames=8, max_pixels_per_frame=128 * 128)
SYSTEM = "You are a helpful assistant."
ATOL = 1e-4
# (video, q, question): rows of different lengths and rates, q = 0 included, no two on the same (video, q),
# so a row never reuses another's state.
WORKLOAD = [
    (0, 0.0, "What moves?"),
    (0, 0.6, "What happens in this clip, and where?"),
    (1, 0.5, "Why?"),
    (1, 0.9, "Which colour is the shape?"),
]


def make_engine(tiny_cache_dir, **overrides) -> Engine:
    return Engine(
        EngineConfig(model=NAME, device="cpu", cache_dir=tiny_cache_dir, frame_sampling=FRAME_SAMPLING, **overrides)
    )


def params(q: float, tokens: int = 8) -> GenerationParams:
    return GenerationParams(pruning_rate=q, max_new_tokens=tokens, ignore_eos=True, return_logits=True)


def assert_same(got, want, what) -> None:
    assert got.token_ids == want.token_ids, what
    torch.testing.assert_close(
        torch.from_numpy(got.logits),
        torch.as_tensor(want.logits).float(),
        atol=ATOL,
        rtol=0,
        msg=lambda detail: f"{what}: {detail}",
    )


@contextlib.contextmanager
def builtin_evs(model, q: float):
    """The model's own EVS at rate q for the block: transformers keeps the rate as a model attribute."""
    saved, model.video_pruning_rate = model.video_pruning_rate, q
    try:
        yield
    finally:
        model.video_pruning_rate = saved


@pytest.fixture(scope="module")
def videos(clip):
    return [clip("moving_object", seconds=2.0), clip("pan", seconds=2.0, size=(192, 128))]


@pytest.fixture(scope="module")
def alone(tiny_cache_dir, videos):
    """Each workload item's answer, one at a time on one engine (distinct (video, q): no state is shared)."""
    with make_engine(tiny_cache_dir) as engine:
        answers = {item: engine.submit(videos[item[0]], item[2], params(item[1])).result(120) for item in WORKLOAD}
    assert all(
        answer.stats["decode_batch_max"] == 1 and not answer.stats["prefix_cache_hit"] for answer in answers.values()
    )
    return answers


def stock_inputs(tiny_models, video_path, question):
    loaded, family = tiny_models(NAME)
    video = read_video(video_path, FRAME_SAMPLING, max_seconds=60, max_bytes=10**8, timeout_s=60)
    text = chat_text(family, SYSTEM, question, [])
    return loaded, processor_inputs(loaded, video, text, FRAME_SAMPLING.max_pixels_per_frame)


def test_per_request_pruning_equals_the_models_own_evs(tiny_models, videos, alone):
    """The one EVS in the stack written by someone else: transformers' forward with `video_pruning_rate = q`
    (compute_retention_mask on get_video_features' output, video tokens dropped from the sequence). Fed the
    engine's answer, its logits at every answer position must be the engine's, which prunes per request with
    pruning/ and a per-tubelet grid of its own."""
    video, q, question = WORKLOAD[1]
    answer = alone[WORKLOAD[1]]
    loaded, inputs = stock_inputs(tiny_models, videos[video], question)
    fed = torch.tensor([answer.token_ids[:-1]])
    ids = torch.cat([inputs["input_ids"], fed], dim=1)
    with torch.inference_mode(), builtin_evs(loaded.model, q):
        out = loaded.model(
            input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values_videos=inputs["pixel_values_videos"]
        )
    kept = out.logits.shape[1] - fed.shape[1]
    assert answer.stats["prompt_tokens"] == kept < inputs["input_ids"].shape[1]
    assert 0 < answer.stats["video_tokens_kept"] < answer.stats["video_tokens_total"]
    torch.testing.assert_close(torch.from_numpy(answer.logits), out.logits[0, kept - 1 :].float(), atol=ATOL, rtol=0)


def test_the_pruning_picture_is_the_tubelets_the_model_saw(tiny_models, tiny_cache_dir, videos):
    """The EVS picture of a Nemotron-H Omni answer: one frame per two-frame tubelet, its first; one timestamp per
    tubelet, the middle of the two frame times the processor wrote for it in the prompt; and the kept mask of the
    model's own EVS (`compute_retention_mask` on `get_video_features`' output), which the language model was fed
    (test_per_request_pruning_equals_the_models_own_evs). Pins a family built with one frame per temporal group:
    the answer does not change (the processor's grid still counts tubelets), but the picture shows frames 0-3
    and carries 8 timestamps for 4 tubelets."""
    video_index, q, question = WORKLOAD[1]
    with make_engine(tiny_cache_dir) as engine:
        stream = engine.submit(videos[video_index], question, params(q, tokens=1))
        events = list(stream)
        answer = stream.result(120)
    [picture] = [event.evs for event in events if event.kind == "evs"]
    video = read_video(videos[video_index], FRAME_SAMPLING, max_seconds=60, max_bytes=10**8, timeout_s=60)
    loaded, inputs = stock_inputs(tiny_models, videos[video_index], question)
    written = re.findall(
        r"Frame (\d+) sampled at ([\d.]+) seconds and frame (\d+) sampled at ([\d.]+) seconds",
        loaded.processor.tokenizer.decode(inputs["input_ids"][0]),
    )
    T, h, w = picture.grid_thw
    assert T == len(written) == inputs["pixel_values_videos"].shape[1] == len(video.frames) // 2
    assert [(int(first), int(second)) for first, _, second, _ in written] == [(2 * t + 1, 2 * t + 2) for t in range(T)]
    assert len(picture.frames) == T
    for tubelet, (first, *_) in enumerate(written):  # the processor numbers frames from 1
        assert np.array_equal(picture.frames[tubelet], video.frames[int(first) - 1]), (
            f"tubelet {tubelet} is pictured by another frame than its first, frame {int(first) - 1}"
        )
    assert len(picture.timestamps_s) == T
    for got, (_, first_s, _, second_s) in zip(picture.timestamps_s, written):  # the processor writes 2 decimals
        assert abs(got - (float(first_s) + float(second_s)) / 2) <= 0.005 + 1e-9
    assert any(
        event.kind == "status" and event.text.startswith(f"encoding {len(video.frames)} frames") for event in events
    )
    with torch.inference_mode():
        features = loaded.model.get_video_features(inputs["pixel_values_videos"]).pooler_output[0]
    models_own = compute_retention_mask(features, T, q)
    assert 0 < int(models_own.sum()) < models_own.numel()
    assert np.array_equal(picture.kept_mask, models_own.reshape(T, h, w).numpy())
    assert int(picture.kept_mask.sum()) == answer.stats["video_tokens_kept"]


def test_q0_equals_stock_generate(tiny_models, videos, alone):
    video, _, question = WORKLOAD[0]
    loaded, inputs = stock_inputs(tiny_models, videos[video], question)
    with torch.inference_mode(), builtin_evs(loaded.model, 0.0):
        stock = loaded.model.generate(
            **inputs, max_new_tokens=8, do_sample=False, output_logits=True, return_dict_in_generate=True
        )
    answer = alone[WORKLOAD[0]]
    assert list(answer.token_ids) == stock.sequences[0, inputs["input_ids"].shape[1] :].tolist()
    torch.testing.assert_close(torch.from_numpy(answer.logits), torch.cat(stock.logits).float(), atol=ATOL, rtol=0)


def test_batched_rows_of_different_rates_and_lengths_equal_alone(tiny_cache_dir, videos, alone):
    with make_engine(tiny_cache_dir) as engine:
        answers = answered_in_one_batch(engine, videos, WORKLOAD, params)
    for item, answer in answers.items():
        assert_same(answer, alone[item], item)


def test_rows_that_outlive_the_batch_equal_alone(tiny_cache_dir, videos, alone):
    """Rows of different prompts, rates and max_new_tokens leave one by one, and every leave splits the batch's
    Mamba state back into the rows that stay (`LMState.row`): each survivor's logits must go on as alone.
    Pins a survivor handed another row's recurrent state (row 0's, say) when the state is split at a leave,
    which rows that all leave together never exercise."""
    workload = staggered(WORKLOAD, (3, 8, 5, 2))
    with make_engine(tiny_cache_dir) as engine:
        answers = answered_in_one_batch(engine, videos, workload, params)
    for (*item, tokens), answer in answers.items():
        assert answer.stats["generated_tokens"] == tokens
        assert_same(answer, first_tokens(alone[tuple(item)], tokens), (*item, tokens))


def test_follow_ups_equal_the_same_conversations_asked_cold(tiny_cache_dir, videos):
    """A follow-up quoting the first question resumes the Mamba and KV state stored where the first answer
    opened (the template writes an earlier answer behind an empty think block, not the opening the model
    answered after); one quoting another question resumes at the end of the video, though its KV alone could
    go a few tokens further ("\nWh"): a recurrent state resumes only where a snapshot was taken."""
    quoting_first = ("Why?", [("What happens?", "A shape moves.")])
    quoting_other = ("Which colour is it?", [("Where is it?", "A square moves.")])
    with make_engine(tiny_cache_dir) as warm:
        first = warm.submit(videos[1], "What happens?", params(0.4)).result(120)
        follows = [
            warm.submit(videos[1], question, params(0.4), history=history).result(120)
            for question, history in (quoting_first, quoting_other)
        ]
        tokenizer = warm.loaded.processor.tokenizer
        opening = len(tokenizer(warm.family.answer_opening(False), add_special_tokens=False)["input_ids"])
        # What follows the last tubelet's `</img>` is what follows the `<video>` the processor expanded.
        after_video = len(tokenizer(chat_text(warm.family, SYSTEM, *quoting_other).split("<video>")[1])["input_ids"])
    with make_engine(tiny_cache_dir, prefix_cache_bytes=0) as cold_engine:
        colds = [
            cold_engine.submit(videos[1], question, params(0.4), history=history).result(120)
            for question, history in (quoting_first, quoting_other)
        ]
    assert all(follow.stats["prefix_cache_hit"] for follow in follows)
    assert not any(cold.stats["prefix_cache_hit"] for cold in colds)
    assert opening > 0
    assert follows[0].stats["prefill_tokens"] == follows[0].stats["prompt_tokens"] - (
        first.stats["prompt_tokens"] - opening
    )
    assert follows[1].stats["prefill_tokens"] == after_video
    for follow, cold, what in zip(follows, colds, ("quoting the first question", "quoting another")):
        assert_same(follow, cold, f"follow-up {what} against cold")


def test_a_tubelet_that_keeps_no_token_keeps_its_frame_text(tiny_models, videos):
    loaded, family = tiny_models(NAME)
    video = read_video(videos[0], FRAME_SAMPLING, max_seconds=60, max_bytes=10**8, timeout_s=60)
    prompt = unpruned_prompt(loaded, family, video, "What moves?", [], SYSTEM, FRAME_SAMPLING.max_pixels_per_frame)
    with torch.inference_mode():
        features = family.encode_media(loaded.model, prompt.media)
    pruned = prune_prompt(prompt, features, 0.9, "evs")
    kept, (T, h, w) = pruned.tokens_kept_per_group(0), prompt.media[0].grid_thw
    text = loaded.processor.tokenizer.decode(pruned.input_ids)
    assert kept.count(0) > 0 and kept[0] == h * w
    assert text.count("<img></img>") == kept.count(0)
    assert all(f"Frame {2 * group + 1} sampled at" in text for group in range(T))


@pytest.mark.parametrize("name, rotary", [(NAME, False), ("tiny-random-qwen3.5", True)])
def test_the_language_model_reads_no_positions(tiny_models, name, rotary):
    """Why a pruned Nemotron prompt carries no positions from the unpruned layout: its language model gives the
    same logits whatever position ids it is told (no rotary embedding). Qwen3.5, which rotates by them, is the
    control that shows the check would see a difference."""
    loaded, family = tiny_models(name)
    embeds = loaded.model.get_input_embeddings()(torch.arange(40, 60))[None]
    index = torch.arange(20)[None]
    rows = 4 if rotary else 1  # Qwen's explicit positions: the 1-D row, then MRoPE t/h/w

    def logits(position_ids):
        positions = position_ids.expand(rows, -1, -1) if rotary else position_ids
        out = family.text_model(loaded.model)(inputs_embeds=embeds, position_ids=positions)
        return family.lm_head(loaded.model)(out.last_hidden_state).float()

    with torch.inference_mode():
        moved = (logits(index) - logits(index * 3 + 5)).abs().max()
    assert (moved > 1e-2) if rotary else (moved == 0)


def test_the_prompt_is_written_as_the_nemotron_template_writes_it(tiny_models):
    """The Nemotron 3 chat template: a system turn always (empty without a system prompt), an earlier answer
    behind an empty think block with its reasoning dropped (truncate_history_thinking), and the answer opened
    with `<think>\\n` (enable_thinking) or an empty think block."""
    _, family = tiny_models(NAME)
    history = [("Where?", "<think>\nlooking</think>\nLeft.")]
    assert chat_text(family, "", "Why?", history, thinking=False) == (
        "<|im_start|>system\n<|im_end|>\n<|im_start|>user\n<video>\nWhere?<|im_end|>\n<|im_start|>assistant\n"
        "<think></think>\nLeft.<|im_end|>\n<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n<think></think>"
    )
    assert chat_text(family, "Be brief.", "Why?", [], thinking=True).endswith("<|im_start|>assistant\n<think>\n")


@pytest.mark.parametrize("tag", ["<so_embedding>", "<image>", "<img>"])
def test_the_models_own_tags_in_a_question_get_one_sentence(tiny_cache_dir, videos, tag):
    """Nemotron's media tags are not Qwen's <|...|> markers: in a question the processor would count one
    more placeholder than it has media for. Each way in says so before any work is done."""
    with make_engine(tiny_cache_dir) as engine:
        with pytest.raises(InputError) as refused:
            engine.submit(videos[0], f"What is {tag} here?", params(0.5))
        assert str(refused.value) == f"The question may not contain control markers such as {tag}."
        with pytest.raises(InputError):
            engine.submit(videos[0], "And now?", params(0.5), history=[(f"Is {tag} there?", "No.")])
