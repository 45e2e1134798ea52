"""`/v1/live`: a WebSocket per live session on the app's own port (docs/live.md, "WebSocket /v1/live").

Frames come in as binary messages (an 8-byte big-endian capture time, then JPEG or PNG bytes: ui/live_frames.py
decodes them once their header says they are small enough), questions and the rest as JSON text. Out go the
answers' events, each answer's end with its stats, the session's stats every second while frames arrive, and one
sentence for each mistake; the session goes on after a mistake. The session closes, and its state is freed, when
the socket closes, when the client stops answering pings (uvicorn's), or when nothing has come for `idle_s`.

Decoding a frame and pushing it (which makes each group's pixels with the HF processor) run on a worker thread,
one message at a time per socket, so the server's event loop keeps serving everyone else; so does every other call
of the session (behind the replicas each one is a Ray call, which may wait for its replica up to a minute). A
session lost with its replica is replaced by a new one on the same socket, with one "status" message saying so.
"""

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

from fastapi import WebSocket, WebSocketDisconnect
from fastapi.routing import APIWebSocketRoute
from starlette.websockets import WebSocketState

from engine.config import MAX_VIDEO_SOURCE_PIXELS
from engine.errors import SERVER_FAULT, BusyError, InputError, SessionEnded, SessionLost
from engine.front.door import history_pairs, request_params
from engine.front.json_text import json_text
from engine.front.serving import Serving
from engine.stream import Stream
from ui.live_frames import TIME_HEADER, frame_message

log = logging.getLogger(__name__)

STATS_EVERY_S = 1.0  # the session's stats go out this often while frames arrive
IDLE_S = 60.0  # EngineConfig.read_timeout_s's default: a client silent this long has gone
# WebSocket close codes (RFC 6455): a session refused for now, a message the endpoint does not take, a fault.
TRY_AGAIN_LATER, POLICY, SERVER_ERROR = 1013, 1008, 1011
# What the two kinds of settings may hold: the session's sampling and rate at opening; an answer's at asking.
OPEN_SETTINGS = frozenset({"pruning_rate", "fps", "max_pixels_per_frame", "skip_still_patches"})
ASK_SETTINGS = frozenset({"max_new_tokens", "temperature", "enable_thinking"})
EVENT_KINDS = ("status", "thinking", "text")  # an answer's events sent on as they come

NOT_A_MESSAGE = (
    'A text message must be a JSON object whose "type" is "open", "ask", "watch", "unwatch", "stats" or "close".'
)
OPENED_ALREADY = 'The live session is already open: "open" may only be the first message.'
NO_QUESTION = 'An ask message needs a question: {"type": "ask", "question": "..."}.'
REOPENED = (
    "The server restarted the part of it that held this live session, so a new one goes on from the next frame: "
    "questions are about what it has seen since."
)

NO_WATCH_QUESTION = 'A watch message needs a question: {"type": "watch", "question": "..."}.'
EVENTS_EVERY_S = 0.25  # how often the watches' new events are looked for and sent


def no_watch(watch_id) -> str:
    return f"There is no open watch {json.dumps(watch_id)} on this live session."


def watch_taken(watch_id) -> str:
    return f"A watch {json.dumps(watch_id)} is already open on this live session; unwatch it or pick another id."


@dataclass
class SocketWatch:
    """A watch the socket opened: the watch, the session it is on, its question and settings (to put it on a new
    session when that one is lost with its replica), and how many of its events were sent."""

    watch: Any
    live: Any
    question: str
    params: Any
    seen: int = 0


def idle_sentence(idle_s: float) -> str:
    return f"Nothing came for {idle_s:g} seconds, so the live session is closed."


def _settings(message: dict, allowed: frozenset[str]) -> dict[str, Any]:
    """The message's "params", when an object whose keys are among `allowed`; InputError otherwise."""
    params = message.get("params") or {}
    if not isinstance(params, dict):
        raise InputError('"params" must be a JSON object.')
    if unknown := sorted(set(params) - allowed):
        raise InputError(f"Unknown setting {unknown[0]!r} here; this message takes {', '.join(sorted(allowed))}.")
    return params


