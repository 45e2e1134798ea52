"""The front door (engine/front/door.py): every way in says the same sentence for the same mistake, the
one the engine's checks and sentences define; loose values become settings with the engine's defaults;
one merge of streams; and `Engine` and `ReplicatedEngine` both offer the `Serving` interface."""

import asyncio
import base64
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import gradio as gr
import openai
import pytest
from gradio_client import handle_file
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

from engine import Engine, GenerationParams
from engine.errors import BAD_HISTORY, BAD_NUMBERS, NO_VIDEO, InputError
from engine.front.checks import check_params
from engine.front.door import defaults, history_pairs, merged, request_params
from engine.front.serving import Serving
from engine.stream import Event, Stream
from ui.handlers import Handlers

QUESTION = "What moves?"
BAD_RATE = 1.5
BAD_METHOD = "fastvid"
REPO = Path(__file__).resolve().parent.parent


def refusal(attempt) -> str:
    with pytest.raises(Exception) as caught:
        attempt()
    return str(caught.value)


# --- the same mistake, every way in ------------------------------------------------------------


def data_url(video: Path) -> str:
    return "data:video/mp4;base64," + base64.b64encode(video.read_bytes()).decode()


def through_the_page(app, video: Path | None, question: str, rate: float, method: str) -> str:
    """The browser's Ask handler (a private endpoint, so called here as Gradio calls it), with the
    sliders' other values."""
    settings = defaults(app.spy)
    sampling = settings.frame_sampling

    async def ask():
        async for _ in Handlers(app.spy).chat(
            str(video) if video else None,
            question,
            rate,
            method,
            sampling.fps,
            sampling.max_frames,
            sampling.max_pixels_per_frame,
            settings.max_new_tokens,
            settings.temperature,
            False,
            False,
            False,
            False,
            False,
            [],  # turns
            [],  # asked_media
        ):
            pass

    with pytest.raises(gr.Error) as caught:
        asyncio.run(ask())
    return caught.value.message


def through_ask(app, video: Path | None, question: str, rate: float, method: str) -> str:
    file = handle_file(str(video)) if video else None
    return refusal(
        lambda: app.client.predict(file, question, rate, max_new_tokens=6, pruning_method=method, api_name="/ask")
    )


def through_openai(app, video: Path | None, question: str, rate: float, method: str) -> str:
    client = openai.OpenAI(base_url=f"{app.url}v1", api_key="unused", max_retries=0, timeout=120)
    parts = [{"type": "video_url", "video_url": {"url": data_url(video)}}] if video else []
    messages = [{"role": "user", "content": [*parts, {"type": "text", "text": question}]}]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=app.spy.model_info["name"],
            messages=messages,
            max_tokens=6,
            extra_body={"pruning_rate": rate, "pruning_method": method},
        )
    return caught.value.body["message"]


def through_mcp(app, video: Path | None, question: str, rate: float, method: str) -> str:
    arguments = {
        "video": data_url(video) if video else "",
        "question": question,
        "pruning_rate": rate,
        "max_new_tokens": 6,
        "pruning_method": method,
    }

    async def call():
        async with streamablehttp_client(f"{app.url}gradio_api/mcp/") as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await session.call_tool("answer_video_question", arguments)

    result = asyncio.run(call())
    assert result.isError, result.content
    [content] = result.content
    return content.text


def through_sweep(app, video: Path | None, question: str, rate: float, method: str) -> str:
    file = handle_file(str(video)) if video else None
    return refusal(
        lambda: app.client.predict(file, question, str(rate), max_new_tokens=6, methods=method, api_name="/sweep")
    )


