"""The soundtrack through the engine, on the tiny Nemotron-H Omni (a 1-layer Parakeet audio tower): read by the
engine's readers beside the frames, heard or not by the request's switch, kept whole by EVS, and at the logit
level what transformers' own forward makes of the same video and sound at the same pruning rate.

The reader's side (decoding, resampling, the pipe) is tests/test_soundtrack.py; a split read's soundtrack is
tests/test_reader_pool.py; one that does not decode, tests/test_decoder_faults.py; the app's switches,
tests/test_soundtrack_app.py."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers.video_utils import VideoMetadata

import pruning
from engine import Engine, EngineConfig, GenerationParams
from engine.__main__ import main as engine_main
from engine.config import FrameSampling
from engine.prepare import NO_SOUNDTRACK
from engine.prompt.audio import audio_token_count, processor_audio
from engine.prompt.pruned import prune_prompt
from engine.prompt.unpruned import chat_text, processor_frame_positions, processor_inputs, unpruned_prompt
from engine.reading.video import read_video
from engine.worker.lm import embed_prompt
from sound_clips import tone, write_clip_with_sound
from test_nemotron_omni import builtin_evs

NAME = "tiny-random-nemotron-omni"
RATE_HZ = 16000  # the tiny processor's rate (Parakeet's)
# 8 frames (4 tubelets) of at most 64 patches, as tests/test_nemotron_omni.py samples.
FRAME_SAMPLING = FrameSampling(fps=4.0, max_frames=8, max_pixels_per_frame=128 * 128)
MAX_SOUNDTRACK_S = 2.5  # the engine's bound here: the 4 s clip is cut, the 2 s ones heard whole
Q = 0.6  # transformers' float count of kept tokens and the exact one agree here (checked below)
ATOL = 1e-4  # as tests/test_nemotron_omni.py: float32 sums in another order, where a wrong token moves 1e-2


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("soundtrack-engine")
    # Speech-like: white noise whose loudness comes and goes four times a second, like syllables.
    samples = round(2.0 * RATE_HZ)
    speech = np.random.default_rng(1).uniform(-0.5, 0.5, samples) * np.abs(
        np.sin(np.pi * 4 * np.arange(samples) / RATE_HZ)
    )
    return {
        "speech": write_clip_with_sound(folder / "speech.mp4", speech[None], RATE_HZ),
        "long": write_clip_with_sound(folder / "long.mp4", tone(440, 4.0, 22050)[None], 22050, seconds=4.0),
        "silent": write_clip_with_sound(folder / "silent.mp4", None),
    }


@pytest.fixture(scope="module")
def engine(tiny_cache_dir):
    with Engine(
        EngineConfig(
            model=NAME,
            device="cpu",
            cache_dir=tiny_cache_dir,
            frame_sampling=FRAME_SAMPLING,
            max_soundtrack_seconds=MAX_SOUNDTRACK_S,
        )
    ) as running:
        yield running


def params(hear: bool | None = None, q: float = 0.5) -> GenerationParams:
    return GenerationParams(pruning_rate=q, max_new_tokens=6, ignore_eos=True, return_logits=True, hear_soundtrack=hear)


def asked(engine, video: Path, hear: bool | None = None, q: float = 0.5, question: str = "What is said?"):
    """(answer, its status lines)."""
    stream = engine.submit(video, question, params(hear, q))
    statuses = [event.text for event in stream if event.kind == "status"]
    return stream.result(60), statuses


def test_a_soundtrack_is_heard_when_the_switch_is_on_and_not_when_it_is_off(engine, clips):
    """On (the default for a model that hears): as many audio tokens as the processor writes for the samples
    read, and the answer moves; off: none, and the stats say so. The feature and prefix caches keep the two
    apart (a cached video without its soundtrack is not one with it)."""
    assert engine.model_info["hears"]
    heard, _ = asked(engine, clips["speech"])
    off, _ = asked(engine, clips["speech"], hear=False)
    again, _ = asked(engine, clips["speech"], hear=True)
    samples = round(heard.stats["audio_seconds"] * RATE_HZ)
    assert heard.stats["soundtrack"] == again.stats["soundtrack"] == "heard"
    assert heard.stats["audio_tokens"] == audio_token_count(engine.loaded.processor, samples) > 0
    assert abs(heard.stats["audio_seconds"] - 2.0) <= 0.1  # AAC pads its last frame
    assert (off.stats["soundtrack"], off.stats["audio_tokens"], off.stats["audio_seconds"]) == ("off", 0, 0.0)
    assert heard.stats["prompt_tokens"] > off.stats["prompt_tokens"] + heard.stats["audio_tokens"]
    assert np.abs(heard.logits - off.logits).max() > 1e-3
    assert not off.stats["vit_cache_hit"] and not off.stats["prefix_cache_hit"]
    assert again.stats["vit_cache_hit"] and again.stats["prefix_cache_hit"]
    np.testing.assert_allclose(again.logits, heard.logits, atol=ATOL, rtol=0)


def test_another_question_on_the_same_upload_resumes_after_the_soundtrack(engine, clips):
    """[system + video + soundtrack] is the reusable prefix: a second question about the clip prefills only what
    follows the soundtrack's end marker (the hybrid model's state resumes only at a snapshot taken there)."""
    asked(engine, clips["speech"], question="Who speaks?")
    second, _ = asked(engine, clips["speech"], question="How loud is it?")
    after_soundtrack = chat_text(engine.family, engine.system_prompt, "How loud is it?", [], heard=True).split(
        engine.family.audio_placeholder().strip()
    )[1]
    assert second.stats["prefix_cache_hit"] and second.stats["audio_tokens"] > 0
    assert second.stats["prefill_tokens"] == len(engine.loaded.processor.tokenizer(after_soundtrack)["input_ids"])


def test_a_clip_without_an_audio_stream_is_answered_and_the_stats_say_none(engine, clips):
    answer, statuses = asked(engine, clips["silent"])
    assert answer.stats["generated_tokens"] == 6
    assert (answer.stats["soundtrack"], answer.stats["audio_tokens"], answer.stats["audio_seconds"]) == ("none", 0, 0.0)
    assert NO_SOUNDTRACK in statuses


def test_a_soundtrack_past_the_limit_is_cut_with_a_status_line(engine, clips):
    answer, statuses = asked(engine, clips["long"])
    assert answer.stats["soundtrack"] == "cut" and answer.stats["audio_seconds"] == MAX_SOUNDTRACK_S
    assert answer.stats["audio_tokens"] == audio_token_count(engine.loaded.processor, int(MAX_SOUNDTRACK_S * RATE_HZ))
    assert f"heard the first {MAX_SOUNDTRACK_S:g} s of the soundtrack" in statuses


def test_soundtracks_cut_at_the_limit_share_a_vision_forward_but_not_an_audio_forward(engine, tmp_path):
    """Two uploads whose soundtracks are both cut at the limit have the same length, and their videos go through
    one vision forward; their soundtracks must go through the audio tower one at a time, as the memory plan counts
    it (one soundtrack of the longest length per forward: the tower's attention is quadratic in the length)."""
    videos = [
        write_clip_with_sound(tmp_path / f"long-{hz}.mp4", tone(hz, 4.0, 22050)[None], 22050, seconds=4.0)
        for hz in (550, 660)
    ]
    model = engine.loaded.model
    tower, batches = model.get_audio_features, []

    def counted(features, *args, **kwargs):
        batches.append(features.shape[0])
        return tower(features, *args, **kwargs)

    model.get_audio_features = counted  # the real tower runs; only the batch sizes are noted
    try:
        with engine.paused():
            streams = [engine.submit(video, "What is heard?", params()) for video in videos]
        answers = [stream.result(60) for stream in streams]
    finally:
        del model.get_audio_features
    assert [(a.stats["soundtrack"], a.stats["audio_seconds"], a.stats["vit_batch_requests"]) for a in answers] == [
        ("cut", MAX_SOUNDTRACK_S, 2)
    ] * 2
    assert batches == [1, 1]


def test_a_request_that_does_not_hear_has_no_soundtrack_read_for_it(engine, tmp_path):
    """The switch off, the reader is not asked for the soundtrack (600 s of one take seconds to decode), so a later
    request that hears the same upload reads it again; a read with the soundtrack serves a request without it.
    read_s is 0 on a frame cache hit."""
    off_first, heard_first = (
        write_clip_with_sound(tmp_path / f"{name}.mp4", tone(hz, 2.0, 22050)[None], 22050)
        for name, hz in (("off-first", 330), ("heard-first", 370))
    )
    pool, soundtrack_asked = engine.readers, []
    read = pool.read

    def noted(request, *args, **kwargs):  # the real read; only whether it asked for the soundtrack is noted
        soundtrack_asked.append(request["soundtrack"] is not None)
        return read(request, *args, **kwargs)

    pool.read = noted
    try:
        off, _ = asked(engine, off_first, hear=False)
        heard, _ = asked(engine, off_first, hear=True)
        assert (off.stats["soundtrack"], heard.stats["soundtrack"]) == ("off", "heard")
        assert off.stats["read_s"] > 0 and heard.stats["read_s"] > 0  # the frames read without it did not serve
        heard, _ = asked(engine, heard_first, hear=True)
        off, _ = asked(engine, heard_first, hear=False)
        assert (heard.stats["soundtrack"], off.stats["soundtrack"]) == ("heard", "off")
        assert heard.stats["read_s"] > 0 and off.stats["read_s"] == 0  # served by the read with the soundtrack
    finally:
        del pool.read
    assert soundtrack_asked == [False, True, True]


def test_a_model_without_an_audio_tower_ignores_the_switch(tiny_cache_dir, clips):
    with Engine(
        EngineConfig(model="tiny-random", device="cpu", cache_dir=tiny_cache_dir, frame_sampling=FRAME_SAMPLING)
    ) as deaf:
        answer, _ = asked(deaf, clips["speech"], hear=True)
    assert not deaf.model_info["hears"]
    assert (answer.stats["soundtrack"], answer.stats["audio_tokens"]) == ("unsupported", 0)


def test_the_command_line_hears_unless_told_not_to(tiny_cache_dir, clips, capsys, monkeypatch):
    monkeypatch.setenv("EVS_CACHE_DIR", str(tiny_cache_dir))  # the tiny model the session built
    for flags, verdict in (((), "heard"), (("--no-soundtrack",), "off")):
        assert (
            engine_main(
                [
                    "--model",
                    NAME,
                    "--device",
                    "cpu",
                    "--video",
                    str(clips["speech"]),
                    "--question",
                    "What is said?",
                    "--max-new-tokens",
                    "2",
                    *flags,
                ]
            )
            == 0
        )
        printed = capsys.readouterr().out
        assert json.loads(printed[printed.index("{") :])["soundtrack"] == verdict


@pytest.mark.parametrize("method", pruning.PRUNING_METHODS)
def test_every_pruning_method_keeps_every_audio_token(engine, clips, method):
    """At q = 0.9 most video tokens go, whichever method chooses them; the audio tokens kept are exactly the audio
    tower's rows, which go in their place."""
    loaded, family = engine.loaded, engine.family
    video = read_video(
        clips["speech"], FRAME_SAMPLING, max_seconds=60, max_bytes=10**8, timeout_s=60, soundtrack_rate_hz=RATE_HZ
    )
    prompt = unpruned_prompt(
        loaded, family, video, "What is said?", [], engine.system_prompt, FRAME_SAMPLING.max_pixels_per_frame, hear=True
    )
    with torch.inference_mode():
        features = family.encode_media(loaded.model, prompt.media)
        features[0].audio = family.encode_audio(loaded.model, prompt.media[0].audio)
        audio = features[0].audio
        pruned = prune_prompt(prompt, features, 0.9, method)
        embeds = embed_prompt(loaded.model, pruned.input_ids, pruned.visual_mask, pruned.features, pruned.audio_mask)
    assert int(pruned.retention[0].sum()) < prompt.is_visual.sum()
    assert (
        int(pruned.audio_mask.sum())
        == len(pruned.features.audio)
        == int(prompt.is_audio.sum())
        == audio_token_count(loaded.processor, len(video.soundtrack.samples))
    )
    torch.testing.assert_close(embeds[pruned.audio_mask], audio, atol=0, rtol=0)


def stock_logits(model, inputs, answer) -> tuple[torch.Tensor, int]:
    """transformers' own forward at rate Q over the processor's inputs and the engine's answer, teacher-forced:
    (its logits at every answer position, (generated, V) float32; the prompt tokens it kept)."""
    fed = torch.tensor([answer.token_ids[:-1]])
    ids = torch.cat([inputs["input_ids"], fed], dim=1)
    with torch.inference_mode(), builtin_evs(model, Q):
        out = model(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            pixel_values_videos=inputs["pixel_values_videos"],
            input_features=inputs["input_features"],
            input_features_mask=inputs["input_features_mask"],
        )
    kept = out.logits.shape[1] - fed.shape[1]
    return out.logits[0, kept - 1 :].float(), kept


def test_per_request_pruning_with_the_soundtrack_equals_the_models_own_evs(engine, clips):
    """transformers' forward prunes video tokens with its own EVS at `video_pruning_rate = q`, then scatters its
    audio tower's output onto the audio tokens. Fed the same frames, soundtrack, prompt and the engine's answer,
    its logits at every answer position must be the engine's, which prunes per request and hears the soundtrack
    through its own prompt, audio batch and embedding."""
    question = "What is said in this clip?"
    answer, _ = asked(engine, clips["speech"], q=Q, question=question)
    loaded, family = engine.loaded, engine.family
    video = read_video(
        clips["speech"],
        FRAME_SAMPLING,
        max_seconds=60,
        max_bytes=10**8,
        timeout_s=60,
        soundtrack_rate_hz=RATE_HZ,
        max_soundtrack_seconds=MAX_SOUNDTRACK_S,
    )
    text = chat_text(family, engine.system_prompt, question, [], heard=True)
    audio = processor_audio(loaded.processor, video.soundtrack.samples, video.soundtrack.rate_hz)
    inputs = processor_inputs(loaded, video, text, FRAME_SAMPLING.max_pixels_per_frame, audio)
    T, h, w = answer.stats["grid_thw"]
    assert pruning.retained_token_count(h * w, T, Q) == max(h * w, int(T * h * w * (1 - Q)))  # the counts agree
    logits, kept = stock_logits(loaded.model, inputs, answer)
    assert answer.stats["audio_tokens"] == int((inputs["input_ids"] == loaded.model.config.audio_token_id).sum()) > 0
    assert answer.stats["prompt_tokens"] == kept < inputs["input_ids"].shape[1]
    assert 0 < answer.stats["video_tokens_kept"] < answer.stats["video_tokens_total"]
    torch.testing.assert_close(torch.from_numpy(answer.logits), logits, atol=ATOL, rtol=0)


def test_two_videos_each_heard_equal_the_models_own_forward_with_both(engine, clips, tmp_path):
    """Two videos, each with its soundtrack, in one question at rate q: transformers' forward prunes each video
    with its own EVS (one retention mask per video) and scatters each soundtrack's audio rows onto its tokens.
    Fed the same frames, sounds, prompt and the engine's answer, its logits at every answer position are the
    engine's, which reads, encodes and prunes each video on its own and hears both."""
    other = write_clip_with_sound(tmp_path / "tone.mp4", tone(660, 1.5, RATE_HZ)[None], RATE_HZ)
    question = "Which clip is louder?"
    answer = engine.submit(media=[clips["speech"], other], question=question, params=params(q=Q)).result(60)
    assert [medium["soundtrack"] for medium in answer.stats["media"]] == ["heard", "heard"]
    loaded, family = engine.loaded, engine.family
    videos = [
        read_video(
            path,
            FRAME_SAMPLING,
            max_seconds=60,
            max_bytes=10**8,
            timeout_s=60,
            soundtrack_rate_hz=RATE_HZ,
            max_soundtrack_seconds=MAX_SOUNDTRACK_S,
        )
        for path in (clips["speech"], other)
    ]
    placeholder = family.video_placeholder() + family.audio_placeholder()
    text = chat_text(family, engine.system_prompt, question, [], media=placeholder * 2)
    processor, sizing = family.sized_processor(
        loaded.processor, len(videos[0].frames), FRAME_SAMPLING.max_pixels_per_frame
    )
    metadata = [
        VideoMetadata(
            total_num_frames=v.total_frames,
            fps=v.native_fps,
            duration=v.duration_s,
            height=v.frames.shape[1],
            width=v.frames.shape[2],
            frames_indices=processor_frame_positions(v),
        )
        for v in videos
    ]
    inputs = processor(
        text=[text],
        videos=[v.frames for v in videos],
        video_metadata=metadata,
        do_sample_frames=False,
        audio=[v.soundtrack.samples for v in videos],
        sampling_rate=RATE_HZ,
        return_tensors="pt",
        **sizing,
    )
    logits, kept = stock_logits(loaded.model, inputs, answer)
    assert answer.stats["audio_tokens"] == int((inputs["input_ids"] == loaded.model.config.audio_token_id).sum())
    assert answer.stats["prompt_tokens"] == kept
    torch.testing.assert_close(torch.from_numpy(answer.logits), logits, atol=ATOL, rtol=0)
