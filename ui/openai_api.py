"""OpenAI-compatible routes on the app's own server: `POST /v1/chat/completions` and `GET /v1/models`.

The same engine as the page answers: a conversation about videos and pictures (`video_url` and `image_url`
content parts, any number in the order the messages hold them, a later message's appended after the earlier
ones'; text parts; earlier user/assistant turns as the engine's history, so a follow-up hits the feature and KV
caches), streamed as server-sent `chat.completion.chunk` events or answered whole.
Extra body fields choose the pruning per request: `pruning_rate`, `pruning_method` ("evs", "vidcom2" or
"uniform"), `fps`, `max_frames`, `max_pixels_per_frame`;
`chat_template_kwargs: {"enable_thinking": true}` makes a model that can think do so first (as vLLM and
SGLang take it), its thinking returned as `reasoning_content` beside `content`; `hear_soundtrack: false` keeps
the video's soundtrack from a model that hears (it does by default); `skip_still_patches` (a JSON boolean)
sets whether patches that did not change since they were last encoded skip the vision tower and the prompt.
`usage` holds the token counts (the thinking's in `completion_tokens_details.reasoning_tokens`) and `evs`, the
engine's stats dict.

Errors use OpenAI's error body, {"error": {"message", "type", "param", "code"}}, with one sentence:
400 for what the caller got wrong (the engine's InputError: no video or picture, a bad rate, an unreadable,
too long or too large file, a body nested deeper than request_body.MAX_BODY_DEPTH or holding more than its
MAX_CONTAINERS objects and arrays), 404 for another model, 413 for a body over the size limit, 422 for a body
that is not a chat request, 429 when the engine's queue is full, 500 only for the server's own faults.
"""

import asyncio
import dataclasses
import json
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import ClientDisconnect

from engine.config import MAX_FILE_BYTES, GenerationParams
from engine.errors import NO_VIDEO, SERVER_FAULT, BusyError, InputError
from engine.front.checks import too_many_media, too_many_turns
from engine.front.door import request_params
from engine.front.json_text import json_text, jsonable
from engine.front.serving import Serving
from engine.stream import Event, Stream
from ui.request_body import NOT_JSON, BodyRefused, LargeBodies, receive_body
from ui.video_inputs import LocalVideo, VideoPolicy, local_files, video_policy

log = logging.getLogger(__name__)

# Unlike the page, an API caller does not watch the answer grow: allow a long one. A cut answer says
# finish_reason "length".
DEFAULT_MAX_TOKENS = 512
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default
DISCONNECT_POLL_S = 0.5
BUSY_RETRY_AFTER_S = 5
# The message (and streamed delta) field of each text event: the thinking goes where other OpenAI-compatible
# servers put it.
MESSAGE_FIELDS = {"thinking": "reasoning_content", "text": "content"}
# Room for the JSON around a data: URL of the largest upload (base64 is 4/3 of the bytes).
BODY_OVERHEAD_BYTES = 1 << 20

BAD_ORDER = "The messages must alternate user and assistant turns, starting and ending with a user message."
# A chat request nests a few levels (messages, a part, its url); a body nested far deeper is refused before
# anything walks it (Python's JSON parser and validators recurse, and a recursion error is no user's sentence).
BAD_THINKING = "chat_template_kwargs.enable_thinking must be true or false."
# A question, its answer, and room for system and developer messages between them.
MESSAGES_PER_QUESTION = 4
BODY_CUT = "The request body ended before it was complete."


