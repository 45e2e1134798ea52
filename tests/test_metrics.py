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


@pytest.fixture(scope="module")
def mix_app(tiny_cache_dir):
    """An app whose queue holds one request and which takes one live session at a time."""
    with launched_app(tiny_cache_dir, max_queue=1, max_live_sessions=1) as running:
        yield running


def refusals(samples: dict[tuple, float]) -> dict[tuple[str, str], float]:
    """evs_refusals_total of a scrape, by (where, reason)."""
    return {
        (dict(labels)["where"], dict(labels)["reason"]): value
        for (name, labels), value in samples.items()
        if name == "evs_refusals_total"
    }


def live_events(samples: dict[tuple, float]) -> dict[str, float]:
    return {
        dict(labels)["event"]: value for (name, labels), value in samples.items() if name == "evs_live_sessions_total"
    }


def test_every_request_received_is_counted_once_by_where_and_why_it_was_refused(mix_app, clip):
    """A known mix through the OpenAI endpoint (the openai client, and raw bodies), /v1/live (websockets) and the
    engine: the outcomes add up to the requests sent; each refusal counted where it was decided (a route's own
    check of the body or message: front_door; the engine's: engine) and why (bad_input, busy); live sessions
    counted apart from questions (opened, refused, closed)."""
    import asyncio
    import json

    import httpx
    import openai
    import websockets

    from engine.front.json_text import json_text
    from test_openai_api import data_url, video_message

    app, video = mix_app, clip("moving_object")
    assert refusals(scrape_metrics(app.url)) == {
        (where, reason): 0 for where in ("front_door", "engine") for reason in ("bad_input", "busy")
    }
    client = openai.OpenAI(base_url=app.url.rstrip("/") + "/v1", api_key="unused", max_retries=0, timeout=120)
    model = app.spy.model_info["name"]
    message = video_message(data_url(video), "What moves?")
    sent = 0

    def ask(**fields) -> None:
        nonlocal sent
        sent += 1
        try:
            client.chat.completions.create(**{"model": model, "messages": [message], "max_tokens": 3, **fields})
        except (openai.BadRequestError, openai.NotFoundError, openai.RateLimitError):
            pass

    ask()  # answered
    ask(n=2)  # front door: this server answers one choice
    ask(model="another-model")  # front door: 404
    picture = {"type": "image_url", "image_url": {"url": "data:image/png;base64,not*base64!"}}
    ask(messages=[{"role": "user", "content": [picture, {"type": "text", "text": "What is it?"}]}])  # front door
    for body in (b"not JSON", json_text({"model": model}).encode()):  # front door: 400, and 422 (no messages)
        sent += 1
        assert httpx.post(app.url.rstrip("/") + "/v1/chat/completions", content=body, timeout=60).status_code >= 400
    ask(extra_body={"pruning_rate": 1.5})  # the engine's check
    with app.spy.paused():
        held = app.spy.submit(video, "What moves?", GenerationParams(max_new_tokens=3))  # answered
        sent += 1
        ask()  # the engine's queue is full: busy
    held.result(60)

    async def live() -> None:
        nonlocal sent
        url = app.url.replace("http://", "ws://").rstrip("/") + "/v1/live"
        async with websockets.connect(url) as socket:  # opened
            await socket.send(json.dumps({"type": "stats"}))
            assert json.loads(await socket.recv())["type"] == "stats"
            for malformed in ("not JSON", json.dumps({"type": "ask"})):  # front door: not a message, no question
                sent += 1
                await socket.send(malformed)
                assert json.loads(await socket.recv())["type"] == "error"
            sent += 1
            await socket.send(json.dumps({"type": "ask", "question": "What moves?"}))  # the engine: no video yet
            assert "no video yet" in json.loads(await socket.recv())["message"]
            async with websockets.connect(url) as second:  # refused: one session at a time
                await second.send(json.dumps({"type": "stats"}))
                assert json.loads(await second.recv())["type"] == "error"
            await socket.send(json.dumps({"type": "close"}))  # closed
            await socket.wait_closed()
        async with websockets.connect(url) as bad:  # refused at the front door: its settings are not numbers
            await bad.send(json.dumps({"type": "open", "params": {"pruning_rate": "fast"}}))
            assert json.loads(await bad.recv())["type"] == "error"

    asyncio.run(live())
    assert wait_until(lambda: live_events(scrape_metrics(app.url))["closed"] == 1)
    after = scrape_metrics(app.url)
    assert outcomes(after) == {"answered": 2, "refused": 10, "cancelled": 0, "failed": 0}
    assert sum(outcomes(after).values()) == sent
    assert refusals(after) == {
        ("front_door", "bad_input"): 7,
        ("front_door", "busy"): 0,
        ("engine", "bad_input"): 2,
        ("engine", "busy"): 1,
    }
    assert sum(refusals(after).values()) == outcomes(after)["refused"]
    assert live_events(after) == {"opened": 1, "refused": 2, "closed": 1, "lost": 0}
