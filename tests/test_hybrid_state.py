"""Hybrid models (Qwen3.5: three Gated DeltaNet layers in four): the engine against the stock model, at the
logit level on the tiny dense model and at the token level on the tiny MoE one.

float32 sums in another order when the prompt is prefilled in two forwards (the snapshot at the end of the
video) or the batch shape changes: measured up to 5.1e-5 on these logits (of magnitude about 2), where a wrong state
moves them by 1e-2 and more (test_a_padded_prefill_behind_a_state_is_wrong)."""

import pytest
import torch

import pruning
from app_harness import wait_until
from batched_rows import answered_in_one_batch, first_tokens, staggered
from engine import Engine, EngineConfig, GenerationParams
from engine.config import FrameSampling
from engine.prompt.unpruned import chat_text, processor_inputs, unpruned_prompt
from engine.reading.video import read_video
from engine.state.decode_batch import DecodeBatch
from engine.state.lm_state import KV, LMState, Recurrent, cache_of, new_cache, state_of
from engine.state.prefix_cache import PrefixCache

DENSE, MOE = "tiny-random-qwen3.5", "tiny-random-qwen3.5-moe"
FRAME_SAMPLING = FrameSampling(fps=4.0, max_frames=8, max_pixels_per_frame=160 * 128)
SYSTEM = "You are a helpful assistant."
ATOL = 1e-4
# (video, q, question): prompts of different lengths, q = 0 included.
WORKLOAD = [
    (0, 0.0, "What happens?"),
    (0, 0.7, "What happens in this clip, and where?"),
    (1, 0.5, "Why?"),
    (1, 0.0, "Which colour is the shape?"),
    (0, 0.9, "What moves?"),
]


def make_engine(name, tiny_cache_dir, **overrides) -> Engine:
    return Engine(
        EngineConfig(model=name, device="cpu", cache_dir=tiny_cache_dir, frame_sampling=FRAME_SAMPLING, **overrides)
    )


def params(q: float, tokens: int = 10) -> GenerationParams:
    return GenerationParams(pruning_rate=q, max_new_tokens=tokens, ignore_eos=True, return_logits=True)


def assert_same(got, want, what, logits=True) -> None:
    assert got.token_ids == want.token_ids, what
    if logits:
        torch.testing.assert_close(
            torch.from_numpy(got.logits),
            torch.from_numpy(want.logits),
            atol=ATOL,
            rtol=0,
            msg=lambda detail: f"{what}: {detail}",
        )


@pytest.fixture(scope="module")
def videos(clip):
    return [clip("moving_object", seconds=2.0), clip("pan", seconds=2.0, size=(192, 128))]


@pytest.fixture(scope="module")
def alone(tiny_cache_dir, videos):
    """Each workload item's answer, on a fresh engine each, for both tiny hybrid models."""
    answers = {}
    for name in (DENSE, MOE):
        for video, q, question in WORKLOAD:
            with make_engine(name, tiny_cache_dir) as engine:
                answers[name, video, q, question] = engine.submit(videos[video], question, params(q)).result(120)
    return answers


