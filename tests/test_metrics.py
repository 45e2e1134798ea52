"""GET /metrics (engine/front/metrics.py) counts a known sequence of requests exactly, on a launched app and on one
engine's route.

The two-replica twin is in tests/test_replicas.py, on its shared replicated engine.
"""

import pytest
from gradio_client import handle_file

from app_harness import launched_app, outcomes, parse_metrics, scrape_metrics, wait_until
from engine import BusyError, Engine, EngineConfig, GenerationParams, InputError
from engine.config import FrameSampling

FAST = dict(max_new_tokens=6)


@pytest.fixture(scope="module")
def small_app(tiny_cache_dir):
    """An app of its own, whose queue holds one request, so a second one in a burst is refused as busy."""
    with launched_app(tiny_cache_dir, max_queue=1) as running:
        yield running


def test_metrics_count_answered_refused_and_cancelled_requests_exactly(small_app, clip):
    app, video = small_app, clip("moving_object")
    first = scrape_metrics(app.url)
    assert outcomes(first) == {"answered": 0, "refused": 0, "cancelled": 0, "failed": 0}
    assert first[("evs_queue_depth", ())] == 0 and first[("evs_running_requests", ())] == 0

    # Answered: twice through /ask on the same video (the second hits the feature cache).
    for _ in range(2):
        app.client.predict(handle_file(str(video)), "What moves?", 0.5, api_name="/ask", **FAST)
    # Refused at submit: an empty question through /ask, a bad rate, and a full queue.
    with pytest.raises(Exception, match="Please type a question"):
        app.client.predict(handle_file(str(video)), "   ", 0.5, api_name="/ask", **FAST)
    with pytest.raises(InputError):
        app.spy.submit(video, "What moves?", GenerationParams(pruning_rate=1.5))
    with app.spy.paused():
        held = app.spy.submit(video, "What moves?", GenerationParams(max_new_tokens=3))  # answered: the third
        with pytest.raises(BusyError):
            app.spy.submit(video, "What moves?", GenerationParams(max_new_tokens=3))
    held.result(60)
    # Cancelled: a long answer through /ask, cancelled once its first words are out.
    job = app.client.submit(handle_file(str(video)), "Talk for a long time.", 0.5, max_new_tokens=1024, api_name="/ask")
    assert wait_until(lambda: any(update[0] for update in job.outputs()), timeout_s=60)
    stream = app.spy.streams[-1]
    job.cancel()
    assert wait_until(lambda: stream.finished)

    after = scrape_metrics(app.url)
    assert outcomes(after) == {"answered": 3, "refused": 3, "cancelled": 1, "failed": 0}
    assert after[("evs_queue_depth", ())] == 0 and after[("evs_running_requests", ())] == 0
    assert after[("evs_ttft_seconds_count", ())] == 4  # every answered request and the cancelled one
    assert after[("evs_answer_seconds_count", ())] == 3
    lookups = {result: after[("evs_feature_cache_lookups_total", (("result", result),))] for result in ("hit", "miss")}
    assert lookups == {"hit": 3, "miss": 1}  # one video, read and encoded once
    kept = after[("evs_video_tokens_total", (("stage", "kept"),))]
    assert 0 < kept < after[("evs_video_tokens_total", (("stage", "in"),))]
    assert after[("evs_vit_batch_requests_count", ())] == 1  # one vision forward; the cache served the rest


def test_one_engine_counts_a_refusal_in_the_stream_as_refused_and_a_cancel_as_cancelled(tiny_cache_dir, clip, tmp_path):
    """An upload that is accepted and then fails its read (random bytes; a clip cut short, its index lost) is
    refused, through its stream, not at submit; a request cancelled while it decodes is cancelled: each counted
    so by one engine's GET /metrics. Pins a refusal that arrives through the stream counted as answered (or
    failed), which the app test above, whose refusals all come at submit, does not see."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from app import metrics_route

    junk, cut = tmp_path / "junk.mp4", tmp_path / "cut.mp4"
    junk.write_bytes(bytes(range(256)) * 16)
    cut.write_bytes(clip("pan").read_bytes()[:15000])
    config = EngineConfig(
        model="tiny-random",
        device="cpu",
        cache_dir=tiny_cache_dir,
        frame_sampling=FrameSampling(fps=4.0, max_frames=8, max_pixels_per_frame=160 * 128),
    )
    with Engine(config) as engine:
        http = TestClient(FastAPI(routes=[metrics_route(engine)]))
        for upload in (junk, cut):
            stream = engine.submit(upload, "What moves?", GenerationParams(max_new_tokens=4))  # accepted
            with pytest.raises(InputError, match="could not be read"):
                stream.result(60)
        long = engine.submit(
            clip("moving_object"), "Talk for a long time.", GenerationParams(max_new_tokens=1024, ignore_eos=True)
        )
        next(event for event in long if event.kind == "text")
        long.cancel()
        assert long.result(60).cancelled
        engine.submit(clip("moving_object"), "What moves?", GenerationParams(max_new_tokens=2)).result(60)
        response = http.get("/metrics")
    assert response.status_code == 200
    samples = parse_metrics(response.text)
    assert outcomes(samples) == {"answered": 1, "refused": 2, "cancelled": 1, "failed": 0}
    assert samples[("evs_answer_seconds_count", ())] == 1
