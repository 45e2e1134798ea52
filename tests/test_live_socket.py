"""`/v1/live` (ui/live_socket.py) through a real WebSocket client (the `websockets` package) against launched apps:
docs/live.md's Python client against `python app.py` on tiny-trained; frames in and the right answer out, each bad
frame or message one sentence with the session going on; a session past max_live_sessions refused with code 1013;
a client that vanishes, or goes silent, has its session closed and its slot freed."""

import asyncio
import io
import json
import math
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import websockets
from PIL import Image

from app_harness import launched_app, strict_json
from live_helpers import jpeg_frames
from test_app_startup import app_process
from test_live_frames import jpeg_bomb
from ui.live_frames import BAD_TIME, NO_TIME, NOT_AN_IMAGE
from ui.live_socket import NOT_A_MESSAGE, idle_sentence

ROOT = Path(__file__).resolve().parent.parent
CLIP = ROOT / "assets" / "examples" / "shape_moving.mp4"  # tiny-trained answers "up"
QUESTION = "Which way does the shape move?"
IDLE_S = 4.0  # the launched app's read_timeout_s, and so its sockets' idle time


@pytest.fixture(scope="module")
def live_app(tiny_cache_dir):
    with launched_app(tiny_cache_dir, model="tiny-trained", max_live_sessions=1, read_timeout_s=IDLE_S) as running:
        yield running, running.url.replace("http://", "ws://").rstrip("/") + "/v1/live"


@pytest.fixture(scope="module")
def clip_jpegs() -> list[tuple[float, bytes]]:
    """The example clip's frames (64x64, 8 fps, 8 s) as (capture time, JPEG bytes)."""
    return jpeg_frames(CLIP)


def frame_message(t_s: float, image: bytes) -> bytes:
    return struct.pack(">d", t_s) + image


async def paced(socket, message: bytes, at: float) -> None:
    """Send when the clock reaches `at`: a camera's pace, so that the engine keeps up and drops no frame."""
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    await socket.send(message)


async def replies(socket, until_type: str, count: int = 1) -> list[dict]:
    """Messages up to and including the count-th of until_type, stats sent every second left out."""
    got, seen = [], 0
    while seen < count:
        message = strict_json(await asyncio.wait_for(socket.recv(), 120))  # JSON a browser's JSON.parse reads
        seen += message["type"] == until_type
        if message["type"] != "stats" or until_type == "stats":
            got.append(message)
    return got


async def opened(url: str, timeout_s: float = 15.0):
    """A socket with a session open (its stats answered); retried while the one slot is still held by a
    socket an earlier step closed (its session closes once the server has seen it go)."""
    deadline = time.monotonic() + timeout_s
    while True:
        socket = await websockets.connect(url)
        await socket.send(json.dumps({"type": "stats"}))
        reply = strict_json(await socket.recv())
        if reply["type"] == "stats":
            return socket
        await socket.close()
        assert time.monotonic() < deadline, reply