@pytest.mark.parametrize("name", [DENSE, MOE])
def test_q0_equals_stock_generate(name, tiny_models, tiny_cache_dir, videos):
    loaded, family = tiny_models(name)
    video = read_video(videos[0], FRAME_SAMPLING, max_seconds=60, max_bytes=10**8, timeout_s=60)
    inputs = processor_inputs(
        loaded, video, chat_text(family, SYSTEM, "What moves?", []), FRAME_SAMPLING.max_pixels_per_frame
    )
    with torch.inference_mode():
        stock = loaded.model.generate(
            **inputs, max_new_tokens=12, do_sample=False, output_logits=True, return_dict_in_generate=True
        )
    with make_engine(name, tiny_cache_dir) as engine:
        answer = engine.submit(
            videos[0],
            "What moves?",
            GenerationParams(pruning_rate=0.0, max_new_tokens=12, ignore_eos=True, return_logits=True),
        ).result(120)
    assert list(answer.token_ids) == stock.sequences[0, inputs["input_ids"].shape[1] :].tolist()
    if name == DENSE:
        torch.testing.assert_close(torch.from_numpy(answer.logits), torch.cat(stock.logits).float(), atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", [DENSE, MOE])
def test_batched_rows_of_different_lengths_equal_alone(name, tiny_cache_dir, videos, alone):
    with make_engine(name, tiny_cache_dir) as engine:
        answers = answered_in_one_batch(engine, videos, WORKLOAD, params)
    for item, answer in answers.items():
        assert_same(answer, alone[(name, *item)], item, logits=name == DENSE)


@pytest.mark.parametrize("name", [DENSE, MOE])
def test_rows_that_outlive_the_batch_equal_alone(name, tiny_cache_dir, videos, alone):
    """Rows of different prompts, rates and max_new_tokens leave one by one, and every leave splits the batch's
    recurrent state back into the rows that stay (`LMState.row`): each survivor's logits must go on as alone.
    Pins a survivor handed another row's recurrent state (row 0's, say) when the state is split at a leave,
    which rows that all leave together never exercise."""
    workload = staggered(WORKLOAD, (4, 10, 2, 7, 5))
    with make_engine(name, tiny_cache_dir) as engine:
        answers = answered_in_one_batch(engine, videos, workload, params)
    for (*item, tokens), answer in answers.items():
        assert answer.stats["generated_tokens"] == tokens
        assert_same(answer, first_tokens(alone[(name, *item)], tokens), (*item, tokens))


def text_after_video(name, tiny_models, question, history) -> int:
    """Tokens of a prompt after the video's end marker."""
    loaded, family = tiny_models(name)
    text = chat_text(family, SYSTEM, question, history)
    return len(loaded.processor.tokenizer.encode(text.split(family.video_placeholder())[1]))


@pytest.mark.parametrize("name", [DENSE, MOE])
def test_follow_up_from_the_video_snapshot_equals_cold(name, tiny_models, tiny_cache_dir, videos):
    history = [("Where is it?", "A square moves.")]  # not the question asked first: only the video is shared
    with make_engine(name, tiny_cache_dir) as warm:
        first = warm.submit(videos[0], "What happens?", params(0.6)).result(120)
        follow = warm.submit(videos[0], "Which colour is it?", params(0.6), history=history).result(120)
    with make_engine(name, tiny_cache_dir) as cold_engine:
        cold = cold_engine.submit(videos[0], "Which colour is it?", params(0.6), history=history).result(120)
    assert not first.stats["prefix_cache_hit"] and follow.stats["prefix_cache_hit"]
    # Resumed exactly at the end of [system + video]: the follow-up prefills only the text after it (its
    # KV alone would allow a few more, the shared "<|im_start|>user\nWh", but the recurrent state cannot
    # stop there).
    assert follow.stats["prefill_tokens"] == text_after_video(name, tiny_models, "Which colour is it?", history)
    assert_same(follow, cold, "follow-up against cold", logits=name == DENSE)


def test_follow_up_resumes_where_the_quoted_answer_begins(tiny_cache_dir, videos):
    """Qwen3.5's template writes an earlier answer without the think block the model answered after, so a
    follow-up continues the first prompt up to that block: the snapshot there serves it, and the follow-up
    prefills only the quoted answer and the new question."""
    with make_engine(DENSE, tiny_cache_dir) as warm:
        first = warm.submit(videos[1], "What happens?", params(0.5)).result(120)
        tokenizer = warm.loaded.processor.tokenizer
        opening = len(tokenizer(warm.family.answer_opening(False), add_special_tokens=False)["input_ids"])
        history = [("What happens?", "A shape moves.")]
        follow = warm.submit(videos[1], "Why?", params(0.5), history=history).result(120)
    with make_engine(DENSE, tiny_cache_dir) as cold_engine:
        cold = cold_engine.submit(videos[1], "Why?", params(0.5), history=history).result(120)
    assert opening > 0
    assert follow.stats["prefill_tokens"] == follow.stats["prompt_tokens"] - (first.stats["prompt_tokens"] - opening)
    assert_same(follow, cold, "follow-up from where the quoted answer begins, against cold")


def test_a_snapshot_outlives_the_requests_that_resume_from_it(tiny_cache_dir, videos):
    """Two follow-ups in turn resume from the same stored snapshot after the video; the linear layers update
    a live cache's state in place, so the second equals cold only if the first decoded on a copy."""
    asked = [("Where is it?", [("Describe it.", "A square.")]), ("Why?", [("Which colour?", "Red.")])]
    with make_engine(DENSE, tiny_cache_dir) as warm:
        warm.submit(videos[0], "What happens?", params(0.6)).result(120)
        follows = [
            warm.submit(videos[0], question, params(0.6), history=history).result(120) for question, history in asked
        ]
    with make_engine(DENSE, tiny_cache_dir) as cold_engine:
        cold = cold_engine.submit(videos[0], *asked[1][:1], params(0.6), history=asked[1][1]).result(120)
    assert all(follow.stats["prefix_cache_hit"] for follow in follows)
    assert_same(follows[1], cold, "second follow-up from the same snapshot, against cold")


def test_a_finished_turn_is_stored_up_to_where_its_answer_began(tiny_cache_dir, videos):
    """The answer's own state could never be resumed (the template writes it back without its think block),
    so the stored conversation ends at reply_start, with two snapshots at most however long the chat."""
    with make_engine(DENSE, tiny_cache_dir) as engine:
        history = []
        for question in ("What happens?", "Why?", "And then?"):
            answer = engine.submit(videos[1], question, params(0.5), history=history).result(120)
            history.append((question, "It moves."))
        assert wait_until(lambda: len(engine.prefix_cache.lru) == 1, timeout_s=10)
        stored = engine.prefix_cache.lru.get(next(iter(engine.prefix_cache.lru._entries)))
        opening = len(
            engine.loaded.processor.tokenizer(engine.family.answer_opening(False), add_special_tokens=False)[
                "input_ids"
            ]
        )
    assert stored.token_ids.numel() == answer.stats["prompt_tokens"] - opening == stored.state.tokens
    assert len(stored.snapshots) == 1  # the video's end; the stored end is the other resume point


def test_cancel_frees_its_state_and_leaves_the_others_unchanged(tiny_cache_dir, videos, alone):
    with make_engine(DENSE, tiny_cache_dir) as engine:
        with engine.paused():
            victim = engine.submit(
                videos[1], "What happens?", GenerationParams(pruning_rate=0.5, max_new_tokens=400, ignore_eos=True)
            )
            others = {item: engine.submit(videos[item[0]], item[2], params(item[1])) for item in WORKLOAD[:3]}
        for event in victim:
            if event.kind == "text":
                victim.cancel()
                break
        cancelled = victim.result(120)
        results = {item: stream.result(120) for item, stream in others.items()}
        assert wait_until(lambda: engine.running_requests == 0, timeout_s=10)
        assert engine._worker.runner.batch.cache is None
    assert cancelled.cancelled and cancelled.stats["generated_tokens"] < 400
    for item, result in results.items():
        assert_same(result, alone[(DENSE, *item)], item)


def test_the_prefix_cache_counts_snapshots_in_its_bound(tiny_cache_dir, videos):
    with make_engine(DENSE, tiny_cache_dir) as probe:
        probe.submit(videos[0], "What happens?", params(0.5)).result(120)
        assert wait_until(lambda: len(probe.prefix_cache.lru) == 1, timeout_s=10)
        stored = probe.prefix_cache.lru.get(next(iter(probe.prefix_cache.lru._entries)))
        one_entry = probe.prefix_cache.lru.bytes_used
    assert len(stored.snapshots) == 1  # after the video (the stored turn ends where its answer began)
    snapshot_bytes = sum(
        t.nbytes
        for snap in stored.snapshots.values()
        for layer in snap
        if layer is not None
        for t in (layer.conv, layer.ssm)
    )
    assert one_entry == stored.state.nbytes + snapshot_bytes > stored.state.nbytes
    with make_engine(DENSE, tiny_cache_dir, prefix_cache_bytes=int(one_entry * 1.5)) as engine:
        for video in videos:
            engine.submit(video, "What happens?", params(0.5)).result(120)
            assert engine.prefix_cache.lru.bytes_used <= int(one_entry * 1.5)


@pytest.mark.parametrize("name", [DENSE, MOE])
def test_pruned_equals_the_stock_model_on_the_compacted_sequence(name, tiny_models, tiny_cache_dir, videos):
    """Masking does not remove a token from a recurrent layer, so the reference is the stock language model
    run once over the compacted sequence (kept tokens at their unpruned positions) and the answer the engine
    gave, teacher-forced: its logits at each answer step must be the engine's (its argmax, the engine's
    tokens, for the MoE model)."""
    loaded, family = tiny_models(name)
    video = read_video(videos[0], FRAME_SAMPLING, max_seconds=60, max_bytes=10**8, timeout_s=60)
    prompt = unpruned_prompt(loaded, family, video, "What moves?", [], SYSTEM, FRAME_SAMPLING.max_pixels_per_frame)
    with make_engine(name, tiny_cache_dir) as engine:
        answer = engine.submit(videos[0], "What moves?", params(0.5)).result(120)
    with torch.inference_mode():
        features = family.encode_media(loaded.model, prompt.media)[0]
        # the EVS choice alone
        retention = pruning.compute_retention_mask(features.embeds, prompt.media[0].grid_thw, 0.5).cpu()
        assert 0 < int(retention.sum()) < retention.numel()
        # The compacted prompt, built here from the unpruned one: every text token, the kept video tokens,
        # each at its unpruned MRoPE position; then the answer, teacher-forced.
        keep = torch.ones_like(prompt.is_visual)
        keep[prompt.is_visual] = retention
        kept_ids, length = prompt.input_ids[keep], int(keep.sum())
        fed = torch.tensor(answer.token_ids[:-1])
        ids = torch.cat([kept_ids, fed])
        embeds = loaded.model.model.get_input_embeddings()(ids)
        embeds[:length][prompt.is_visual[keep]] = features.embeds[retention]
        steps = torch.arange(fed.numel())
        next_position = int(prompt.positions.max()) + 1
        positions = torch.cat(
            [
                torch.cat([torch.arange(length)[None], prompt.positions[:, keep]]),
                torch.stack([steps + length, *[steps + next_position] * 3]),
            ],
            dim=1,
        )
        out = loaded.model.model.language_model(inputs_embeds=embeds[None], position_ids=positions[:, None])
        reference = loaded.model.lm_head(out.last_hidden_state[0, length - 1 :]).float()
    assert answer.stats["video_tokens_kept"] == int(retention.sum()) and answer.stats["prompt_tokens"] == length
    assert reference.argmax(dim=-1).tolist() == list(answer.token_ids)
    if name == DENSE:
        torch.testing.assert_close(torch.from_numpy(answer.logits), reference, atol=ATOL, rtol=0)


def test_a_padded_prefill_behind_a_state_is_wrong(tiny_models):
    """Why the runner never pads a prefill segment behind a non-empty state: two masked pads before the rest of
    a prompt change a recurrent model's logits though attention ignores them, while the same pads before a
    row's first token do not."""
    loaded, _ = tiny_models(DENSE)
    model = loaded.model
    ids = torch.arange(30, 50)[None]
    kinds = tuple(model.config.text_config.layer_types)

    def run(segments_with_pads):
        cache = new_cache(kinds)
        for segment, pads in segments_with_pads:
            padded = torch.cat([torch.zeros(1, pads, dtype=torch.long), segment], dim=1)
            seen = cache.get_seq_length()
            mask = torch.cat(
                [torch.ones(1, seen, dtype=torch.long), (padded != 0).long() if pads else torch.ones_like(padded)],
                dim=1,
            )
            mask[0, seen : seen + pads] = 0
            out = model.model.language_model(input_ids=padded, attention_mask=mask, cache=cache, use_cache=True)
        return model.lm_head(out.last_hidden_state[:, -1]).float()

    with torch.inference_mode():
        whole = run([(ids, 0)])
        resumed = run([(ids[:, :8], 0), (ids[:, 8:], 0)])
        padded_first = run([(ids, 2)])
        padded_behind = run([(ids[:, :8], 0), (ids[:, 8:], 2)])
    torch.testing.assert_close(resumed, whole, atol=ATOL, rtol=0)
    torch.testing.assert_close(padded_first, whole, atol=ATOL, rtol=0)
    assert (padded_behind - whole).abs().max() > 1e-2


def state(rows: int, tokens: int, seed: int) -> LMState:
    """A made-up hybrid state: a recurrent layer, then an attention layer."""
    g = torch.Generator().manual_seed(seed)
    return LMState(
        (
            Recurrent(torch.randn(rows, 6, 4, generator=g), torch.randn(rows, 2, 3, 3, generator=g)),
            KV(torch.randn(rows, 2, tokens, 4, generator=g), torch.randn(rows, 2, tokens, 4, generator=g)),
        )
    )


def test_decode_batch_pads_kv_and_stacks_recurrent_state():
    batch = DecodeBatch()
    short, long = state(1, 3, 0), state(1, 7, 1)
    batch.add("short", cache_of(short))
    batch.add("long", cache_of(long))
    stacked = state_of(batch.cache)
    assert batch.attention_mask.tolist() == [[0, 0, 0, 0, 1, 1, 1], [1] * 7]
    assert stacked.layers[0].ssm.shape[0] == 2 and torch.equal(stacked.layers[0].ssm[0], short.layers[0].ssm[0])
    assert torch.equal(stacked.layers[1].keys[0, :, 4:], short.layers[1].keys[0])
    row = batch.row_state("short")
    assert row.tokens == 3 and torch.equal(row.layers[0].conv, short.layers[0].conv)
    batch.remove({"long"})
    left = state_of(batch.cache)
    assert batch.attention_mask.tolist() == [[1, 1, 1]] and torch.equal(left.layers[0].ssm, short.layers[0].ssm)
    batch.remove({"short"})
    assert batch.cache is None


def test_a_stored_hybrid_state_resumes_only_where_a_snapshot_was_taken():
    whole = state(1, 6, 0)
    snapshot_at_4 = state(1, 4, 1).snapshot()
    cache = PrefixCache(max_bytes=1 << 20)
    cache.store("k", torch.tensor([1, 2, 3, 4, 5, 6]), whole, {4: snapshot_at_4})
    assert cache.lru.bytes_used == whole.nbytes + sum(t.nbytes for t in (snapshot_at_4[0].conv, snapshot_at_4[0].ssm))
    resumed, reused, snapshots = cache.lookup("k", torch.tensor([1, 2, 3, 4, 5, 9, 9]), min_len=3)
    assert reused == 4 and list(snapshots) == [4]  # 5 tokens shared, but the state can resume only after 4
    assert torch.equal(state_of(resumed).layers[0].ssm, snapshot_at_4[0].ssm)
    assert torch.equal(state_of(resumed).layers[1].keys, whole.layers[1].keys[:, :, :4])
    _, reused, _ = cache.lookup("k", torch.tensor([1, 2, 3, 4, 5, 6, 7]), min_len=3)
    assert reused == 6  # the end of the stored turn
    assert cache.lookup("k", torch.tensor([1, 2, 3, 9]), min_len=3)[:2] == (None, 0)
    with pytest.raises(ValueError):
        whole.prefix(5)
