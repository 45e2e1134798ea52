"""/v1/chat/completions and /v1/models through the official `openai` client, on a launched app (tiny model, CPU)."""

import asyncio
import base64
import functools
import http.server
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gradio as gr
import httpx
import openai
import pytest

import pruning
from app_harness import MAX_FILE_BYTES, MAX_VIDEO_S, launched_app, wait_until
from engine import STATS_KEYS
from engine.errors import EXPIRED_VIDEO, NO_VIDEO, InputError
from engine.reading.video import UNREADABLE
from ui import openai_api, video_inputs

MAX_QUEUE = 2  # small, so that the test can fill the engine's queue
MODEL = "tiny-random"
QUESTION = "What moves?"


@pytest.fixture(scope="module")
def api_app(tiny_cache_dir):
    with launched_app(tiny_cache_dir, max_queue=MAX_QUEUE) as running:
        yield running


@pytest.fixture(scope="module")
def client(api_app):
    # No retries: a 429 or 500 must reach the test, not be retried away.
    return openai.OpenAI(base_url=f"{api_app.url}v1", api_key="unused", max_retries=0, timeout=120)


def data_url(path: Path, media_type: str = "video/mp4") -> str:
    return f"data:{media_type};base64,{base64.b64encode(Path(path).read_bytes()).decode()}"


def video_message(url: str, question: str = QUESTION) -> dict:
    return {
        "role": "user",
        "content": [{"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": question}],
    }


def ask(client, messages, **kwargs):
    kwargs.setdefault("max_tokens", 6)
    kwargs.setdefault("temperature", 0)
    extra = {
        key: kwargs.pop(key)
        for key in ("pruning_rate", "pruning_method", "fps", "max_frames", "max_pixels_per_frame", "skip_still_patches")
        if key in kwargs
    }
    return client.chat.completions.create(model=MODEL, messages=messages, extra_body=extra or None, **kwargs)


def upload(app, path: Path) -> str:
    """Upload a file the way a Gradio client does; returns its path on the server."""
    with open(path, "rb") as file:
        response = httpx.post(f"{app.url}gradio_api/upload", files={"files": (path.name, file, "video/mp4")})
    response.raise_for_status()
    return response.json()[0]


def api_videos() -> set[Path]:
    """The decoded data: URLs on disk now (other test runs on the machine may share the folder)."""
    folder = Path(gr.utils.get_upload_folder()) / video_inputs.API_VIDEOS_FOLDER
    return set(folder.glob("*")) if folder.exists() else set()


# --- answers ---------------------------------------------------------------------------------


def test_models_lists_the_served_model(client):
    assert [model.id for model in client.models.list()] == [MODEL]


def test_an_answer_carries_usage_and_the_evs_stats(client, clip):
    before = api_videos()
    reply = ask(client, [video_message(data_url(clip("moving_object")))], pruning_rate=0.5, fps=4.0)
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and reply.model == MODEL
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length"  # 6 tokens of a random model: cut at max_tokens

    stats = reply.usage.evs
    assert set(STATS_KEYS) <= set(stats)
    assert stats["pruning_rate"] == 0.5 and stats["frames_sampled"] == 8  # 2 s at fps 4
    num_groups, h, w = stats["grid_thw"]
    assert (
        stats["video_tokens_kept"] == pruning.retained_token_count(h * w, num_groups, 0.5) < stats["video_tokens_total"]
    )
    assert reply.usage.prompt_tokens == stats["prompt_tokens"]
    assert reply.usage.completion_tokens == stats["generated_tokens"] == 6
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 6
    assert api_videos() <= before  # the decoded data: URL is deleted once answered


def test_the_pruning_method_is_an_extra_field(client, clip):
    reply = ask(
        client, [video_message(data_url(clip("moving_object")))], pruning_rate=0.5, pruning_method="uniform", fps=4.0
    )
    stats = reply.usage.evs
    num_groups, h, w = stats["grid_thw"]
    assert stats["pruning_method"] == "uniform"
    assert stats["video_tokens_kept"] == pruning.kept_token_count("uniform", h * w, num_groups, 0.5)
    assert set(stats["tokens_kept_per_frame"]) == {0, h * w}  # whole groups