def test_the_docs_client_streams_a_clip_to_python_app_py_and_reads_the_right_answer(tmp_path):
    """docs/live.md's client, run as a reader would, against `python app.py --model tiny-trained` (an app of its
    own: the shared fallback app's /metrics must count no request of this test)."""
    page = (ROOT / "docs" / "live.md").read_text()
    section = page[page.index("## WebSocket `/v1/live`") :]
    client = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len([line for line in client.splitlines() if line.strip()]) <= 20  # the docs say twenty lines
    script = tmp_path / "client.py"
    script.write_text(client)
    with app_process(tmp_path, "--model", "tiny-trained", "--device", "cpu") as app:
        done = subprocess.run(
            [sys.executable, str(script), app.url.replace("http://", "ws://") + "v1/live", str(CLIP), QUESTION],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert done.returncode == 0 and not done.stderr, done.stderr
    answer, ttft = done.stdout.strip().splitlines()
    assert answer.split()[0] == "up", done.stdout
    assert re.fullmatch(r"TTFT \d+\.\d\d s", ttft)


def test_bad_frames_and_messages_get_one_sentence_each_and_the_session_answers(live_app, clip_jpegs):
    _, url = live_app
    first, rest = clip_jpegs[:8], clip_jpegs[8:]
    last_s, good_jpeg = first[-1]
    small = io.BytesIO()
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(small, "JPEG")
    bad = [  # (message, the sentence it gets, the t_s the error names)
        (frame_message(1.0, b"not an image at all"), NOT_AN_IMAGE, 1.0),
        (
            frame_message(1.0, jpeg_bomb(20_000, 20_000)),
            "The frame is 20000x20000 (400 megapixels); the limit is 8.8 megapixels.",
            1.0,
        ),
        (b"\x00\x01\x02", NO_TIME, None),
        # Not a number the message could name in JSON: t_s is null.
        (frame_message(math.nan, good_jpeg), BAD_TIME, None),
        (frame_message(math.inf, good_jpeg), BAD_TIME, None),
        (
            frame_message(0.5, good_jpeg),
            f"Frames must come in capture order: 0.5 s is not after the last frame's {last_s:g} s.",
            0.5,
        ),
        (
            frame_message(1.0, small.getvalue()),
            "The frame is 32x32, but this live session's frames are 64x64; open a new session for another size.",
            1.0,
        ),
        ("not json", NOT_A_MESSAGE, None),
        (
            json.dumps({"type": "ask", "id": "bad", "question": QUESTION, "params": {"max_new_tokens": "many"}}),
            "The pruning rate, fps, frame, pixel and token limits and temperature must be numbers.",
            None,
        ),
        (
            json.dumps({"type": "ask", "id": "bad", "question": QUESTION, "params": {"pruning_rate": 0}}),
            "Unknown setting 'pruning_rate' here; this message takes enable_thinking, max_new_tokens, temperature.",
            None,
        ),
    ]

    async def scenario():
        async with websockets.connect(url) as socket:
            await socket.send(json.dumps({"type": "open", "params": {"pruning_rate": 0.5}}))
            start = time.monotonic()
            for t_s, image in first:
                await paced(socket, frame_message(t_s, image), start + t_s)
            for message, _, _ in bad:
                await socket.send(message)
            for t_s, image in rest:
                await paced(socket, frame_message(t_s, image), start + t_s)
            await socket.send(
                json.dumps({"type": "ask", "id": "q1", "question": QUESTION, "params": {"max_new_tokens": 4}})
            )
            answer = await replies(socket, "done")
            await socket.send(json.dumps({"type": "stats"}))
            stats = (await replies(socket, "stats"))[-1]
            return answer, stats

    answer, stats = asyncio.run(scenario())
    errors = [message for message in answer if message["type"] == "error"]
    assert [error["message"] for error in errors] == [sentence for _, sentence, _ in bad]
    for error, (_, _, t_s) in zip(errors, bad):
        assert error.get("t_s") == t_s
    assert [error.get("id") for error in errors][-2:] == ["bad", "bad"]
    text = "".join(m["text"] for m in answer if m["type"] == "event" and m["kind"] == "text" and m["id"] == "q1")
    assert text.split()[0] == "up", (text, stats)
    done = answer[-1]
    assert done["id"] == "q1" and done["stats"]["ttft_s"] > 0 and done["stats"]["pruning_rate"] == 0.5
    assert stats["frames_received"] == len(clip_jpegs) and stats["frames_dropped"] == 0  # the good ones alone
    assert stats["video_tokens_held"] > 0 and not stats["closed"]


def test_a_session_past_the_limit_is_refused_and_a_vanished_one_frees_its_slot(live_app):
    _, url = live_app

    async def scenario():
        holder = await opened(url)
        async with websockets.connect(url) as refused:
            await refused.send(json.dumps({"type": "stats"}))
            error = strict_json(await refused.recv())
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await refused.recv()
        holder.transport.abort()  # gone without a closing handshake, as a client whose network dropped
        start = time.monotonic()
        again = await opened(url, timeout_s=10)
        freed_s = time.monotonic() - start
        await again.close()
        return error, closed.value.rcvd.code, freed_s

    error, code, freed_s = asyncio.run(scenario())
    assert error == {
        "type": "error",
        "message": "This server already has 1 live sessions open, as many as it takes; close one or try again later.",
    }
    assert code == 1013
    assert freed_s < 10


def test_a_silent_client_is_told_and_its_session_closed(live_app):
    _, url = live_app

    async def scenario():
        socket = await opened(url)
        start = time.monotonic()
        message = strict_json(await asyncio.wait_for(socket.recv(), 30))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await socket.recv()
        waited_s = time.monotonic() - start
        await (await opened(url, timeout_s=5)).close()  # its one slot is free again
        return message, waited_s, closed.value.rcvd.code

    message, waited_s, code = asyncio.run(scenario())
    assert message == {"type": "error", "message": idle_sentence(IDLE_S)}
    assert IDLE_S - 0.5 <= waited_s < IDLE_S + 5 and code == 1000


def test_a_watch_sends_its_events_and_bad_watch_messages_get_one_sentence_each(live_app, clip_jpegs):
    """watch, then its events as the clip plays (the first answer at the first group, each with its stream time),
    unwatch with its stats; a watch without a question, a taken id, unwatching twice: one sentence each, and the
    session still answers."""
    _, url = live_app

    async def scenario():
        socket = await opened(url)
        await socket.send(json.dumps({"type": "watch", "id": "w1", "question": "What colour is the shape?"}))
        watching = await replies(socket, "watching")
        start = time.monotonic()
        for t_s, image in clip_jpegs:
            await paced(socket, frame_message(t_s, image), start + t_s)
        await asyncio.sleep(1.5)  # the last group's ask and its event
        await socket.send(json.dumps({"type": "watch", "id": "w1", "question": "Again?"}))
        await socket.send(json.dumps({"type": "watch", "id": "w2"}))
        await socket.send(json.dumps({"type": "unwatch", "id": "w1"}))
        await socket.send(json.dumps({"type": "unwatch", "id": "w1"}))
        await socket.send(
            json.dumps({"type": "ask", "id": "q1", "question": QUESTION, "params": {"max_new_tokens": 4}})
        )
        got = watching + await replies(socket, "done")
        await socket.close()
        return got

    got = asyncio.run(scenario())
    assert got[0] == {"type": "watching", "id": "w1", "question": "What colour is the shape?"}
    events = [m for m in got if m["type"] == "watch_event"]
    assert events and events[0]["t_s"] == 0.5 and events[0]["previous"] is None and events[0]["group"] == 0
    assert all(e["id"] == "w1" and isinstance(e["answer"], str) and e["alert"] is False for e in events)
    assert [e["previous"] for e in events[1:]] == [e["answer"] for e in events[:-1]]
    errors = [(m.get("id"), m["message"]) for m in got if m["type"] == "error"]
    assert errors == [
        ("w1", 'A watch "w1" is already open on this live session; unwatch it or pick another id.'),
        ("w2", 'A watch message needs a question: {"type": "watch", "question": "..."}.'),
        ("w1", 'There is no open watch "w1" on this live session.'),
    ]
    unwatched = next(m for m in got if m["type"] == "unwatched")
    assert unwatched["id"] == "w1" and unwatched["stats"]["asks"] >= len(events) and unwatched["stats"]["closed"]
    assert got[-1]["type"] == "done" and got[-1]["id"] == "q1"
