"""The app through gradio_client: a real demo with the tiny model, launched in this process."""

import base64
import json
import re
from pathlib import Path

import numpy as np
import plotly.io as pio
import pytest
from gradio_client import handle_file

import pruning
from app_harness import MAX_FILE_BYTES, MAX_VIDEO_S, wait_until
from engine import STATS_KEYS
from engine.errors import BAD_HISTORY, NO_VIDEO

FAST = dict(max_new_tokens=6)  # keep answers short: the tests are about the pipeline, not the words


def bar_values(figure_json: dict, trace_name: str) -> np.ndarray:
    """Decode one bar trace's y values (plotly's base64 typed array) from the /ask figures payload."""
    fig = pio.from_json(json.dumps(figure_json))
    y = next(trace for trace in fig.data if trace.name == trace_name).y
    if isinstance(y, dict):
        return np.frombuffer(base64.b64decode(y["bdata"]), dtype=np.dtype(y["dtype"]))
    return np.asarray(y)


def is_update(value) -> bool:
    return isinstance(value, dict) and value.get("__type__") == "update"


# --- the endpoint ----------------------------------------------------------------------------


def test_ask_endpoint_takes_video_question_rate_and_defaults_the_rest(app):
    params = app.client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/ask"]["parameters"]
    names = [p["parameter_name"] for p in params]
    assert names[:3] == ["video", "question", "pruning_rate"]
    assert {
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
        "skip_still_patches",
    } <= set(names)
    assert all(p["parameter_has_default"] for p in params[2:])


def test_ask_streams_status_figures_then_tokens_and_ends_with_everything(app, clip):
    job = app.client.submit(handle_file(str(clip("moving_object"))), "What moves?", 0.7, api_name="/ask", **FAST)
    answer, stats, figures, frames = job.result(timeout=120)
    updates = job.outputs()[:-1]  # the last output is the final result

    assert len(updates) >= 4
    assert any(not is_update(s) and s.get("status") == "prefill" for _, s, _, _ in updates)
    figure_updates = [i for i, (_, _, f, _) in enumerate(updates) if not is_update(f)]
    first_token = next(i for i, (a, _, _, _) in enumerate(updates) if a)
    assert len(figure_updates) == 1 and figure_updates[0] < first_token  # once, before the first token

    assert isinstance(answer, str) and answer
    assert set(STATS_KEYS) <= set(stats)
    assert stats["generated_tokens"] == FAST["max_new_tokens"]
    assert (stats["soundtrack"], stats["audio_tokens"]) == ("unsupported", 0)  # tiny-random has no audio tower
    assert set(figures) == {"tokens_per_group", "dissimilarity"}
    kept = bar_values(figures["tokens_per_group"], "kept")
    assert kept.tolist() == stats["tokens_kept_per_frame"]
    num_groups, h, w = stats["grid_thw"]
    assert len(frames) == num_groups
    for frame, kept_in_group in zip(frames, stats["tokens_kept_per_frame"]):
        assert re.fullmatch(rf"t=\d+\.\d s · kept {kept_in_group}/{h * w}", frame["caption"])
        assert Path(frame["image"]).stat().st_size > 0


def test_a_higher_pruning_rate_keeps_fewer_tokens(app, clip):
    video = handle_file(str(clip("moving_object", seconds=3.0)))
    kept = []
    for q in (0.0, 0.4, 0.8):
        _, stats, _, _ = app.client.predict(video, "What moves?", q, fps=4.0, api_name="/ask", **FAST)
        num_groups, h, w = stats["grid_thw"]
        assert stats["video_tokens_kept"] == pruning.retained_token_count(h * w, num_groups, q)
        kept.append(stats["video_tokens_kept"])
    assert kept[0] > kept[1] > kept[2]


def test_compare_mode_answers_at_zero_and_at_the_chosen_rate(app, clip):
    answer, stats, _, _ = app.client.predict(
        handle_file(str(clip("scene_cut"))), "What changes?", 0.7, compare=True, api_name="/ask", **FAST
    )
    baseline = stats["compare"]
    assert baseline["pruning_rate"] == 0.0 and stats["pruning_rate"] == 0.7
    assert isinstance(baseline["answer"], str) and baseline["answer"] and answer
    assert set(STATS_KEYS) <= set(baseline["stats"])
    assert baseline["stats"]["video_tokens_kept"] == baseline["stats"]["video_tokens_total"]
    assert stats["video_tokens_kept"] < stats["video_tokens_total"]
    assert stats["prompt_tokens"] < baseline["stats"]["prompt_tokens"]


