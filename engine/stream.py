"""What a request gives back: a stream of events, ending in an answer with stats.

The worker thread pushes events; the caller reads them from a plain thread (iteration) or from asyncio
(`async for event in stream.aevents()`), without holding a thread per waiting request.
"""

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import numpy as np


@dataclass(frozen=True)
class EvsPicture:
    """What the model sees of one video, sent once per video of a request before the first token.

    frames: (T, H, W, 3) uint8 RGB, the first sampled frame of each temporal group.
    timestamps_s: (T,) centre time of each group in seconds.
    grid_thw: (T, h, w) in LLM tokens (after the spatial merge).
    kept_mask: (T, h, w) bool, True where the token reaches the language model.
    dissimilarity: (T, h, w) float16, 1 - cos to the previous group; group 0 is +inf.
    medium: the video's place among the request's media (0 for the first; images have no picture).
    """

    frames: np.ndarray
    timestamps_s: list[float]
    grid_thw: tuple[int, int, int]
    kept_mask: np.ndarray
    dissimilarity: np.ndarray
    medium: int = 0


@dataclass(frozen=True)
class Event:
    """One thing that happened to a request.

    kind "status":   `text` says what the engine is doing ("reading video", "prefill", ...).
    kind "evs":      `evs` holds a video's pruning picture (once per video, before the first token; a request
                     with one video gets one, as before several could be sent).
    kind "thinking": `text` is the next piece of the model's thinking, which comes before the answer (only
                     when the request set GenerationParams.enable_thinking and the model thinks).
    kind "text":     `text` is the next piece of the answer.
    kind "done":     `stats` holds the final stats dict (docs/architecture.md keys) and `token_ids` the
                     generated token ids, thinking included (and `logits`, (generated, V) float32, when the
                     request asked for them); the stream ends after it.
    """

    kind: Literal["status", "evs", "thinking", "text", "done"]
    text: str = ""
    evs: EvsPicture | None = None
    stats: dict | None = None
    token_ids: tuple[int, ...] = ()
    logits: np.ndarray | None = None


@dataclass
class Answer:
    """text: the answer; thinking: what the model thought before it ("" when it did not think).
    logits: (generated, V) float32, the distribution each generated token was chosen from, when the
    request set GenerationParams.return_logits; else None."""

    text: str
    stats: dict
    token_ids: tuple[int, ...] = ()
    cancelled: bool = False
    logits: np.ndarray | None = None
    thinking: str = ""


_END = object()


@dataclass
class Stream:
    """Handle the caller keeps for one submitted request. on_end: called once, with the stream, when it
    ends (done or error), before its readers see the end; the engine's metrics count requests there.

    Once cancelled, a stream takes no more pieces (status, pictures, thinking, text): only the done event that
    ends it, or an error."""

    request_id: int
    on_end: Callable[["Stream"], None] | None = None
    _events: "queue.Queue[object]" = field(default_factory=queue.Queue)
    _cancelled: threading.Event = field(default_factory=threading.Event)
    _finished: threading.Event = field(default_factory=threading.Event)
    _listeners: list = field(default_factory=list)
    _on_cancel: list = field(default_factory=list)  # callbacks waiting for cancel(), each called once
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _text: list[str] = field(default_factory=list)
    _thinking: list[str] = field(default_factory=list)
    _stats: dict | None = None
    _token_ids: tuple[int, ...] = ()
    _logits: np.ndarray | None = None
    _error: BaseException | None = None

    # --- worker side -------------------------------------------------------------------------
    def push(self, event: Event) -> None:
        if self.finished:  # the request already ended; nothing may follow its last event
            return
        if self.cancelled and event.kind != "done":  # the reader has let go: a piece now would go unread
            return
        if event.kind == "text":
            self._text.append(event.text)
        elif event.kind == "thinking":
            self._thinking.append(event.text)
        elif event.kind == "done":
            self._stats = event.stats
            self._token_ids = event.token_ids
            self._logits = event.logits
        self._deliver(event)
        if event.kind == "done":
            self._close()

    def fail(self, error: BaseException) -> None:
        """End the stream with an error; readers see it raised. A stream that already ended stays as it is."""
        if self.finished:
            return
        self._error = error
        self._close()

    def _close(self) -> None:
        if self.on_end is not None:  # first: whoever sees the stream finished also sees it counted
            self.on_end(self)
        self._deliver(_END)
        self._finished.set()
        with self._lock:
            self._on_cancel.clear()  # an ended stream is never cancelled: its watchers need not be kept

    def _deliver(self, item: object) -> None:
        with self._lock:
            if not self._listeners:  # an async reader takes over delivery; no second copy is kept
                self._events.put(item)
            for listener in list(self._listeners):
                loop, aqueue = listener
                try:
                    loop.call_soon_threadsafe(aqueue.put_nowait, item)
                except RuntimeError:  # the reader's event loop is closed: nobody is listening there
                    self._listeners.remove(listener)

    # --- caller side -------------------------------------------------------------------------
    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    @property
    def error(self) -> BaseException | None:
        """What the request failed with, once it has ended; None while running or when it ended with done."""
        return self._error

    @property
    def stats(self) -> dict | None:
        """The done event's stats, once it has come."""
        return self._stats

    def cancel(self) -> None:
        """Ask the engine to drop this request; it leaves the batch at the next step. Whoever watches it
        (when_cancelled) is told at once, on this thread."""
        with self._lock:
            if self._cancelled.is_set():
                return
            self._cancelled.set()
            watchers, self._on_cancel = self._on_cancel, []
        for callback in watchers:
            callback(self)

    def when_cancelled(self, callback: Callable[["Stream"], None]) -> None:
        """Call callback(stream) once, when the reader cancels it (at once if it already has); never after the
        stream has ended. The callback runs on the cancelling thread and must not block: a replica's client
        wakes its event loop with it (replicas/client.py)."""
        with self._lock:
            if self.finished:
                return
            if not self._cancelled.is_set():
                self._on_cancel.append(callback)
                return
        callback(self)

    def __iter__(self) -> Iterator[Event]:
        while True:
            item = self._events.get()
            if item is _END:
                self._events.put(_END)  # later readers end too
                if self._error is not None:
                    raise self._error
                return
            yield item

    async def aevents(self) -> AsyncIterator[Event]:
        """Async twin of iteration; one reader per stream (it takes over the event queue)."""
        loop = asyncio.get_running_loop()
        aqueue: asyncio.Queue = asyncio.Queue()
        listener = (loop, aqueue)
        with self._lock:
            while not self._events.empty():
                aqueue.put_nowait(self._events.get_nowait())
            self._listeners.append(listener)
        try:
            while True:
                item = await aqueue.get()
                if item is _END:
                    if self._error is not None:
                        raise self._error
                    return
                yield item
        finally:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

    def result(self, timeout_s: float | None = None) -> Answer:
        """Block until the request ends; raises the request's error (e.g. InputError) if it failed."""
        if not self._finished.wait(timeout_s):
            raise TimeoutError(f"request {self.request_id} did not finish in {timeout_s} s")
        if self._error is not None:
            raise self._error
        return self.answer()

    def answer(self) -> Answer:
        """What the stream holds now, without waiting: all of the answer once it has ended with done."""
        return Answer(
            "".join(self._text),
            self._stats or {},
            self._token_ids,
            self.cancelled,
            self._logits,
            "".join(self._thinking),
        )
