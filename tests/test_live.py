"""Live sessions on the tiny Qwen3-VL: the same answers as uploads of the same frames, at the logit level (q = 0;
a question forked mid-stream against a cold request pruned with the same causal mask; a follow-up), and batched
with uploads as alone. docs/live.md."""

import av
import numpy as np
import pytest

import engine.worker.runner
import pruning
from engine import Engine, EngineConfig, GenerationParams
from engine.prompt.pruned import pruned_with
from live_helpers import clip_frames, logits_close, play, write_lossless

QUESTION = "What colour is the shape?"


def params(q: float, tokens: int = 8) -> GenerationParams:
    return GenerationParams(pruning_rate=q, max_new_tokens=tokens, ignore_eos=True, return_logits=True)


@pytest.fixture(scope="module")
def live_engine(tiny_cache_dir):
    with Engine(EngineConfig(model="tiny-random", device="cpu", cache_dir=tiny_cache_dir)) as running:
        yield running


def file_frames(path) -> list[tuple[np.ndarray, float]]:
    """Every frame of a file with its presentation time, as PyAV decodes them."""
    with av.open(str(path)) as container:
        return [(frame.to_ndarray(format="rgb24"), float(frame.time)) for frame in container.decode(video=0)]


def test_q0_live_fed_a_lossless_file_equals_its_upload_at_the_logit_level(live_engine, tmp_path):
    path = write_lossless(tmp_path / "clip.mkv", clip_frames(1_000_001, fps=2), fps=2)
    upload = live_engine.submit(path, QUESTION, params(0.0)).result(120)
    with live_engine.open_live(params(0.0)) as live:
        for frame, time_s in file_frames(path):
            live.push(frame, 100.0 + time_s)  # any origin: times count from the stream's first frame
            assert live.wait(60)
        answer = live.ask(QUESTION).result(120)
    logits_close(answer, upload)
    assert answer.stats["prompt_tokens"] == upload.stats["prompt_tokens"]
    assert answer.stats["video_tokens_kept"] == answer.stats["video_tokens_total"] == upload.stats["video_tokens_total"]


def causal_prune(prompt, features, q, method, candidates=None):
    """The engine's pruning of an upload with the live rule instead of the request's method (offline EVS); every
    unit encoded (candidates None: the tests here never skip still patches)."""
    dissimilarity = pruning.frame_dissimilarity(features[0].embeds, prompt.media[0].grid_thw)
    mask = pruning.causal_retention_mask_from_dissimilarity(dissimilarity, q)
    return pruned_with(prompt, features, [mask], [dissimilarity])


def test_a_question_forked_mid_stream_equals_a_cold_request_over_the_frames_so_far(live_engine, tmp_path, monkeypatch):
    frames = clip_frames(1_000_002, fps=2)
    with live_engine.open_live(params(0.5)) as live:
        play(live, frames[:10], fps=2)
        asked = live.ask(QUESTION, params=params(0.5, tokens=24))
        play(live, frames[10:], fps=2, first=10, wait=False)  # the stream goes on while the answer decodes
        answer = asked.result(120)
        assert live.wait(60) and live.stats()["frames_sampled"] == 16
    monkeypatch.setattr(engine.worker.runner, "prune_prompt", causal_prune)
    cold = live_engine.submit(
        write_lossless(tmp_path / "so_far.mkv", frames[:10], fps=2), QUESTION, params(0.5, tokens=24)
    ).result(120)
    logits_close(answer, cold)
    assert answer.stats["video_tokens_kept"] == cold.stats["video_tokens_kept"] < cold.stats["video_tokens_total"]


def test_a_follow_up_sees_the_stream_up_to_its_own_moment_after_the_earlier_turns(live_engine, tmp_path):
    """Layout: [system][user: the video so far, then the first question][its answer][user: the follow-up]...,
    as an upload of the frames so far asked with that history (docs/live.md)."""
    frames = clip_frames(1_000_003, fps=2)
    with live_engine.open_live(params(0.0)) as live:
        play(live, frames[:8], fps=2)
        first = live.ask(QUESTION).result(120)
        play(live, frames[8:], fps=2, first=8)
        history = [(QUESTION, "A red square.")]
        follow_up = live.ask("Which way does it move?", history=history).result(120)
    upload = write_lossless(tmp_path / "all.mkv", frames, fps=2)
    logits_close(
        follow_up, live_engine.submit(upload, "Which way does it move?", params(0.0), history=history).result(120)
    )
    assert first.stats["grid_thw"][0] == 4 and follow_up.stats["grid_thw"][0] == 8


def test_two_live_sessions_and_two_uploads_in_one_burst_each_equal_alone(live_engine, tmp_path):
    uploads = [
        write_lossless(tmp_path / f"{seed}.mkv", clip_frames(seed, fps=2), fps=2) for seed in (1_000_004, 1_000_005)
    ]
    sessions = [live_engine.open_live(params(q)) for q in (0.0, 0.7)]
    for seed, live in zip((1_000_006, 1_000_007), sessions):
        play(live, clip_frames(seed, fps=2), fps=2)
    alone = [live.ask(QUESTION).result(120) for live in sessions] + [
        live_engine.submit(path, QUESTION, params(q)).result(120) for path, q in zip(uploads, (0.3, 0.0))
    ]
    with live_engine.paused():
        streams = [live.ask(QUESTION) for live in sessions] + [
            live_engine.submit(path, QUESTION, params(q)) for path, q in zip(uploads, (0.3, 0.0))
        ]
    together = [stream.result(120) for stream in streams]
    for session in sessions:
        session.close()
    for got, want in zip(together, alone):
        logits_close(got, want)
        assert got.stats["decode_batch_max"] == 4