class LiveSocket:
    """One socket's live session: what each message does, and the messages sent back.

    engine: the app's engine (Engine or ReplicatedEngine, both open live sessions). max_source_pixels: the most
    pixels a frame may have, refused from its header before decoding. idle_s: how long the socket may be silent.
    """

    def __init__(self, socket: WebSocket, engine: Serving, max_source_pixels: int, idle_s: float):
        self.socket, self.engine = socket, engine
        self.max_source_pixels, self.idle_s = max_source_pixels, idle_s
        self.live = None
        self._params = None  # the session's settings, for a new session when its replica is lost
        self._reopening = asyncio.Lock()
        self._send_lock = asyncio.Lock()
        self._answers: dict[asyncio.Task, Stream] = {}
        self._watches: dict[Any, SocketWatch] = {}  # by id
        self._frames_since_stats = 0
        self._asked = 0

    async def run(self) -> None:
        await self.socket.accept()
        tasks: list[asyncio.Task] = []
        try:
            first = await self._receive()
            if first is None:
                return
            opening = self._open_message(first)
            try:
                params = request_params(self.engine, **_settings(opening, OPEN_SETTINGS)) if opening else None
            except InputError:  # a session asked for and refused here, before the engine saw it
                self.engine.metrics.live_session("refused")
                raise
            self._params = params
            self.live = await asyncio.to_thread(self.engine.open_live, params)
            tasks.append(asyncio.create_task(self._stats_every_second()))
            tasks.append(asyncio.create_task(self._watch_events()))
            message = None if opening else first
            while True:
                if message is not None and not await self._handle(message):
                    return
                message = await self._receive()
                if message is None:
                    return
        except BusyError as error:  # max_live_sessions open, or the server going down: come back later
            await self._error(str(error))
            await self._close(TRY_AGAIN_LATER)
        except InputError as error:  # the opening's settings: there is no session to go on with
            await self._error(str(error))
            await self._close(POLICY)
        except WebSocketDisconnect:
            pass
        finally:
            for task in [*tasks, *self._answers]:
                task.cancel()
            for stream in self._answers.values():
                stream.cancel()
            if self.live is not None:
                await asyncio.to_thread(self.live.close)  # never raises (a lost replica's session is gone already)

    def _open_message(self, message) -> dict | None:
        """The first message when it is an "open" text message (parsed), else None: the engine's defaults."""
        if isinstance(message, str):
            try:
                parsed = json.loads(message)
            except (ValueError, RecursionError):
                return None
            if isinstance(parsed, dict) and parsed.get("type") == "open":
                return parsed
        return None

    async def _receive(self) -> bytes | str | None:
        """The next message (bytes: a frame, str: JSON), or None once the socket is closed, or it was silent for
        idle_s with no answer under way."""
        receiving = asyncio.ensure_future(self.socket.receive())
        try:
            # Silent while an answer streams is waiting for it, not gone.
            while not (await asyncio.wait([receiving], timeout=self.idle_s))[0]:
                if not self._answers:
                    await self._error(idle_sentence(self.idle_s))
                    await self._close(1000)
                    return None
        finally:
            receiving.cancel()
        message = receiving.result()
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
        return message["bytes"] if message.get("bytes") is not None else message.get("text")

    async def _handle(self, message: bytes | str) -> bool:
        """Do what one message asks; False when the socket is to close."""
        if self.live is None:  # lost with its replica, and no other could be opened: the socket is closed
            return False
        if isinstance(message, bytes):
            return await self._frame(message)
        try:
            request = json.loads(message)
        except (ValueError, RecursionError):
            request = None
        kind = request.get("type") if isinstance(request, dict) else None
        if kind == "ask":
            await self._ask(request)
        elif kind == "watch":
            await self._watch(request)
        elif kind == "unwatch":
            await self._unwatch(request)
        elif kind == "stats":
            await self._send_stats()
        elif kind == "close":
            await self._close(1000)
            return False
        else:  # a malformed ask, refused here
            self.engine.metrics.refused(where="front_door", busy=False)
            await self._error(OPENED_ALREADY if kind == "open" else NOT_A_MESSAGE)
        return True

    async def _frame(self, message: bytes) -> bool:
        """Decode and push one frame; a bad one is one sentence, a session lost with its replica is replaced, one
        that the server ended otherwise (shutting down) closes the socket."""
        t_s = TIME_HEADER.unpack_from(message)[0] if len(message) >= TIME_HEADER.size else None
        live = self.live
        try:
            await asyncio.to_thread(self._push, live, message)
            self._frames_since_stats += 1
            return True
        except SessionLost:
            return await self._reopen(live)
        except SessionEnded as error:  # closed by the server (shutting down): nothing more will be taken
            await self._error(str(error), t_s=t_s)
            await self._close(TRY_AGAIN_LATER)
            return False
        except InputError as error:  # this frame: the session goes on
            await self._error(str(error), t_s=t_s)
            return True
        except RuntimeError as error:  # the session failed on the server (LiveSession says so in a sentence)
            await self._error(str(error) or SERVER_FAULT, t_s=t_s)
            await self._close(SERVER_ERROR)
            return False

    def _push(self, live, message: bytes) -> None:
        frame, t_s = frame_message(message, self.max_source_pixels)
        live.push(frame, t_s)

    async def _reopen(self, lost) -> bool:
        """A new session in place of `lost`, whose replica is gone, with one status message; False (the socket
        closed with the refusal's sentence) when none can be opened. Once per lost session, whoever finds it."""
        async with self._reopening:
            if self.live is not lost:
                return True
            try:
                self.live = await asyncio.to_thread(self.engine.open_live, self._params)
            except InputError as error:  # every replica full, or the server going down
                self.live = None
                await self._error(str(error))
                await self._close(TRY_AGAIN_LATER)
                return False
            await self._send({"type": "status", "message": REOPENED})
            for watch_id, held in list(self._watches.items()):  # the lost session's watches, on the new one
                try:
                    held.watch = await asyncio.to_thread(self.live.watch, held.question, held.params)
                    held.live, held.seen = self.live, 0
                except InputError as error:
                    del self._watches[watch_id]
                    await self._error(str(error), id=watch_id)
            return True

    async def _ask(self, request: dict) -> None:
        self._asked += 1
        answer_id = request.get("id")
        answer_id = answer_id if isinstance(answer_id, (str, int)) else f"q{self._asked}"
        question, live = request.get("question"), self.live
        try:
            if not isinstance(question, str):
                raise InputError(NO_QUESTION)
            params = request_params(self.engine, **_settings(request, ASK_SETTINGS))
            history = history_pairs(request.get("history"))
            stream = await asyncio.to_thread(live.ask, question, history, params)
        except InputError as error:  # BusyError and SessionLost among them
            await self._refused(error, answer_id, live)
            return
        task = asyncio.create_task(self._answer(answer_id, stream))
        self._answers[task] = stream
        task.add_done_callback(self._answers.pop)

    async def _refused(self, error: InputError, message_id, live) -> None:
        """An ask or watch refused: counted in /metrics (unless the engine counted it), its sentence sent with the
        message's id; when `live` was lost with its replica, a new session in its place."""
        self.engine.metrics.refused(error, "front_door")
        await self._error(str(error), id=message_id)
        if isinstance(error, SessionLost):
            await self._reopen(live)

    async def _watch(self, request: dict) -> None:
        """Open a watch (LiveSession.watch): "watching" with its id, then its events as they come."""
        watch_id = request.get("id")
        watch_id = watch_id if isinstance(watch_id, (str, int)) else f"w{len(self._watches) + 1}"
        question, live = request.get("question"), self.live
        try:
            if not isinstance(question, str):
                raise InputError(NO_WATCH_QUESTION)
            if watch_id in self._watches:
                raise InputError(watch_taken(watch_id))
            params = request_params(self.engine, **_settings(request, ASK_SETTINGS))
            watch = await asyncio.to_thread(live.watch, question, params)
        except InputError as error:
            await self._refused(error, watch_id, live)
            return
        self._watches[watch_id] = SocketWatch(watch, live, question, params)
        await self._send({"type": "watching", "id": watch_id, "question": question.strip()})

    async def _unwatch(self, request: dict) -> None:
        """Close a watch: "unwatched" with its stats; an id with no open watch is one sentence."""
        watch_id = request.get("id")
        held = self._watches.pop(watch_id, None) if isinstance(watch_id, (str, int)) else None
        if held is None:
            await self._error(no_watch(watch_id), id=watch_id if isinstance(watch_id, (str, int)) else None)
            return
        try:
            await asyncio.to_thread(held.watch.close)
            stats = await asyncio.to_thread(held.watch.stats)
        except SessionEnded as error:  # the session is gone, and the watch with it
            stats = None
            if isinstance(error, SessionLost):
                await self._reopen(held.live)
        await self._send({"type": "unwatched", "id": watch_id, "stats": stats})

    async def _watch_events(self) -> None:
        """Every EVENTS_EVERY_S, each watch's new events, in order: {"type": "watch_event", "id", "t_s", "answer",
        "alert", "previous", "group"}."""
        try:
            while True:
                await asyncio.sleep(EVENTS_EVERY_S)
                for watch_id, held in list(self._watches.items()):
                    watch, live = held.watch, held.live
                    try:
                        events, seen = await asyncio.to_thread(watch.events_after, held.seen, 0)
                    except SessionLost:  # its watches go on a new session (once, whoever finds it lost)
                        await self._reopen(live)
                        break
                    except SessionEnded:  # closed by the server: the next frame says so
                        return
                    if held.watch is not watch:  # put on a new session meanwhile: its events start again
                        continue
                    held.seen = seen
                    for event in events:
                        await self._send(
                            {
                                "type": "watch_event",
                                "id": watch_id,
                                "t_s": event.t_s,
                                "answer": event.answer,
                                "alert": event.alert,
                                "previous": event.previous,
                                "group": event.group,
                            }
                        )
        except WebSocketDisconnect:
            pass

    async def _answer(self, answer_id, stream: Stream) -> None:
        """An answer's events, sent on as they come, then its end with its stats (or its sentence)."""
        try:
            async for event in stream.aevents():
                if event.kind in EVENT_KINDS:
                    await self._send({"type": "event", "id": answer_id, "kind": event.kind, "text": event.text})
                elif event.kind == "done":
                    await self._send({"type": "done", "id": answer_id, "stats": event.stats or {}})
        except WebSocketDisconnect:
            pass
        except Exception as error:  # the engine's sentence: a mistake, busy, shutting down, a fault
            said = isinstance(error, (InputError, BusyError, RuntimeError)) and str(error)
            if not said:
                log.error("a live answer failed", exc_info=error)
            try:
                await self._error(said or SERVER_FAULT, id=answer_id)
            except WebSocketDisconnect:
                pass

    async def _stats_every_second(self) -> None:
        try:
            while True:
                await asyncio.sleep(STATS_EVERY_S)
                if self._frames_since_stats:
                    self._frames_since_stats = 0
                    await self._send_stats()
        except WebSocketDisconnect:
            pass

    async def _send_stats(self) -> None:
        live = self.live
        if live is None:
            return
        try:
            stats = await asyncio.to_thread(live.stats)
        except SessionLost:
            await self._reopen(live)
            return
        except SessionEnded:  # closed by the server: the next frame says so
            return
        await self._send({"type": "stats", **stats})

    async def _error(self, sentence: str, **about) -> None:
        await self._send({"type": "error", "message": sentence, **{k: v for k, v in about.items() if v is not None}})

    async def _send(self, message: dict) -> None:
        async with self._send_lock:
            if self.socket.client_state == WebSocketState.CONNECTED:
                try:
                    await self.socket.send_text(json_text(message))
                except (RuntimeError, OSError):  # the client went away meanwhile
                    raise WebSocketDisconnect(1006) from None

    async def _close(self, code: int) -> None:
        async with self._send_lock:
            if self.socket.client_state == WebSocketState.CONNECTED:
                await self.socket.close(code)


def live_routes(
    engine: Serving, max_source_pixels: int = MAX_VIDEO_SOURCE_PIXELS, idle_s: float = IDLE_S
) -> list[APIWebSocketRoute]:
    """The `/v1/live` WebSocket for `engine`, to go into the server's FastAPI routes beside openai_routes.
    max_source_pixels: EngineConfig.max_video_source_pixels; idle_s: EngineConfig.read_timeout_s."""

    async def live(socket: WebSocket) -> None:
        await LiveSocket(socket, engine, max_source_pixels, idle_s).run()

    return [APIWebSocketRoute("/v1/live", live)]
