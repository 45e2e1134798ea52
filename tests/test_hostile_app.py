"""A launched app (tiny-random on the CPU, tests/app_harness.py) under hostile requests (issue 39): each of the
heaviest refused requests of its kind is refused with its sentence while /healthz keeps answering within a second,
large bodies are received a bounded number at a time, and a client that leaves before the first chunk of a
streamed answer ends its request and frees its files."""

import asyncio
import base64
import json
import re
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import gradio as gr
import httpx
import pytest
from gradio_client import handle_file
from gradio_client.exceptions import AppError
from starlette.requests import ClientDisconnect, Request

import ui
from app_harness import MAX_FILE_BYTES, launched_app, wait_until
from ui import request_body, video_inputs
from ui.request_body import TOO_DEEP
from ui.request_body import TOO_MANY_CONTAINERS as TOO_MANY

MODEL = "tiny-random"
QUESTION = "What moves?"
HEALTHZ_BOUND_S = 1.0


def data_url(path: Path) -> str:
    return f"data:video/mp4;base64,{base64.b64encode(Path(path).read_bytes()).decode()}"


def chat(video: str, question: str = QUESTION, history=(), **fields) -> dict:
    """A chat request about one video (a data: URL), its earlier turns given as (question, answer) pairs."""
    messages = []
    for number, (asked, answered) in enumerate([*history, (question, None)]):
        first = [{"type": "video_url", "video_url": {"url": video}}, {"type": "text", "text": asked}]
        messages.append({"role": "user", "content": first if number == 0 else asked})
        if answered is not None:
            messages.append({"role": "assistant", "content": answered})
    return {"model": MODEL, "messages": messages, "max_tokens": 4, **fields}


def api_videos() -> set[Path]:
    folder = Path(gr.utils.get_upload_folder()) / video_inputs.API_VIDEOS_FOLDER
    return set(folder.glob("*")) if folder.exists() else set()


# GET /healthz every 20 ms until stdin closes, from a process of its own as a user's would be (a thread of the test's
# process would wait for the server's GIL on its own side too); prints "ready" after its first answer, then at the end
# the longest any took (seconds) and how many there were.
WATCH = """
import json, sys, threading, time
import httpx
stopped = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stopped.set()), daemon=True).start()
slowest, count = 0.0, 0
with httpx.Client(timeout=60) as client:
    while not stopped.wait(0.02):
        start = time.perf_counter()
        assert client.get(sys.argv[1]).status_code == 200
        slowest, count = max(slowest, time.perf_counter() - start), count + 1
        if count == 1:
            print("ready", flush=True)
print(json.dumps({"slowest": slowest, "count": count}), flush=True)
"""