class ApiError(Exception):
    """An answer in OpenAI's error format: one sentence and the HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.kind, self.code, self.param = status, message, kind, code, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"Retry-After": str(BUSY_RETRY_AFTER_S)} if self.status == 429 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def engine_error(error: BaseException) -> ApiError:
    """The HTTP face of an engine error: 429 busy, 400 the caller's mistake, else 500 (logged); a body refused
    while it arrived, its own status."""
    if isinstance(error, BodyRefused):
        return ApiError(
            error.status, str(error), "rate_limit_error" if error.status == 429 else "invalid_request_error"
        )
    if isinstance(error, ClientDisconnect):  # the client left while sending: no one reads this, and it is no fault
        return ApiError(400, BODY_CUT)
    if isinstance(error, BusyError):
        return ApiError(429, str(error), "rate_limit_error", "server_busy")
    if isinstance(error, InputError):
        return ApiError(400, str(error))
    log.error("chat completion failed", exc_info=error)
    return ApiError(500, SERVER_FAULT, "server_error")


class ChatRequest(BaseModel):
    """The fields of an OpenAI chat request this server reads; other fields are ignored unless they ask
    for something it cannot do (see `unsupported`)."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    n: int | None = None
    pruning_rate: float | None = None
    pruning_method: Any = None  # taken as sent, so that anything but a method's name gets the engine's sentence
    fps: float | None = None
    max_frames: int | None = None
    max_pixels_per_frame: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # only enable_thinking is read
    # A JSON boolean, taken as sent: pydantic would read "yes" or 1 as true, where the engine's check says what
    # the switch takes, in the sentence every other way in gives.
    hear_soundtrack: Any = None
    skip_still_patches: Any = None  # a JSON boolean, taken as sent like hear_soundtrack


def unsupported(chat: ChatRequest) -> str | None:
    """A sentence for a requested feature whose answer this server would get wrong, else None."""
    extra = chat.model_extra or {}
    if chat.n not in (None, 1):
        return "Only n = 1 is supported."
    if extra.get("tools") or extra.get("functions"):
        return "Tools and functions are not supported by this server."
    if extra.get("stop"):
        return "Stop sequences are not supported by this server."
    if extra.get("logprobs"):
        return "Log probabilities are not supported by this server."
    response_format = extra.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type", "text") != "text":
        return "Only text responses are supported (response_format type text)."
    return None


@dataclasses.dataclass
class Conversation:
    """The media URLs (videos and pictures, in order), the last question and the earlier turns."""

    media_urls: list[str]
    question: str
    history: list[tuple[str, str]]


# The content parts that name a medium, and the key that holds its URL.
MEDIA_PARTS = {"video_url": "A video_url", "image_url": "An image_url"}


def _parts(message: dict) -> list[dict]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if content is None:
        return []
    if not isinstance(content, list) or not all(isinstance(part, dict) for part in content):
        raise ApiError(400, "A message's content must be text or a list of content parts.")
    return content


def _text_and_media(message: dict) -> tuple[str, list[str]]:
    texts, media = [], []
    for part in _parts(message):
        kind = part.get("type")
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise ApiError(400, 'A text part must hold {"text": "..."}.')
            texts.append(part["text"])
        elif kind in MEDIA_PARTS:
            medium = part.get(kind)
            url = medium.get("url") if isinstance(medium, dict) else medium
            if not isinstance(url, str):
                raise ApiError(400, f'{MEDIA_PARTS[kind]} part must hold {{"url": "..."}}.')
            media.append(url)
        else:
            raise ApiError(
                400,
                f"Content parts of type {kind!r} are not supported; send videos as video_url "
                "parts, pictures as image_url parts and the question as text.",
            )
    return "\n".join(texts), media


def conversation(messages: list[dict]) -> Conversation:
    """The media, the last question and the earlier (question, answer) turns of a chat. Every user message's
    video_url and image_url parts, in order: the engine writes them all at the start of the first turn, so a
    later message's medium (a second video for a follow-up) is appended to the earlier ones.

    System and developer messages are skipped: the engine answers with its own system prompt (a model's
    prefix cache is keyed on it).
    """
    turns = [m for m in messages if m.get("role") not in ("system", "developer")]
    for message in turns:
        if message.get("role") not in ("user", "assistant"):
            raise ApiError(400, f"Messages with role {message.get('role')!r} are not supported.")
    roles = [m["role"] for m in turns]
    if not roles or len(roles) % 2 == 0 or any(role != ("user", "assistant")[i % 2] for i, role in enumerate(roles)):
        raise ApiError(400, BAD_ORDER)
    texts, media_by_turn = zip(*(_text_and_media(m) for m in turns))
    media = [url for urls in media_by_turn for url in urls]
    if not media:
        raise ApiError(400, NO_VIDEO)
    history = [(texts[i], texts[i + 1]) for i in range(0, len(texts) - 1, 2)]
    return Conversation(media, texts[-1], history)


