"""Every JSON the server sends is JSON a browser's `JSON.parse` reads: no NaN or Infinity, which Python's json
writes and reads but no other parser does (engine/front/json_text.py). Read raw, off the wire, and parsed
strictly: the OpenAI endpoint's answers, streamed chunks and error bodies, and `/ask` through Gradio's own
HTTP API. The `/v1/live` WebSocket's messages are parsed strictly by every test of tests/test_live_socket.py
(a NaN or infinite frame time among them) and the MCP tool's string by tests/test_mcp.py."""

import asyncio
import math

import httpx
import numpy as np
import pytest

from app_harness import strict_json
from engine.front.json_text import json_text
from engine.stream import Event, Stream
from test_openai_api import data_url, video_message
from ui.openai_api import Reply

NOT_FINITE = {"ttft_s": math.nan, "total_s": math.inf, "lag_s": {"p50": -math.inf}, "read_s": np.float32("nan")}


def test_json_text_writes_non_finite_numbers_as_null_and_numpy_as_numbers():
    sent = json_text({**NOT_FINITE, "grid_thw": (np.int64(2), 3), "kept": np.array([True, False]), 7: "seven"})
    assert strict_json(sent) == {
        "ttft_s": None,
        "total_s": None,
        "lag_s": {"p50": None},
        "read_s": None,
        "grid_thw": [2, 3],
        "kept": [True, False],
        "7": "seven",
    }


def test_an_openai_stream_whose_stats_hold_nan_or_infinity_sends_only_json():
    """The route's chunks, usage included, from a real Stream whose done event's stats are not all finite: each
    `data:` line parses strictly, and the numbers that were not finite read null."""
    stream = Stream(1)
    stream.push(Event("text", "first"))
    stream.push(Event("done", stats={**NOT_FINITE, "generated_tokens": 1, "prompt_tokens": 9}))

    async def chunks() -> list[str]:
        return [chunk async for chunk in Reply("tiny-random", stream, 8).chunks([], True, lambda: None)]

    sent = asyncio.run(chunks())
    assert sent[-1] == "data: [DONE]\n\n"
    bodies = [strict_json(chunk.removeprefix("data: ")) for chunk in sent[:-1]]
    usage = bodies[-1]["usage"]
    assert usage["evs"]["ttft_s"] is None and usage["evs"]["lag_s"] == {"p50": None}
    assert usage["prompt_tokens"] == 9 and usage["completion_tokens"] == 1


def test_the_openai_endpoint_sends_strict_json_whole_streamed_and_refused(app, clip):
    url = f"{app.url}v1/chat/completions"
    body = {
        "model": app.spy.model_info["name"],
        "messages": [video_message(data_url(clip("moving_object")))],
        "max_tokens": 4,
        "temperature": 0,
    }
    whole = httpx.post(url, json=body, timeout=120)
    assert whole.status_code == 200 and strict_json(whole.content)["usage"]["evs"]["ttft_s"] > 0
    with httpx.stream("POST", url, json={**body, "stream": True, "stream_options": {"include_usage": True}}) as sse:
        lines = [line.removeprefix("data: ") for line in sse.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    assert strict_json(lines[-2])["usage"]["completion_tokens"] == 4
    assert all(strict_json(line)["object"] == "chat.completion.chunk" for line in lines[:-1])
    refused = httpx.post(url, json={**body, "model": "gpt-4o"}, timeout=30)
    assert refused.status_code == 404 and strict_json(refused.content)["error"]["code"] == "model_not_found"


@pytest.fixture(scope="module")
def uploaded(app, clip) -> str:
    path = clip("moving_object")
    with open(path, "rb") as file:
        response = httpx.post(f"{app.url}gradio_api/upload", files={"files": (path.name, file, "video/mp4")})
    response.raise_for_status()
    return response.json()[0]


def test_ask_over_gradio_http_api_sends_strict_json(app, uploaded):
    """`/ask` as curl would call it (POST /gradio_api/call/ask, then its event stream): every `data:` line,
    the intermediate updates, the stats dict and the two figures' JSON included, parses strictly."""
    video = {"path": uploaded, "meta": {"_type": "gradio.FileData"}}
    # Every input, in /ask's order (ui/__init__.py): the raw API has no defaults.
    inputs = [video, "What moves?", 0.5, None, None, None, 4, 0.0, False, [], False, None, None, False, None, None]
    call = httpx.post(f"{app.url}gradio_api/call/ask", json={"data": inputs}, timeout=30)
    call.raise_for_status()
    event_id = call.json()["event_id"]
    with httpx.stream("GET", f"{app.url}gradio_api/call/ask/{event_id}", timeout=120) as sse:
        lines = list(sse.iter_lines())
    events = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    data = [strict_json(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
    assert events[-1] == "complete", lines[-4:]
    answer, stats, figures, _ = data[-1]
    assert isinstance(answer, str) and stats["generated_tokens"] == 4
    assert set(figures) >= {"tokens_per_group", "dissimilarity"}
