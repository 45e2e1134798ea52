"""The app launched on the tiny Nemotron-H Omni, which hears: the "Hear the soundtrack" switch on the page, and
the same switch on `/ask`, `/sweep`, the MCP tool and `/v1/chat/completions` (through gradio_client, the `mcp`
client and the `openai` client), on a clip with a soundtrack. One launch for the module."""

import base64
import json

import numpy as np
import openai
import pytest
from gradio_client import handle_file

from app_harness import launched_app
from sound_clips import write_clip_with_sound
from test_mcp import TOOL, mcp_session

MODEL = "tiny-random-nemotron-omni"
RATE_HZ = 16000
FAST = dict(max_new_tokens=4)


@pytest.fixture(scope="module")
def hearing_app(tiny_cache_dir):
    with launched_app(tiny_cache_dir, model=MODEL) as running:
        yield running


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    """2 s of speech-like sound: white noise whose loudness comes and goes four times a second."""
    samples = round(2.0 * RATE_HZ)
    noise = np.random.default_rng(2).uniform(-0.5, 0.5, samples) * np.abs(
        np.sin(np.pi * 4 * np.arange(samples) / RATE_HZ)
    )
    return write_clip_with_sound(tmp_path_factory.mktemp("soundtrack-app") / "speech.mp4", noise[None], RATE_HZ)


def test_the_page_shows_the_switch_on_for_a_model_that_hears(hearing_app):
    props = next(
        component["props"]
        for component in hearing_app.client.config["components"]
        if component.get("props", {}).get("elem_id") == "evs-hear"
    )
    assert props["visible"] is True and props["value"] is True and props["label"] == "Hear the soundtrack"


def test_ask_hears_the_soundtrack_unless_told_not_to(hearing_app, speech):
    video = handle_file(str(speech))
    _, heard, _, _ = hearing_app.client.predict(video, "What is said?", 0.5, api_name="/ask", **FAST)
    _, off, _, _ = hearing_app.client.predict(
        video, "What is said?", 0.5, hear_soundtrack=False, api_name="/ask", **FAST
    )
    assert heard["soundtrack"] == "heard" and heard["audio_tokens"] > 0 and heard["audio_seconds"] > 1.9
    assert (off["soundtrack"], off["audio_tokens"], off["audio_seconds"]) == ("off", 0, 0.0)
    assert heard["prompt_tokens"] > off["prompt_tokens"] + heard["audio_tokens"]


def test_sweep_takes_the_switch_for_every_rate(hearing_app, speech):
    video = handle_file(str(speech))
    prompt_tokens = {}
    for hear in (True, False):
        table, _, _ = hearing_app.client.predict(
            video, "What is said?", "0.3, 0.6", hear_soundtrack=hear, api_name="/sweep", **FAST
        )
        prompt_tokens[hear] = [row[table["headers"].index("prompt tokens")] for row in table["data"]]
    assert all(on > off for on, off in zip(prompt_tokens[True], prompt_tokens[False]))


def test_the_mcp_tool_takes_the_switch(hearing_app, speech):
    data_url = "data:video/mp4;base64," + base64.b64encode(speech.read_bytes()).decode()

    async def work(session):
        tools = (await session.list_tools()).tools
        calls = [
            await session.call_tool(
                TOOL,
                {
                    "video": data_url,
                    "question": "What is said?",
                    "max_new_tokens": 3,
                    **({} if hear is None else {"hear_soundtrack": hear}),
                },
            )
            for hear in (None, False)
        ]
        return tools, calls

    tools, calls = mcp_session(hearing_app, work)
    assert tools[0].inputSchema["properties"]["hear_soundtrack"]["type"] == "boolean"
    assert not any(call.isError for call in calls), [call.content for call in calls]
    heard, off = (json.loads(call.content[0].text)["stats"] for call in calls)
    assert heard["soundtrack"] == "heard" and heard["audio_tokens"] > 0
    assert off["soundtrack"] == "off" and off["audio_tokens"] == 0


def test_the_openai_route_takes_hear_soundtrack_as_a_json_boolean(hearing_app, speech):
    client = openai.OpenAI(base_url=f"{hearing_app.url}v1", api_key="unused", max_retries=0, timeout=120)
    url = "data:video/mp4;base64," + base64.b64encode(speech.read_bytes()).decode()
    messages = [
        {
            "role": "user",
            "content": [{"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": "What is said?"}],
        }
    ]

    def ask(**extra):
        return client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=4, temperature=0, extra_body=extra or None
        )

    heard, off = ask().usage.evs, ask(hear_soundtrack=False).usage.evs
    assert heard["soundtrack"] == "heard" and heard["audio_tokens"] > 0
    assert (off["soundtrack"], off["audio_tokens"]) == ("off", 0)
    with pytest.raises(openai.BadRequestError) as refused:
        ask(hear_soundtrack="yes")
    assert refused.value.status_code == 400
    assert refused.value.body["message"] == "Hear the soundtrack must be true or false."