def through_the_command_line(app, video: Path | None, question: str, rate: float, method: str) -> str:
    """`python -m engine` in its own process, on the app's model: its sentence is stderr's "error: " line (the
    engine's log lines go to stderr too)."""
    args = [
        "--video",
        str(video),
        "--question",
        question,
        "--pruning-rate",
        str(rate),
        "--pruning-method",
        method,
        "--model",
        app.spy.model_info["name"],
        "--device",
        "cpu",
        "--max-new-tokens",
        "6",
    ]
    env = {**os.environ, "EVS_CACHE_DIR": str(app.spy.engine.config.cache_dir)}
    done = subprocess.run(
        [sys.executable, "-m", "engine", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    return next(line for line in done.stderr.splitlines() if line.startswith("error: ")).removeprefix("error: ")


WAYS_IN = {
    "the page": through_the_page,
    "/ask": through_ask,
    "/v1/chat/completions": through_openai,
    "the MCP tool": through_mcp,
}
# A bad method also through the sweep and the command line: the other mistakes need no second look there.
EVERY_WAY_IN = {**WAYS_IN, "/sweep": through_sweep, "python -m engine": through_the_command_line}


def expected_sentence(app, case: str) -> str:
    """What the front door says: its constant, or the engine's check on the same values."""
    if case == "no video":
        return NO_VIDEO
    engine = app.spy.engine
    question, params = {
        "a question too long": ("x" * (engine.config.max_question_chars + 1), GenerationParams()),
        "a bad pruning rate": (QUESTION, GenerationParams(pruning_rate=BAD_RATE)),
        "a bad pruning method": (QUESTION, GenerationParams(pruning_method=BAD_METHOD)),
    }[case]
    return refusal(lambda: check_params(question, params, engine.config, engine.frame_sampling_limits))


@pytest.mark.parametrize("case", ["a question too long", "a bad pruning rate", "no video"])
def test_every_way_in_returns_the_same_sentence(app, clip, case):
    video = None if case == "no video" else clip("moving_object")
    question = "x" * (app.spy.engine.config.max_question_chars + 1) if case == "a question too long" else QUESTION
    rate = BAD_RATE if case == "a bad pruning rate" else defaults(app.spy).pruning_rate
    sentence = expected_sentence(app, case)
    method = defaults(app.spy).pruning_method
    said = {way: refuse(app, video, question, rate, method) for way, refuse in WAYS_IN.items()}
    assert said == dict.fromkeys(WAYS_IN, sentence)
    assert not any("Traceback" in text for text in said.values())


def test_a_bad_pruning_method_is_one_sentence_every_way_in(app, clip):
    sentence = expected_sentence(app, "a bad pruning method")
    assert sentence == "The pruning method must be evs, vidcom2 or uniform; got 'fastvid'."
    rate = defaults(app.spy).pruning_rate
    video = clip("moving_object")
    said = {way: refuse(app, video, QUESTION, rate, BAD_METHOD) for way, refuse in EVERY_WAY_IN.items()}
    assert said == dict.fromkeys(EVERY_WAY_IN, sentence)


# --- loose values ------------------------------------------------------------------------------


def test_loose_values_become_settings_and_left_out_ones_the_engines_defaults(app):
    engine = app.spy
    params = request_params(engine, pruning_rate="0.5", max_frames=12.0, max_new_tokens="7", temperature=None)
    assert params.pruning_rate == 0.5 and params.max_new_tokens == 7
    assert params.frame_sampling.max_frames == 12 and isinstance(params.frame_sampling.max_frames, int)
    assert params.frame_sampling.fps == engine.default_frame_sampling.fps
    assert params.temperature == GenerationParams.temperature
    assert params.pruning_method == "evs"
    assert request_params(engine, pruning_method="uniform").pruning_method == "uniform"
    assert request_params(engine) == defaults(engine)
    assert defaults(engine).pruning_rate == engine.model_info["default_pruning_rate"]
    for bad in ("a lot", [], float("inf")):
        with pytest.raises(InputError, match=f"^{re.escape(BAD_NUMBERS)}$"):
            request_params(engine, max_new_tokens=bad)


def test_history_is_pairs_of_text():
    assert history_pairs(None) == [] and history_pairs([["Q?", "A."]]) == [("Q?", "A.")]
    for bad in ("not a list", [["only a question"]], [["Q?", 3]]):
        with pytest.raises(InputError, match=f"^{re.escape(BAD_HISTORY)}$"):
            history_pairs(bad)


def test_the_merge_interleaves_streams_and_reports_a_failure_in_its_place():
    first, second = Stream(1), Stream(2)
    first.push(Event("text", "a"))
    second.fail(InputError("second went wrong"))
    first.push(Event("done", stats={}))

    async def read():
        return [
            (index, event and event.kind, error and str(error))
            async for index, event, error in merged({0: first, 1: second})
        ]

    seen = asyncio.run(read())
    assert [kind for index, kind, _ in seen if index == 0] == ["text", "done"]
    assert [entry for entry in seen if entry[0] == 1] == [(1, None, "second went wrong")]


# --- one interface -----------------------------------------------------------------------------


def test_engine_and_replicated_engine_offer_the_serving_interface():
    from replicas.client import ReplicatedEngine

    members = {name: value for name, value in vars(Serving).items() if not name.startswith("_")}
    for served in (Engine, ReplicatedEngine):
        for name, declared in members.items():
            offered = getattr(served, name)
            if callable(declared):
                assert list(inspect.signature(offered).parameters) == list(inspect.signature(declared).parameters), (
                    f"{served.__name__}.{name}"
                )
            else:
                assert isinstance(offered, property), f"{served.__name__}.{name}"
        init = inspect.getsource(served.__init__)
        assert all(f"self.{name} =" in init for name in Serving.__annotations__), served.__name__