def check_message_count(messages: list, most_turns: int) -> None:
    """Refuse a conversation past the engine's limit on earlier questions (its sentence), or with more than
    MESSAGES_PER_QUESTION messages for each question it may hold, before pydantic validates the messages:
    validating holds the GIL throughout, and 50,000 messages held every other request up for over a second."""
    questions = sum(1 for message in messages if isinstance(message, dict) and message.get("role") == "user")
    if questions - 1 > most_turns:
        raise InputError(too_many_turns(questions - 1, most_turns))
    most = MESSAGES_PER_QUESTION * (most_turns + 1)
    if len(messages) > most:
        raise ApiError(400, too_many_messages(len(messages), most))


def too_many_messages(sent: int, most: int) -> str:
    return f"The request has {sent:,} messages; the limit is {most:,}: please start a new conversation."


def usage(stats: dict) -> dict:
    prompt, completion = stats.get("prompt_tokens") or 0, stats.get("generated_tokens") or 0
    cached = prompt - (stats.get("prefill_tokens") or prompt)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": max(cached, 0)},
        "completion_tokens_details": {"reasoning_tokens": stats.get("thinking_tokens") or 0},
        "evs": jsonable(stats),
    }


def enable_thinking(chat: ChatRequest) -> bool:
    """The chat template's enable_thinking from `chat_template_kwargs` (off when not given)."""
    value = (chat.chat_template_kwargs or {}).get("enable_thinking", False)
    if not isinstance(value, bool):
        raise ApiError(400, BAD_THINKING, param="chat_template_kwargs.enable_thinking")
    return value


