"""The app's MCP server through the `mcp` client over streamable HTTP: one tool, called on an uploaded clip."""

import asyncio
import base64
from pathlib import Path

import gradio as gr
import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

from app_harness import strict_json
from ui import video_inputs

TOOL = "answer_video_question"


def mcp_session(app, work):
    """Run `work(session)` in an initialised MCP session with the app; returns its result."""

    async def run():
        async with streamablehttp_client(f"{app.url}gradio_api/mcp/") as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await work(session)

    return asyncio.run(run())


def upload(app, path: Path) -> str:
    with open(path, "rb") as file:
        response = httpx.post(f"{app.url}gradio_api/upload", files={"files": (path.name, file, "video/mp4")})
    response.raise_for_status()
    return response.json()[0]


def test_the_server_lists_exactly_one_documented_tool(app):
    tools = mcp_session(app, lambda session: session.list_tools()).tools
    assert [tool.name for tool in tools] == [TOOL]  # /ask and /sweep are API endpoints, not tools
    tool = tools[0]
    assert "Efficient Video Sampling" in tool.description and "JSON" in tool.description
    properties = tool.inputSchema["properties"]
    assert list(properties) == [
        "video",
        "question",
        "pruning_rate",
        "max_new_tokens",
        "enable_thinking",
        "hear_soundtrack",
        "pruning_method",
        "media",
        "skip_still_patches",
    ]
    assert properties["pruning_method"]["default"] == "evs" and "vidcom2" in properties["pruning_method"]["description"]
    assert properties["media"]["type"] == "array" and properties["media"]["items"] == {"type": "string"}
    assert all(properties[name].get("description") for name in properties)
    assert "upload" in properties["video"]["description"]
    assert properties["pruning_rate"]["default"] == app.spy.model_info["default_pruning_rate"]  # the model's own
    assert properties["enable_thinking"]["type"] == properties["hear_soundtrack"]["type"] == "boolean"
    assert properties["skip_still_patches"]["type"] == "boolean"
    assert sorted(tool.inputSchema["required"]) == ["question", "video"]


def test_the_tool_answers_about_an_uploaded_clip(app, clip):
    link = f"{app.url}gradio_api/file={upload(app, clip('moving_object'))}"
    arguments = {
        "video": link,
        "question": "What moves?",
        "pruning_rate": 0.5,
        "max_new_tokens": 5,
        "pruning_method": "vidcom2",
    }
    result = mcp_session(app, lambda session: session.call_tool(TOOL, arguments))
    assert not result.isError, result.content
    [content] = result.content
    reply = strict_json(content.text)
    assert isinstance(reply["answer"], str) and reply["answer"]
    stats = reply["stats"]
    assert stats["pruning_rate"] == 0.5 and stats["generated_tokens"] == 5
    assert stats["video_tokens_kept"] < stats["video_tokens_total"]
    assert stats["pruning_method"] == "vidcom2" and min(stats["tokens_kept_per_frame"]) >= 1


def test_the_tool_takes_a_data_url_and_refuses_other_paths(app, clip):
    video = clip("pan", seconds=1.5)
    data_url = "data:video/mp4;base64," + base64.b64encode(video.read_bytes()).decode()

    async def work(session):
        by_data = await session.call_tool(TOOL, {"video": data_url, "question": "Where?", "max_new_tokens": 3})
        elsewhere = await session.call_tool(TOOL, {"video": str(video), "question": "Where?"})
        return by_data, elsewhere

    folder = Path(gr.utils.get_upload_folder()) / video_inputs.API_VIDEOS_FOLDER
    before = set(folder.glob("*"))
    by_data, elsewhere = mcp_session(app, work)
    assert not by_data.isError and strict_json(by_data.content[0].text)["stats"]["generated_tokens"] == 3
    assert elsewhere.isError
    assert video_inputs.NOT_UPLOADED in elsewhere.content[0].text
    assert "Traceback" not in elsewhere.content[0].text
    assert set(folder.glob("*")) <= before  # the decoded data: URL was deleted
