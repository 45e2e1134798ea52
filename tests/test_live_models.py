"""Live sessions on every family: the stream's prompt is the upload's, token for token and position for position,
and a state prefilled a group at a time gives the logits of one prefill of the same pruned sequence (Qwen3-VL,
Qwen2.5-VL, the hybrid Qwen3.5 and Nemotron-H Omni tiny models; docs/live.md)."""

import pytest
import torch

from engine import Engine, EngineConfig, GenerationParams
from engine.families.base import VideoFeatures
from engine.live.layout import LiveLayout
from engine.prompt.unpruned import unpruned_prompt
from engine.reading.video import SampledVideo
from engine.state.lm_state import new_cache
from engine.worker.live import LiveRunner
from engine.worker.lm import LMInput, embed_prompt, lm_logits
from engine.worker.runner import ModelRunner
from live_helpers import clip_frames, play

MODELS = ["tiny-random", "tiny-random-qwen2.5-vl", "tiny-random-qwen3.5", "tiny-random-nemotron-omni"]
SYSTEM = "You are a helpful assistant."
HISTORY = [("What is it?", "A shape.")]
# float32 sums in another order when a prompt is prefilled in several forwards: up to 5e-5 on the hybrid tiny
# model's logits (docs/architecture.md, "Hybrid state"), where a wrong state moves them by 1e-2 and more.
ATOL = 1e-4


def sampled(frames, fps: int) -> SampledVideo:
    count = len(frames)
    return SampledVideo(
        frames=frames,
        frame_indices=list(range(count)),
        timestamps_s=[i / fps for i in range(count)],
        native_fps=float(fps),
        total_frames=count,
        duration_s=count / fps,
        sampled_fps=float(fps),
        content_hash="",
    )


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("thinking", [False, True])
def test_the_live_prompt_is_the_uploads_token_for_token_and_position_for_position(name, thinking, tiny_models):
    loaded, family = tiny_models(name)
    fps, frames = 2, clip_frames(1_000_010, fps=2, seconds=5.0)
    upload = unpruned_prompt(
        loaded, family, sampled(frames, fps), "Which way?", HISTORY, SYSTEM, 224 * 224, thinking=thinking
    )
    processor = loaded.processor
    layout = LiveLayout(
        family,
        processor.tokenizer,
        processor.video_token,
        family.video_token_id(loaded.model.config),
        SYSTEM,
        family.temporal_patch / fps,
    )
    parts = [(layout.prefix_ids, layout.prefix_positions)]
    T, h, w = upload.media[0].grid_thw
    for group in range(T):
        times = [(group * family.temporal_patch + i) / fps for i in range(family.temporal_patch)]
        tokens = layout.group(group, times, (h, w))
        parts.append((tokens.ids, tokens.positions))
    tail = layout.tail("Which way?", HISTORY, thinking)
    parts.append((tail, layout.tail_positions(tail.numel())))
    assert torch.equal(torch.cat([ids for ids, _ in parts]), upload.input_ids)
    assert torch.equal(torch.cat([positions for _, positions in parts], dim=1), upload.positions)


@pytest.mark.parametrize("name", MODELS)
def test_a_state_prefilled_a_group_at_a_time_equals_one_prefill_of_the_same_pruned_sequence(
    name, tiny_cache_dir, monkeypatch
):
    forwards, kept, asked = [], [], []
    prefill_groups, prefill = LiveRunner._prefill_groups, ModelRunner.prefill

    def each_forward(self, stream, groups):
        forwards.append(len(groups))
        kept.extend(group.kept for group in groups)
        return prefill_groups(self, stream, groups)

    def question(self, request):
        logits = prefill(self, request)
        asked.append(request.pruned)
        return logits

    monkeypatch.setattr(LiveRunner, "_prefill_groups", each_forward)
    monkeypatch.setattr(ModelRunner, "prefill", question)
    config = EngineConfig(model=name, device="cpu", cache_dir=tiny_cache_dir)
    with Engine(config) as running, running.open_live(GenerationParams(pruning_rate=0.5)) as live:
        play(live, clip_frames(1_000_011, fps=2, seconds=6.0), fps=2)
        answer = live.ask("What moves?", params=GenerationParams(max_new_tokens=1, return_logits=True)).result(120)
        model, family = running.loaded.model, running.family
        pruned = asked[0]
        assert forwards == [1] * 6 and pruned.visual_mask.sum() < 6 * len(kept[0].embeds)  # pruned, one group a time
        features = VideoFeatures(
            torch.cat([k.embeds for k in kept]), [torch.cat(levels) for levels in zip(*(k.deepstack for k in kept))]
        )
        with torch.inference_mode():
            embeds = embed_prompt(model, pruned.input_ids, pruned.visual_mask, features)
            batch = LMInput(embeds[None], pruned.positions[:, None], None, pruned.visual_mask[None], features.deepstack)
            once = lm_logits(model, family, batch, new_cache(running._worker.runner.layer_kinds))[0]
    torch.testing.assert_close(torch.from_numpy(answer.logits[0]), once, atol=ATOL, rtol=0)