def test_skipping_still_patches_is_an_extra_field(client, clip):
    # A clip no other test asks about, so neither answer's features come from the cache.
    messages = [video_message(data_url(clip("moving_object", seconds=2.5, size=(144, 112))))]
    plain = ask(client, messages, pruning_rate=0.0).usage.evs
    skipping = ask(client, messages, pruning_rate=0.0, skip_still_patches=True).usage.evs
    assert plain["vision_patches_encoded"] == plain["vision_patches_total"] == skipping["vision_patches_total"]
    assert plain["video_tokens_kept"] == plain["video_tokens_total"]
    # Only the units the square crossed after the first group are encoded, and at q = 0 each is one kept token.
    assert 0 < skipping["vision_patches_encoded"] < skipping["vision_patches_total"]
    assert skipping["video_tokens_kept"] * 4 == skipping["vision_patches_encoded"]
    with pytest.raises(openai.BadRequestError, match=re.escape("Skip still patches must be true or false.")):
        ask(client, messages, skip_still_patches="yes")


def test_streaming_sends_openai_chunks_then_usage(client, clip):
    messages = [video_message(data_url(clip("pan")))]
    plain = ask(client, messages, max_tokens=8, pruning_rate=0.3).choices[0].message.content
    chunks = list(
        ask(client, messages, max_tokens=8, pruning_rate=0.3, stream=True, stream_options={"include_usage": True})
    )

    assert all(chunk.object == "chat.completion.chunk" and chunk.id == chunks[0].id for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == plain  # greedy: the same answer streamed or whole
    finished = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    assert finished == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    assert chunks[-1].usage.evs["pruning_rate"] == 0.3 and chunks[-1].usage.evs["ttft_s"] > 0


def test_a_follow_up_is_history_and_hits_the_caches(client, clip):
    video = data_url(clip("pan", seconds=2.5))
    first = ask(client, [video_message(video, "Where does the camera go?")], pruning_rate=0.5)
    assert not first.usage.evs["vit_cache_hit"] and not first.usage.evs["prefix_cache_hit"]
    messages = [
        video_message(video, "Where does the camera go?"),
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And then?"},
    ]
    follow_up = ask(client, messages, pruning_rate=0.5)
    stats = follow_up.usage.evs
    assert stats["vit_cache_hit"] and stats["prefix_cache_hit"]
    assert stats["prompt_tokens"] > first.usage.evs["prompt_tokens"]  # the earlier turn is in the prompt
    assert follow_up.usage.prompt_tokens_details.cached_tokens == stats["prompt_tokens"] - stats["prefill_tokens"] > 0


def test_a_video_uploaded_to_the_server_can_be_named_by_path_or_link(api_app, client, clip):
    path = upload(api_app, clip("scene_cut"))
    by_path = ask(client, [video_message(path)])
    by_link = ask(client, [video_message(f"{api_app.url}gradio_api/file={path}")])
    assert by_path.usage.evs["video_tokens_total"] == by_link.usage.evs["video_tokens_total"] > 0
    assert Path(path).is_file()  # an upload belongs to Gradio's folder: answering does not delete it


# --- errors ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bad_videos(tmp_path_factory, clip):
    folder = tmp_path_factory.mktemp("bad-api")
    junk = folder / "junk.mp4"
    junk.write_bytes(b"this is not a video " * 50)
    return dict(junk=junk, long=clip("static", seconds=MAX_VIDEO_S + 2, fps=2, size=(64, 48)))


ERROR_CASES = {
    # case: (HTTP status, openai exception, message pattern)
    "no video": (400, openai.BadRequestError, re.escape(NO_VIDEO)),
    "empty question": (400, openai.BadRequestError, re.escape("Please type a question about the video.")),
    "rate out of range": (
        400,
        openai.BadRequestError,
        re.escape("The pruning rate must be a number at least 0 and below 1; got 1.0."),
    ),
    "unreadable": (400, openai.BadRequestError, re.escape(UNREADABLE)),
    "unreadable, streamed": (400, openai.BadRequestError, re.escape(UNREADABLE)),
    "too long": (400, openai.BadRequestError, r"The video is .+ long; the limit is .+\."),
    "too large": (400, openai.BadRequestError, r"The video is larger than the limit of 0\.954 MB\."),
    "body too large": (413, openai.APIStatusError, r"The request is larger than the limit of 2\.27 MB\."),
    "not base64": (400, openai.BadRequestError, re.escape(video_inputs.BAD_BASE64)),
    "a server file": (400, openai.BadRequestError, re.escape(video_inputs.NOT_UPLOADED)),
    "a file URL": (400, openai.BadRequestError, re.escape(video_inputs.NOT_UPLOADED)),
    "a web URL": (400, openai.BadRequestError, re.escape(video_inputs.NO_FETCHING)),
    "an expired upload": (400, openai.BadRequestError, re.escape(EXPIRED_VIDEO)),
    "too many media": (
        400,
        openai.BadRequestError,
        re.escape("5 videos and pictures were sent; this server takes at most 4 in one question."),
    ),
    "an audio part": (400, openai.BadRequestError, r"Content parts of type 'input_audio' are not supported; .+\."),
    "two user turns": (400, openai.BadRequestError, re.escape(openai_api.BAD_ORDER)),
    "another model": (
        404,
        openai.NotFoundError,
        re.escape("The model 'gpt-4o' does not exist; this server serves 'tiny-random'."),
    ),
    "messages not a list": (422, openai.UnprocessableEntityError, r"messages: .+\."),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_user_errors_are_4xx_with_one_sentence(client, clip, bad_videos, case):
    status, error_class, message = ERROR_CASES[case]
    video = data_url(clip("moving_object"))
    messages = [video_message(video)]
    kwargs = {}
    if case == "no video":
        messages = [{"role": "user", "content": QUESTION}]
    elif case == "empty question":
        messages = [video_message(video, "   ")]
    elif case == "rate out of range":
        kwargs = dict(pruning_rate=1.0)
    elif case.startswith("unreadable"):
        messages = [video_message(data_url(bad_videos["junk"]))]
        kwargs = dict(stream=True) if case.endswith("streamed") else {}
    elif case == "too long":
        messages = [video_message(data_url(bad_videos["long"]))]
    elif case == "too large":
        messages = [video_message("data:video/mp4;base64," + "A" * (MAX_FILE_BYTES * 4 // 3 + 8))]
    elif case == "body too large":
        messages = [video_message("data:video/mp4;base64," + "A" * (MAX_FILE_BYTES * 3))]
    elif case == "not base64":
        messages = [video_message("data:video/mp4;base64,not*base64!")]
    elif case == "a server file":
        messages = [video_message(str(clip("moving_object")))]  # exists, but was never uploaded
    elif case == "a file URL":
        messages = [video_message("file:///etc/passwd")]
    elif case == "a web URL":
        messages = [video_message("https://example.com/clip.mp4")]
    elif case == "an expired upload":  # a link to the upload folder is read from disk, whatever the host
        gone = Path(gr.utils.get_upload_folder()) / ("0" * 64) / "deleted.mp4"
        messages = [video_message(f"https://example.com/gradio_api/file={gone}")]
    elif case == "too many media":  # refused before any is decoded: nothing lands in api-videos/
        messages = [
            video_message(video),
            {"role": "assistant", "content": "A ball."},
            {"role": "user", "content": [{"type": "video_url", "video_url": {"url": video}}] * 4},
        ]
    elif case == "an audio part":
        messages = [
            {
                "role": "user",
                "content": [
                    {"type": "input_audio", "input_audio": {"data": "AAAA"}},
                    {"type": "text", "text": QUESTION},
                ],
            }
        ]
    elif case == "two user turns":
        messages = [video_message(video), {"role": "user", "content": "And?"}]
    elif case == "messages not a list":
        messages = "What moves?"
    model = "gpt-4o" if case == "another model" else MODEL
    before = api_videos()
    extra_body = {"pruning_rate": kwargs.pop("pruning_rate")} if "pruning_rate" in kwargs else None
    with pytest.raises(error_class) as caught:
        reply = client.chat.completions.create(
            model=model, messages=messages, max_tokens=4, extra_body=extra_body, **kwargs
        )
        if kwargs.get("stream"):
            list(reply)
    error = caught.value
    assert error.status_code == status
    assert re.fullmatch(message, error.body["message"]), error.body
    assert error.body["type"] == "invalid_request_error"
    assert "Traceback" not in error.response.text
    assert api_videos() <= before


@pytest.mark.parametrize(
    "url", ["https://example.com/cat.png", "data:image/png;base64,not*base64!", "/etc/hostname"], ids=str.split
)
def test_a_refused_picture_is_not_called_a_video(client, url):
    """An image_url the server will not read (a web URL it does not fetch, bad base64, a path it never took) gets
    a sentence that fits a picture: the sentences are shared with video_url parts, which the route reads alike."""
    picture = {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What is it?"}],
    }
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=[picture], max_tokens=4)
    said = re.sub(r"videos (and|or) pictures", "", caught.value.body["message"])
    assert "video" not in said, caught.value.body


def test_a_full_queue_answers_429_and_the_queued_requests_still_finish(api_app, client, clip):
    """Admission held (engine.paused): MAX_QUEUE requests fill the queue, the next is told to come back."""
    video = data_url(clip("moving_object"))
    engine, submitted = api_app.spy.engine, len(api_app.spy.streams)
    with ThreadPoolExecutor(MAX_QUEUE) as pool:
        with engine.paused():
            waiting = [pool.submit(ask, client, [video_message(video, f"Question {i}?")]) for i in range(MAX_QUEUE)]
            assert wait_until(lambda: len(api_app.spy.streams) == submitted + MAX_QUEUE)
            with pytest.raises(openai.RateLimitError) as caught:
                ask(client, [video_message(video)])
        assert caught.value.status_code == 429
        assert caught.value.body["message"] == (
            "The server is busy with other videos right now; please try again in a minute."
        )
        assert caught.value.response.headers["retry-after"]
        answers = [job.result(timeout=120) for job in waiting]
    assert all(reply.usage.completion_tokens == 6 for reply in answers)


def test_closing_a_stream_cancels_the_engine_request(api_app, client, clip):
    reply = ask(
        client, [video_message(data_url(clip("moving_object")), "Talk for a long time.")], max_tokens=1024, stream=True
    )
    pieces = iter(reply)
    next(pieces), next(pieces)  # the role chunk, then the first token
    stream = api_app.spy.streams[-1]
    reply.close()
    assert wait_until(lambda: stream.finished, timeout_s=30)
    assert stream.cancelled and stream.result().stats["generated_tokens"] < 1024


# --- fetching http(s) URLs, when the operator allows it --------------------------------------


@pytest.fixture(scope="module")
def web_server(tmp_path_factory, clip):
    """A plain HTTP server on the loopback serving a clip, a file over the size limit, and a redirect."""
    folder = tmp_path_factory.mktemp("web")
    (folder / "clip.mp4").write_bytes(clip("moving_object").read_bytes())
    (folder / "big.mp4").write_bytes(bytes(MAX_FILE_BYTES + 1))

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/moved":
                self.send_response(302)
                self.send_header("Location", "/clip.mp4")
                self.end_headers()
                return
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", folder
    server.shutdown()


def test_fetching_is_bounded_and_public_addresses_only(tmp_path, web_server):
    base, folder = web_server
    anywhere = video_inputs.VideoPolicy(tmp_path, MAX_FILE_BYTES, fetch_urls=True, address_allowed=lambda _: True)

    for url in (f"{base}/clip.mp4", f"{base}/moved"):
        video = asyncio.run(video_inputs.local_video(url, anywhere))
        assert video.path.read_bytes() == (folder / "clip.mp4").read_bytes()
        video.release()
        assert not video.path.exists()
    with pytest.raises(InputError, match=r"The video is larger than the limit of 0\.954 MB\."):
        asyncio.run(video_inputs.local_video(f"{base}/big.mp4", anywhere))
    with pytest.raises(InputError, match="HTTP 404"):
        asyncio.run(video_inputs.local_video(f"{base}/missing.mp4", anywhere))
    assert list((tmp_path / video_inputs.API_VIDEOS_FOLDER).iterdir()) == []  # nothing half-written left

    public_only = video_inputs.VideoPolicy(tmp_path, MAX_FILE_BYTES, fetch_urls=True)
    with pytest.raises(InputError, match="only fetches videos from public internet addresses"):
        asyncio.run(video_inputs.local_video(f"{base}/clip.mp4", public_only))
    off = video_inputs.VideoPolicy(tmp_path, MAX_FILE_BYTES)
    with pytest.raises(InputError, match=re.escape(video_inputs.NO_FETCHING)):
        asyncio.run(video_inputs.local_video(f"{base}/clip.mp4", off))
