"""The one tool the app offers over MCP (Gradio's MCP server, at /gradio_api/mcp/).

Gradio turns every public endpoint into an MCP tool and reads the tool's description and arguments from
the function's docstring (one line per argument); `/ask` and `/sweep` are kept out of the list
(handlers.not_an_mcp_tool), so agents see this one tool.

One output, a JSON string: Gradio's MCP server turns a tool's several outputs into one Python repr.

The video (and the `media` list of more videos and pictures) arrives as text, not as a Gradio file: Gradio
would download any URL given for a file input itself, and could not reach this server's own upload links
from a server on a private address. Here the
same rules as the OpenAI endpoint's `video_url` apply (ui/video_inputs.py): a data: URL, an upload of this
server named by its link or path, and other URLs only when the operator allows fetching.
"""

import gradio as gr

from engine.config import CPU_MAX_MEDIA, DEFAULT_PRUNING_RATE, GPU_MAX_MEDIA, GenerationParams
from engine.errors import InputError
from engine.front.checks import too_many_media
from engine.front.door import follow, request_params
from engine.front.json_text import json_text
from engine.front.serving import Serving
from ui.gradio_errors import raises_gradio_errors
from ui.handlers import client_of
from ui.runs import RunView
from ui.video_inputs import VideoPolicy, local_files

TOOL_MAX_NEW_TOKENS = 256


def string_list_input(label: str) -> gr.JSON:
    """A hidden input holding a list of strings (the tool's `media`), described to MCP clients as one: Gradio
    describes a JSON input by a schema of no type, which they refuse. (A subclass of gr.JSON would do it too,
    but Gradio writes a .pyi file beside the module of every component class it meets.)"""
    component = gr.JSON(None, label=label, visible=False)
    component.api_info = lambda: {"type": "array", "items": {"type": "string"}, "description": "a list of strings"}
    return component


class VideoQuestionTool:
    """The MCP tool of one demo; Gradio names the tool after the method."""

    def __init__(self, engine: Serving, policy: VideoPolicy):
        self.engine = engine
        self.policy = policy

    @raises_gradio_errors
    async def answer_video_question(
        self,
        video: str,
        question: str,
        pruning_rate: float | None = None,
        max_new_tokens: int = TOOL_MAX_NEW_TOKENS,
        enable_thinking: bool = False,
        hear_soundtrack: bool | None = None,
        pruning_method: str | None = None,
        media: list[str] | None = None,
        skip_still_patches: bool | None = None,
        request: gr.Request = None,
    ) -> str:
        """Answer a question about a video with a vision-language model that first drops the video tokens
        that barely change between frames (Efficient Video Sampling, EVS).

        Args:
            video: The video (mp4, webm, mov, ...): the URL this server gave for an upload (POST /gradio_api/upload, then /gradio_api/file=<path>), the uploaded path itself, or a data:video/mp4;base64,... URL. Other web URLs are fetched only if the server's operator allows it.
            question: The question about the video, in plain text.
            pruning_rate: EVS pruning rate q, at least 0 and below 1: the fraction of video tokens dropped before the language model reads them; 0 keeps every token, higher answers sooner and may miss detail (default: the model's own, {default_rate:g} unless its checkpoint names another).
            max_new_tokens: The most tokens the answer may have, thinking included (default {max_new_tokens}).
            enable_thinking: Think first: the model reasons before it answers, which takes more tokens and time and may answer better; only models that can think do (default false).
            hear_soundtrack: Hear the video's soundtrack (speech, music, sounds) beside its frames; only models with an audio tower do, and they hear it unless this is false.
            pruning_method: Which video tokens are dropped: "evs" drops those that barely changed since the previous frame (the default), "vidcom2" keeps those most unlike the rest of the video, giving unusual frames more, "uniform" keeps whole frames evenly spaced.
            media: More videos and pictures (png, jpeg, webp, gif, ...) to ask about in the same question, after the video, in order: a list of strings given as the video is (data:image/png;base64,... for a picture); at most {cpu_media} in all on a CPU server, {gpu_media} on a GPU one, unless its operator set another limit.
            skip_still_patches: Skip still patches: parts of frames that did not change since they were last seen skip the vision encoder and the prompt, which answers sooner on screen recordings and still cameras; only models whose vision encoder can do (default: the server's, {skip_default}).

        Returns:
            A JSON object: "answer", the model's answer (greedy decoding); with enable_thinking, "thinking", what the model thought first; and "stats", the request's numbers (pruning_method, video_tokens_total and video_tokens_kept, summed over the videos; media, one entry per video or picture with its kind, tokens_total and tokens_kept; audio_tokens and soundtrack: whether it was heard, prompt_tokens, generated_tokens with thinking_tokens and answer_tokens, ttft_s: time to first token, vision_patches_total and vision_patches_encoded, and the time of each stage).
        """
        params = request_params(
            self.engine,
            pruning_rate=pruning_rate,
            pruning_method=pruning_method,
            max_new_tokens=max_new_tokens,
            enable_thinking=enable_thinking,
            hear_soundtrack=hear_soundtrack,
            skip_still_patches=skip_still_patches,
        )
        urls = [video, *more_media(media)]
        if len(urls) > self.engine.model_info["max_media"]:  # before any is decoded or fetched
            raise InputError(too_many_media(len(urls), self.engine.model_info["max_media"]))
        local = await local_files(urls, self.policy)
        try:
            run = RunView.of(params)
            paths = [str(file.path) for file in local]
            async for _, event in follow(self.engine, paths, question, [params], [], client=client_of(request)):
                run.apply(event)
            thinking = {"thinking": run.thinking} if params.enable_thinking else {}
            return json_text({"answer": run.answer, **thinking, "stats": run.stats or {}})
        finally:
            for file in local:
                file.release()

    # Gradio reads the description from the docstring: the defaults go in from their one definition.
    answer_video_question.__doc__ = answer_video_question.__doc__.format(
        default_rate=DEFAULT_PRUNING_RATE,
        max_new_tokens=TOOL_MAX_NEW_TOKENS,
        cpu_media=CPU_MAX_MEDIA,
        gpu_media=GPU_MAX_MEDIA,
        skip_default=str(GenerationParams.skip_still_patches).lower(),
    )


def more_media(media) -> list[str]:
    """The tool's `media`: a list of strings (None or [] for none); InputError for anything else."""
    if media is None:
        return []
    if not isinstance(media, list) or not all(isinstance(item, str) for item in media):
        raise InputError("The media must be a list of strings, each a video or a picture given as the video is.")
    return media