def test_compare_methods_answers_with_every_method_from_one_vit_forward(app, clip):
    video = clip("scene_cut", seconds=2.0, size=(176, 144))  # encoded by no other test: not in the feature cache
    forwards = app.spy.engine.vision.forwards
    answer, stats, _, frames = app.client.predict(
        handle_file(str(video)),
        "What changes?",
        0.5,
        fps=4.0,
        pruning_method="vidcom2",
        compare_methods=True,
        api_name="/ask",
        **FAST,
    )
    assert app.spy.engine.vision.forwards == forwards + 1
    methods = stats["compare_methods"]
    assert list(methods) == list(pruning.PRUNING_METHODS)
    assert stats["pruning_method"] == "vidcom2" and methods["vidcom2"]["answer"] == answer
    num_groups, h, w = stats["grid_thw"]
    for method, run in methods.items():
        assert run["answer"] and run["stats"]["pruning_method"] == method
        assert run["stats"]["video_tokens_kept"] == pruning.kept_token_count(method, h * w, num_groups, 0.5)
        assert run["stats"]["vit_batch_requests"] == 3 and run["stats"]["decode_batch_max"] == 3
    assert methods["uniform"]["stats"]["tokens_kept_per_frame"] == [h * w, 0] * (num_groups // 2)
    kept = [int(frame["caption"].split("kept ")[1].split("/")[0]) for frame in frames]
    assert kept == stats["tokens_kept_per_frame"]  # the pictures are the chosen method's


def test_skip_still_patches_reaches_the_engine_and_the_stats(app, clip):
    video = handle_file(str(clip("moving_object", seconds=2.5, size=(176, 112))))  # asked by no other test
    _, plain, _, _ = app.client.predict(video, "What moves?", 0.0, api_name="/ask", **FAST)
    _, skipping, _, _ = app.client.predict(video, "What moves?", 0.0, skip_still_patches=True, api_name="/ask", **FAST)
    assert plain["vision_patches_encoded"] == plain["vision_patches_total"] == skipping["vision_patches_total"]
    assert 0 < skipping["vision_patches_encoded"] < skipping["vision_patches_total"]
    assert skipping["video_tokens_kept"] < plain["video_tokens_kept"] == plain["video_tokens_total"]


def test_a_follow_up_question_reuses_the_caches(app, clip):
    video = handle_file(str(clip("pan", seconds=2.5)))
    first, stats, _, _ = app.client.predict(video, "Where does the camera go?", 0.5, api_name="/ask", **FAST)
    assert not stats["vit_cache_hit"] and not stats["prefix_cache_hit"]
    _, follow_up, _, _ = app.client.predict(
        video, "And then?", 0.5, history=[["Where does the camera go?", first]], api_name="/ask", **FAST
    )
    assert follow_up["vit_cache_hit"] and follow_up["prefix_cache_hit"]
    assert follow_up["prompt_tokens"] > stats["prompt_tokens"]  # the earlier turn is in the prompt


def test_cancelling_a_call_cancels_the_engine_request(app, clip):
    job = app.client.submit(
        handle_file(str(clip("moving_object"))), "Talk for a long time.", 0.7, max_new_tokens=1024, api_name="/ask"
    )
    assert wait_until(lambda: any(update[0] for update in job.outputs()), timeout_s=60)
    stream = app.spy.streams[-1]
    job.cancel()
    assert wait_until(lambda: stream.finished)
    assert stream.cancelled
    assert stream.result().stats["generated_tokens"] < 1024


# --- user errors -----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def bad_files(tmp_path_factory, clip):
    folder = tmp_path_factory.mktemp("bad")
    junk = folder / "junk.mp4"
    junk.write_bytes(b"this is not a video " * 50)
    big = folder / "big.mp4"
    big.write_bytes(bytes(MAX_FILE_BYTES + 1))
    long = clip("static", seconds=MAX_VIDEO_S + 2, fps=2, size=(64, 48))
    return dict(junk=junk, big=big, long=long)


@pytest.mark.parametrize(
    "case, message",
    [
        ("no video", NO_VIDEO),
        ("empty question", "Please type a question about the video."),
        ("unreadable", "The file could not be read as a video or a picture."),
        ("too long", r"The video is .+ long; the limit is .+\."),
        ("rate out of range", "The pruning rate must be a number at least 0 and below 1; got 1.0."),
        ("bad history", BAD_HISTORY),
    ],
)
def test_user_errors_come_back_as_one_sentence(app, clip, bad_files, case, message):
    video = handle_file(str(clip("moving_object")))
    args = {
        "no video": (None, "What moves?"),
        "empty question": (video, "   "),
        "unreadable": (handle_file(str(bad_files["junk"])), "What moves?"),
        "too long": (handle_file(str(bad_files["long"])), "What moves?"),
        "rate out of range": (video, "What moves?", 1.0),
        "bad history": (video, "What moves?", 0.7),
    }[case]
    extra = dict(history="not a list") if case == "bad history" else {}
    with pytest.raises(Exception) as caught:
        app.client.predict(*args, api_name="/ask", **FAST, **extra)
    text = str(caught.value)
    assert re.fullmatch(message if case == "too long" else re.escape(message), text), text
    assert "Traceback" not in text


def test_a_too_large_upload_is_refused_with_the_limit(app, bad_files):
    with pytest.raises(Exception, match=rf"exceeds the maximum file size of {MAX_FILE_BYTES} bytes"):
        app.client.predict(handle_file(str(bad_files["big"])), "What moves?", api_name="/ask", **FAST)


def test_concurrent_users_with_bad_uploads_among_them_are_all_served(app, clip, bad_files):
    """Several people at once, two of them sending junk: the good answers come back and share the
    engine's batches; the bad ones get their sentence; the server stays up."""
    kinds = ["moving_object", "pan", "scene_cut", "moving_object"]
    # long enough answers that the requests overlap in the decode batch
    good = [
        app.client.submit(handle_file(str(clip(kind))), f"What happens? ({i})", 0.5, api_name="/ask", max_new_tokens=40)
        for i, kind in enumerate(kinds)
    ]
    bad = [
        app.client.submit(handle_file(str(bad_files["junk"])), "What moves?", api_name="/ask", **FAST) for _ in range(2)
    ]
    results = [job.result(timeout=180) for job in good]
    for job in bad:
        with pytest.raises(Exception, match="could not be read as a video or a picture"):
            job.result(timeout=180)
    assert all(stats["generated_tokens"] == 40 for _, stats, _, _ in results)
    assert max(stats["decode_batch_max"] for _, stats, _, _ in results) > 1
    after = app.client.predict(handle_file(str(clip("pan"))), "Still there?", 0.3, api_name="/ask", **FAST)
    assert after[1]["generated_tokens"] == FAST["max_new_tokens"]
