"""GET /metrics (engine/front/metrics.py) counts a known sequence of requests exactly, on a launched app.

The two-replica twin is in tests/test_replicas.py, on its shared replicated engine.
"""

import pytest
from gradio_client import handle_file

from app_harness import launched_app, outcomes, scrape_metrics, wait_until
from engine import BusyError, GenerationParams, InputError

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
    job = app.client.submit(handle_file(str(video)), "Talk for a long time.", 0.5, max_new_tokens=1024,
                            api_name="/ask")
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