class ChatCompletions:
    """The two routes for one engine."""

    def __init__(self, engine: Serving, policy: VideoPolicy):
        self.engine = engine
        self.policy = policy
        self.model = engine.model_info["name"]
        self.bodies = LargeBodies()

    def routes(self) -> list[APIRoute]:
        return [
            APIRoute("/v1/models", self.models, methods=["GET"]),
            APIRoute("/v1/chat/completions", self.completions, methods=["POST"]),
        ]

    async def models(self) -> dict:
        return {
            "object": "list",
            "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "evs-video-chat"}],
        }

    async def completions(self, request: Request):
        files: list[LocalVideo] = []  # the request's temporary files: its data: URLs decoded, its fetched videos

        def release() -> None:
            for file in files:
                file.release()

        try:
            body, received = await self._body(request)
            files += received.values()
            # Off the event loop: parsing and walking up to MAX_TEXT_BYTES of JSON takes a while.
            chat, chosen, params = await asyncio.to_thread(self._chat_parts, body)
            most = self.engine.model_info["max_media"]
            if len(chosen.media_urls) > most:  # before any is fetched
                raise InputError(too_many_media(len(chosen.media_urls), most))
            media = await local_files(chosen.media_urls, self.policy, received)
            files += media
            # submit tokenizes the question and history: other users' requests must not wait for it
            stream = await asyncio.to_thread(
                self.engine.submit,
                media=[str(file.path) for file in media],
                question=chosen.question,
                params=params,
                history=chosen.history,
                client=f"address {request.client.host}" if request.client else None,
            )
        except BaseException as error:
            release()
            if not isinstance(error, Exception):  # cancelled: nothing to answer
                raise
            refusal = error if isinstance(error, ApiError) else engine_error(error)
            if refusal.status < 500:  # the engine's own refusals are counted there, and not again
                self.engine.metrics.refused(error, "front_door", busy=refusal.status == 429)
            else:
                self.engine.metrics.failed()
            return refusal.response()
        reply = Reply(self.model, stream, params.max_new_tokens)
        if not chat.stream:
            try:
                return JSONResponse(await reply.whole(request))
            except Exception as error:
                return engine_error(error).response()
            finally:
                release()
        include_usage = bool((chat.stream_options or {}).get("include_usage"))
        try:
            # Wait for the first sign that the media were read: a bad one still gets its 4xx status.
            opening = await reply.opening()
        except Exception as error:
            release()
            return engine_error(error).response()
        return ClosingStreamingResponse(
            reply.chunks(opening, include_usage, release),
            on_close=lambda: (reply.cancel(), release()),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def _body(self, request: Request) -> tuple[bytes, dict[str, LocalVideo]]:
        """The body's JSON text, its data: URLs decoded to files as they arrived (ui/request_body.py)."""
        limit = self.policy.max_bytes * 4 // 3 + BODY_OVERHEAD_BYTES
        declared = request.headers.get("content-length")
        size = int(declared) if declared and declared.isdigit() else None
        return await receive_body(request.stream(), size, self.policy, limit, self.bodies)

    def _chat_parts(self, body: bytes) -> tuple["ChatRequest", Conversation, GenerationParams]:
        chat = self._chat_request(body)
        return chat, conversation(chat.messages), self._params(chat)

    def _chat_request(self, body: bytes) -> ChatRequest:
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise ApiError(400, NOT_JSON) from None
        if not isinstance(payload, dict):
            raise ApiError(400, "The request body must be a JSON object.")
        if isinstance(payload.get("messages"), list):
            check_message_count(payload["messages"], self.engine.model_info["max_history_turns"])
        try:
            chat = ChatRequest.model_validate(payload)
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "body"
            raise ApiError(422, f"{where}: {first['msg']}.", param=where) from None
        if chat.model != self.model:
            raise ApiError(
                404,
                f"The model {chat.model!r} does not exist; this server serves {self.model!r}.",
                code="model_not_found",
                param="model",
            )
        if reason := unsupported(chat):
            raise ApiError(400, reason)
        return chat

    def _params(self, chat: ChatRequest):
        max_tokens = next(
            (n for n in (chat.max_completion_tokens, chat.max_tokens) if n is not None), DEFAULT_MAX_TOKENS
        )
        return request_params(
            self.engine,
            pruning_rate=chat.pruning_rate,
            pruning_method=chat.pruning_method,
            fps=chat.fps,
            max_frames=chat.max_frames,
            max_pixels_per_frame=chat.max_pixels_per_frame,
            max_new_tokens=max_tokens,
            temperature=DEFAULT_TEMPERATURE if chat.temperature is None else chat.temperature,
            top_p=chat.top_p,
            # Without a seed, sampling differs from call to call, as OpenAI clients expect.
            seed=secrets.randbits(31) if chat.seed is None else chat.seed,
            enable_thinking=enable_thinking(chat),
            hear_soundtrack=chat.hear_soundtrack,
            skip_still_patches=chat.skip_still_patches,
        )


class ClosingStreamingResponse(StreamingResponse):
    """A StreamingResponse that calls `on_close` however it ends. Its body iterator's own `finally` is not enough: a
    client that leaves before the first chunk makes Starlette end the response before it starts the iterator,
    whose `finally` then never runs (the request would decode to its token limit, its files kept)."""

    def __init__(self, content, on_close: Callable[[], object], **options):
        super().__init__(content, **options)
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


class Reply:
    """One engine stream read as an OpenAI answer."""

    def __init__(self, model: str, stream: Stream, max_new_tokens: int):
        self.model, self.stream, self.max_new_tokens = model, stream, max_new_tokens
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.events = stream.aevents()

    def cancel(self) -> None:
        """End the engine request, unless it has ended."""
        if not self.stream.finished:
            self.stream.cancel()

    def finish_reason(self, stats: dict) -> str:
        return "length" if (stats.get("generated_tokens") or 0) >= self.max_new_tokens else "stop"

    async def whole(self, request: Request) -> dict:
        """The plain response; a client that hangs up cancels the engine request."""
        watcher = asyncio.create_task(_cancel_on_disconnect(request, self.stream))
        pieces, stats = {kind: [] for kind in MESSAGE_FIELDS}, {}
        try:
            async for event in self.events:
                if event.kind in pieces:
                    pieces[event.kind].append(event.text)
                elif event.kind == "done":
                    stats = event.stats or {}
        finally:
            watcher.cancel()
            if not self.stream.finished:
                self.stream.cancel()
        message = {"role": "assistant", "content": ""}  # reasoning_content only when the model thought
        message.update({MESSAGE_FIELDS[kind]: "".join(texts) for kind, texts in pieces.items() if texts})
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason(stats), "logprobs": None}],
            "usage": usage(stats),
        }

    async def opening(self) -> list[Event]:
        """Events up to the pruning picture (or the first text, or the end): errors before it are the
        caller's or the server's and still get their status code; after it, only server faults remain."""
        seen = []
        try:
            async for event in self.events:
                seen.append(event)
                if event.kind in ("evs", "thinking", "text", "done"):
                    break
        except BaseException:
            self.stream.cancel()
            raise
        return seen

    def _chunk(self, delta: dict, finish_reason: str | None = None) -> str:
        chunk = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
        }
        return f"data: {json_text(chunk)}\n\n"

    async def chunks(
        self, opening: list[Event], include_usage: bool, release: Callable[[], None]
    ) -> AsyncIterator[str]:
        """Server-sent events; the request is cancelled when the client goes away (the generator is closed), and
        `release` gives back the request's temporary files at the end."""
        stats: dict = {}

        async def all_events() -> AsyncIterator[Event]:
            for event in opening:
                yield event
            async for event in self.events:
                yield event

        try:
            yield self._chunk({"role": "assistant", "content": ""})
            async for event in all_events():
                if event.kind in MESSAGE_FIELDS and event.text:
                    yield self._chunk({MESSAGE_FIELDS[event.kind]: event.text})
                elif event.kind == "done":
                    stats = event.stats or {}
            yield self._chunk({}, self.finish_reason(stats))
            if include_usage:
                body = {
                    "id": self.id,
                    "object": "chat.completion.chunk",
                    "created": self.created,
                    "model": self.model,
                    "choices": [],
                    "usage": usage(stats),
                }
                yield f"data: {json_text(body)}\n\n"
            yield "data: [DONE]\n\n"
        except Exception as error:  # after the 200 status: OpenAI clients raise on an error event
            yield f"data: {json_text(engine_error(error).body())}\n\n"
        finally:
            if not self.stream.finished:
                self.stream.cancel()
            release()


async def _cancel_on_disconnect(request: Request, stream: Stream) -> None:
    while not stream.finished:
        if await request.is_disconnected():
            stream.cancel()
            return
        await asyncio.sleep(DISCONNECT_POLL_S)


def openai_routes(
    engine: Serving, max_file_bytes: int = MAX_FILE_BYTES, fetch_video_urls: bool = False
) -> list[APIRoute]:
    """`GET /v1/models` and `POST /v1/chat/completions` for `engine`, to go into the server's FastAPI
    routes (app.py and the tests pass them as `app_kwargs["routes"]`).

    max_file_bytes: the upload limit, for data: URLs and fetched videos too. fetch_video_urls: fetch
    http(s) video URLs of other hosts (off: refused with a sentence).
    """
    return ChatCompletions(engine, video_policy(max_file_bytes, fetch_video_urls)).routes()