class HealthWatch:
    """/healthz watched from another process while the block runs: `slowest` (seconds) and `count` after it."""

    def __init__(self, url: str):
        self.url, self.slowest, self.count = f"{url}healthz", 0.0, 0

    def __enter__(self) -> "HealthWatch":
        self.process = subprocess.Popen(
            [sys.executable, "-c", WATCH, self.url], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout.readline().strip() == "ready"
        return self

    def __exit__(self, *exc) -> None:
        output, _ = self.process.communicate("", timeout=120)
        measured = json.loads(output)
        self.slowest, self.count = measured["slowest"], measured["count"]


def post_json(url: str, body: bytes, chunked: bool = False) -> httpx.Response:
    """A raw JSON body, with its length declared, or sent chunked (no length: read until the server stops it)."""
    content = (body[i : i + 65536] for i in range(0, len(body), 65536)) if chunked else body
    return httpx.post(
        f"{url}v1/chat/completions", content=content, headers={"content-type": "application/json"}, timeout=120
    )


def error_of(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["message"]


def ask_with_history(running, clip, characters: int) -> None:
    """/ask through gradio_client, with one earlier turn: a question and an answer of characters / 2 each."""
    running.client.predict(
        handle_file(str(clip("moving_object"))),
        QUESTION,
        history=[["q" * (characters // 2), "a" * (characters // 2)]],
        api_name="/ask",
    )


def test_healthz_answers_while_the_heaviest_refused_requests_are_refused(app, clip):
    """Each request below is the heaviest of its kind this app refuses (its upload limit is 1 MB, its body limit
    2.27 MB): every one gets its sentence, and no /healthz waits a second meanwhile. A 2 MB history was tokenized
    on the event loop (1.5 s), a 10 MB one through /ask for 14 s, while every user waited."""
    video = data_url(clip("moving_object"))
    body_limit = "The request is larger than the limit of 2.27 MB."
    ten_mb = [("q" * 5_000_000, "a" * 5_000_000)]
    big_history = [("q" * 550_000, "a" * 550_000)] * 2
    many_turns = [("", "")] * 5_000
    cases = [
        ("10 MB, chunked", json.dumps(chat(video, history=ten_mb)).encode(), True, 413, body_limit),
        ("10 MB, declared", json.dumps(chat(video, history=ten_mb)).encode(), False, 413, body_limit),
        (
            "2.2 MB of history",
            json.dumps(chat(video, history=big_history)).encode(),
            False,
            400,
            "The conversation so far is 2,200,000 characters long; the limit is 65,536: please start a new "
            "conversation.",
        ),
        (
            "5,000 turns",
            json.dumps(chat(video, history=many_turns)).encode(),
            False,
            400,
            "The conversation so far has 5,000 earlier questions; the limit is 128: please start a new conversation.",
        ),
        (
            "a data: URL past the upload limit",
            json.dumps(chat("data:video/mp4;base64," + "A" * (MAX_FILE_BYTES * 4 // 3 + 400_000))).encode(),
            False,
            400,
            "The video is larger than the limit of 0.954 MB.",
        ),
        (
            "a data: URL at the upload limit that stops being base64 at its end",
            json.dumps(chat("data:video/mp4;base64," + "A" * (MAX_FILE_BYTES * 4 // 3 - 4) + "!AAA")).encode(),
            False,
            400,
            video_inputs.BAD_BASE64,
        ),
        (
            "10,000 system messages",
            json.dumps({**chat(video), "messages": [{"role": "system", "content": ""}] * 10_000}).encode(),
            False,
            400,
            "The request has 10,000 messages; the limit is 516: please start a new conversation.",
        ),
        ("100,000 objects", json.dumps({**chat(video), "extra": [{}] * 100_000}).encode(), False, 400, TOO_MANY),
        ("2 MB of nesting", b"[" * 2_200_000, False, 400, TOO_DEEP),
    ]
    with HealthWatch(app.url) as watch:
        for name, body, chunked, status, sentence in cases:
            assert error_of(post_json(app.url, body, chunked)) == (status, sentence), name
        with pytest.raises(AppError, match="The conversation so far is 10,000,000 characters long"):
            ask_with_history(app, clip, 10_000_000)
    assert watch.count > 10
    assert watch.slowest < HEALTHZ_BOUND_S, f"a /healthz took {watch.slowest:.2f} s"


@pytest.fixture(scope="module")
def lenient_app(tiny_cache_dir):
    """An app whose operator allows 20 million characters of history: only the token limit refuses it, after the
    tokenizer has read it all."""
    with launched_app(tiny_cache_dir, max_history_chars=20_000_000) as running:
        yield running


def test_tokenizing_a_long_history_keeps_the_event_loop_free(lenient_app, clip):
    """Where the character limit lets a long history through, the tokenizer reads it off the event loop (submit runs
    in a thread): /healthz answers within a second while 2.2 MB of history is tokenized and refused, through OpenAI
    and /ask. On the event loop it held every user up for seconds. (10 MB, tokenized in a thread, still held the
    server's GIL in single steps of 1-1.7 s on 2 busy cores: an operator who raises the limit that far takes that.)"""
    video = data_url(clip("moving_object"))
    too_long = "The conversation so far is {} tokens long; the limit is 8,192: please start a new conversation."
    with HealthWatch(lenient_app.url) as watch:
        history = [("q" * 550_000, "a" * 550_000)] * 2
        refused = error_of(post_json(lenient_app.url, json.dumps(chat(video, history=history)).encode()))
        assert refused[0] == 400 and re.fullmatch(too_long.format(r"[\d,]+"), refused[1]), refused
        with pytest.raises(AppError, match=too_long.format(r"[\d,]+")):
            ask_with_history(lenient_app, clip, 2_200_000)
    assert watch.count > 10
    assert watch.slowest < HEALTHZ_BOUND_S, f"a /healthz took {watch.slowest:.2f} s"


def raw_request(url: str, body: bytes, declared: int | None = None, send: int | None = None) -> socket.socket:
    """A POST to /v1/chat/completions on a socket of its own: the first `send` bytes of the body (all of them when
    None), its length declared as `declared` (the body's when None). The caller closes the socket."""
    parts = urlsplit(url)
    connection = socket.create_connection((parts.hostname, parts.port))
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {parts.hostname}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body) if declared is None else declared}\r\n\r\n"
    )
    connection.sendall(head.encode() + body[:send])
    return connection


def test_a_client_that_leaves_before_the_first_chunk_ends_its_request(app, clip):
    """A streamed answer whose client hangs up before anything is sent back (here while admission is held, so
    that nothing can be): the engine request is cancelled (it decoded to its token limit) and its decoded data: URL
    deleted (it stayed until the cleaner came)."""
    before, streams = api_videos(), len(app.spy.streams)
    body = json.dumps(chat(data_url(clip("pan")), "Talk for a long time.", max_tokens=4000, stream=True)).encode()
    with app.spy.engine.paused():
        connection = raw_request(app.url, body)
        assert wait_until(lambda: len(app.spy.streams) > streams, timeout_s=60)
        connection.close()
    stream = app.spy.streams[-1]
    assert wait_until(lambda: stream.finished, timeout_s=60)
    assert stream.cancelled and stream.result().stats["generated_tokens"] < 4000
    assert wait_until(lambda: api_videos() <= before, timeout_s=10)


def test_a_server_that_finds_the_client_gone_at_the_first_send_still_ends_the_request(app, clip):
    """An ASGI 2.4 server reports a client that has left by raising OSError from `send` (uvicorn, at 2.3, drops the
    send quietly, and the body iterator runs until Starlette's disconnect watch cancels it): Starlette then ends
    the streamed response at its first send, before its body iterator has started, so the iterator's own cleanup
    never runs. The route's response cancels the request and deletes its files all the same."""
    routes = ui.openai_routes(app.spy, MAX_FILE_BYTES)
    completions = next(route for route in routes if route.path == "/v1/chat/completions").endpoint
    body = json.dumps(chat(data_url(clip("pan")), "Talk for a long time.", max_tokens=4000, stream=True)).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "path": "/v1/chat/completions",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
    }
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def gone(message: dict) -> None:
        raise OSError("the client has gone")

    async def answer_a_client_that_left() -> None:
        response = await completions(Request(scope, receive))
        assert response.status_code == 200
        with pytest.raises(ClientDisconnect):
            await response(scope, receive, gone)

    before, streams = api_videos(), len(app.spy.streams)
    asyncio.run(answer_a_client_that_left())
    assert len(app.spy.streams) == streams + 1
    stream = app.spy.streams[-1]
    assert wait_until(lambda: stream.finished, timeout_s=60)
    assert stream.cancelled and stream.result().stats["generated_tokens"] < 4000
    assert api_videos() <= before


def test_large_bodies_are_received_a_bounded_number_at_a_time(app, clip):
    """MAX_LARGE_BODIES slow uploads are being received: the next large body is refused as busy at once (429), a
    small one is served; when the slow clients leave, what they had sent is deleted."""
    before = api_videos()
    video = data_url(clip("moving_object"))
    large = json.dumps(chat(video, question="q" * 1_100_000)).encode()  # over SMALL_BODY_BYTES
    # All but its last bytes: a batch has reached the scanner, which opened the file the data: URL decodes into.
    slow = [raw_request(app.url, large, send=len(large) - 1000) for _ in range(request_body.MAX_LARGE_BODIES)]
    try:
        assert wait_until(lambda: len(api_videos() - before) == len(slow), timeout_s=30)  # each is being decoded
        refused = post_json(app.url, large)
        assert error_of(refused) == (429, request_body.LARGE_BODIES_BUSY)
        assert refused.headers["retry-after"]
        small = post_json(app.url, json.dumps(chat(video)).encode())
        assert small.status_code == 200, small.text
    finally:
        for connection in slow:
            connection.close()
    assert wait_until(lambda: api_videos() <= before, timeout_s=30)
    assert post_json(app.url, large).status_code == 400  # its turn now: refused for its question's length
