"""Several videos and pictures in one question through every way in of a launched app (tiny model, CPU), each
through its real client: `/v1/chat/completions` (openai), `/ask` and `/sweep` (gradio_client), the MCP tool
(mcp). Each answers what the engine answers about the same files in the same order. And the two loose ends of
the OpenAI route: a body nested hundreds or thousands deep gets one sentence and no traceback."""

import base64
import json
import logging
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from gradio_client import handle_file
from PIL import Image

from engine import GenerationParams
from test_mcp import TOOL, mcp_session
from ui import request_body

QUESTION = "Which clip has the red shape, first or second?"
TOKENS = 5


@pytest.fixture(scope="module")
def files(clip, tmp_path_factory):
    picture = tmp_path_factory.mktemp("pictures") / "picture.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (96, 128, 3), np.uint8)).save(picture)
    return {"A": clip("moving_object", seconds=2.0), "B": clip("pan", seconds=2.0), "P": picture}


def engine_answer(app, paths: list[Path], q: float = 0.5):
    """What the engine answers itself about the same files, in order (greedy)."""
    params = GenerationParams(pruning_rate=q, max_new_tokens=TOKENS)
    return app.spy.engine.submit(media=[str(p) for p in paths], question=QUESTION, params=params).result(120)


def kinds(stats: dict) -> list[str]:
    return [medium["kind"] for medium in stats["media"]]


def upload(app, path: Path) -> str:
    with open(path, "rb") as file:
        response = httpx.post(f"{app.url}gradio_api/upload", files={"files": (path.name, file)})
    response.raise_for_status()
    return response.json()[0]


def data_url(path: Path, media_type: str) -> str:
    return f"data:{media_type};base64,{base64.b64encode(path.read_bytes()).decode()}"


@pytest.fixture(scope="module")
def client(app):
    return openai.OpenAI(base_url=f"{app.url}v1", api_key="unused", max_retries=0, timeout=120)


def test_the_openai_route_takes_video_and_image_parts_in_their_order(app, client, files):
    """A video as a data: URL, a picture by this server's upload link, a second video: the model is asked about
    the three in that order, as the engine answers them; usage.evs["media"] has one entry each."""
    link = f"{app.url}gradio_api/file={upload(app, files['P'])}"
    parts = [
        {"type": "video_url", "video_url": {"url": data_url(files["A"], "video/mp4")}},
        {"type": "image_url", "image_url": {"url": link}},
        {"type": "video_url", "video_url": {"url": data_url(files["B"], "video/mp4")}},
        {"type": "text", "text": QUESTION},
    ]
    reply = client.chat.completions.create(
        model="tiny-random",
        messages=[{"role": "user", "content": parts}],
        max_tokens=TOKENS,
        temperature=0,
        extra_body={"pruning_rate": 0.5},
    )
    evs = reply.usage.evs
    want = engine_answer(app, [files["A"], files["P"], files["B"]])
    assert kinds(evs) == ["video", "image", "video"]
    assert [m["tokens_kept"] for m in evs["media"]] == [m["tokens_kept"] for m in want.stats["media"]]
    assert reply.choices[0].message.content == want.text


def test_a_picture_sent_in_a_later_message_is_appended_to_the_conversations_media(app, client, files):
    first = [
        {"type": "video_url", "video_url": {"url": data_url(files["A"], "video/mp4")}},
        {"type": "text", "text": "What moves?"},
    ]
    later = [
        {"type": "image_url", "image_url": {"url": data_url(files["P"], "image/png")}},
        {"type": "text", "text": QUESTION},
    ]
    messages = [
        {"role": "user", "content": first},
        {"role": "assistant", "content": "A shape."},
        {"role": "user", "content": later},
    ]
    reply = client.chat.completions.create(
        model="tiny-random", messages=messages, max_tokens=TOKENS, temperature=0, extra_body={"pruning_rate": 0.5}
    )
    assert kinds(reply.usage.evs) == ["video", "image"]
    params = GenerationParams(pruning_rate=0.5, max_new_tokens=TOKENS)
    want = app.spy.engine.submit(
        media=[str(files["A"]), str(files["P"])],
        question=QUESTION,
        params=params,
        history=[("What moves?", "A shape.")],
    ).result(120)
    assert reply.choices[0].message.content == want.text


@pytest.mark.parametrize("depth", [500, 5000])
def test_a_body_nested_deep_gets_one_sentence_and_no_traceback(app, depth, caplog):
    """Python's JSON parser and the validators recurse; a body nested far past any chat request's depth is
    refused as it arrives, in OpenAI's error shape, and the server logs nothing about it."""
    nested = "[" * depth + "]" * depth
    caplog.set_level(logging.WARNING)
    for body in (
        f'{{"model": "tiny-random", "messages": [{{"role": "user", "content": {nested}}}]}}',
        f'{{"model": "tiny-random", "messages": [], "extra": {nested}}}',
        nested,
    ):
        response = httpx.post(
            f"{app.url}v1/chat/completions", content=body, headers={"content-type": "application/json"}, timeout=30
        )
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["message"] == request_body.TOO_DEEP and error["type"] == "invalid_request_error"
    assert not [record for record in caplog.records if record.exc_info or "Recursion" in record.getMessage()]
    assert httpx.get(f"{app.url}v1/models", timeout=10).status_code == 200  # still serving


def test_ask_takes_more_uploads_after_its_video(app, files):
    answer, stats, figures, frames = app.client.predict(
        handle_file(str(files["A"])),
        QUESTION,
        0.5,
        max_new_tokens=TOKENS,
        media=[handle_file(str(files["P"])), handle_file(str(files["B"]))],
        api_name="/ask",
    )
    want = engine_answer(app, [files["A"], files["P"], files["B"]])
    assert kinds(stats) == ["video", "image", "video"] and answer == want.text
    assert [video["medium"] for video in figures["videos"]] == [0, 2]  # one pruning picture per video
    captions = [frame["caption"] for frame in frames]
    assert any(c.startswith("video 1 · ") for c in captions) and any(c.startswith("video 3 · ") for c in captions)


def test_sweep_takes_the_whole_set(app, files):
    table, _, _ = app.client.predict(
        handle_file(str(files["A"])),
        QUESTION,
        "0, 0.7",
        media=[handle_file(str(files["B"]))],
        max_new_tokens=TOKENS,
        api_name="/sweep",
    )
    alone = [engine_answer(app, [files[n]], q=0.0).stats["video_tokens_total"] for n in ("A", "B")]
    headers = table["headers"]
    totals = [row[headers.index("video tokens total")] for row in table["data"]]
    assert totals == [sum(alone)] * 2  # both videos, each rate


def test_the_mcp_tool_takes_a_list_of_media(app, files):
    link = f"{app.url}gradio_api/file={upload(app, files['A'])}"
    arguments = {
        "video": link,
        "question": QUESTION,
        "pruning_rate": 0.5,
        "max_new_tokens": TOKENS,
        "media": [data_url(files["P"], "image/png"), f"{app.url}gradio_api/file={upload(app, files['B'])}"],
    }
    result = mcp_session(app, lambda session: session.call_tool(TOOL, arguments))
    assert not result.isError, result.content
    reply = json.loads(result.content[0].text)
    want = engine_answer(app, [files["A"], files["P"], files["B"]])
    assert kinds(reply["stats"]) == ["video", "image", "video"] and reply["answer"] == want.text
