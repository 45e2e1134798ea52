"""The Live tab's feeds: each browser tab's frames as they reach the server, pushed into a live session of the tab's
own (`engine.open_live`, docs/live.md), and the questions the tab asks of it.

A feed opens its session at its first frame, at the tab's pruning rate; a changed rate, another frame size (a
camera switched to a screen) or a time not after the last frame's opens a new one, as a session's rate, frame size
and clock are fixed. A feed that sends no frame for `idle_s` (a camera stopped, a stream ended) closes its session,
and the tab's unload event (the tab closed or reloaded; Gradio sees its connection end) closes the feed and its
session at once. Not a `gr.State`: Gradio keeps a closed tab's state for an hour before its `delete_callback` runs.
A refusal (max_live_sessions reached, a frame refused) is one sentence in the tab's status line; so is a session the
server ended (behind the replicas, a lost replica), and the next frame RETRY_S later opens a new one. Behind the
replicas every session call is a Ray call: the tab's handlers run on Gradio's threads, and the one async handler,
Ask, calls `ask` on a thread of its own.
"""

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import gradio as gr
import numpy as np

from engine.config import MAX_VIDEO_SOURCE_PIXELS, GenerationParams
from engine.errors import SERVER_FAULT, InputError, SessionEnded
from engine.front.serving import Serving
from ui.live_frames import check_frame
from ui.live_view import LiveView, stats_line
from ui.live_watches import GUESS, TabWatches

# A status update at most this often: each one is a message back to the browser.
STATUS_EVERY_S = 1.0
RATE_WINDOW_S = 5.0  # frames per second are counted over this trailing window
# A feed without a frame this long closes its session (a stopped camera sends nothing, and Gradio tells the server
# nothing): long enough to type a question about what was just seen after stopping.
IDLE_S = 60.0
# After a session was refused (max_live_sessions open) or ended by the server (behind the replicas, its replica
# lost), a feed opens a new one this much later, not at every frame: its status line says why meanwhile.
RETRY_S = 5.0
WAITING = "Press **Record** to stream frames to the server."
NO_STREAM = "Nothing streamed yet: press **Record** (or **Watch**), then ask about what the camera shows."
IDLE = "No frame came for {seconds:g} s, so the live session was closed; press **Record** to start a new one."
# Earlier questions and answers a Live-tab question carries, the newest (as the Video tab's follow-ups do)
MAX_TURNS = 8

log = logging.getLogger(__name__)


@dataclass(eq=False)  # a feed is itself, not its counts
class LiveFeed:
    """The frames of one browser tab as they reach the server, and the live session they feed.

    t_s, the time each frame is pushed with, is its arrival in seconds from the feed's first frame: the browser
    sends no capture time, and the measured lag from capture to arrival (docs/live.md) is steady enough that
    differences of arrival times are differences of capture times (a stream URL's frames bring their own).
    frames: frames taken; refused: frames not taken (too large); problem: the last refusal's sentence, or the
    source's last status line; live: the session (None before the first frame, after a refusal or when idle);
    view: what the tab shows of it; watches: the tab's standing questions, put on each session it opens; turns: the
    (question, answer) pairs asked of the current session, a follow-up's history. open_live(rate, skip): the
    engine's open_live at that pruning rate, skipping still patches or not.
    """

    open_live: object = None
    max_pixels: int = MAX_VIDEO_SOURCE_PIXELS
    frames: int = 0
    refused: int = 0
    problem: str | None = None
    size: tuple[int, int] | None = None  # (width, height) of the last frame taken
    closed: bool = False
    live: object = None
    view: LiveView | None = None
    last_frame_s: float | None = None  # time.monotonic() of the last frame taken
    watches: TabWatches = field(default_factory=TabWatches)
    turns: list = field(default_factory=list)
    _first_s: float | None = None
    _last_status_s: float = float("-inf")
    _recent: deque = field(default_factory=deque)  # arrival times (time.monotonic()) in the last RATE_WINDOW_S
    _pushed: tuple | None = None  # (rate, skip, size, t_s) of the session's last frame
    _retry_s: float = float("-inf")
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def arrive(
        self, frame: np.ndarray, now_s: float, rate: float | None = None, t_s: float | None = None, skip: bool = False
    ):
        """Take one (H, W, 3) uint8 RGB frame that arrived at `now_s` (time.monotonic()) and, with a rate, push it
        into the feed's session at that pruning rate (skipping still patches or not), captured at t_s (None: its
        arrival). Returns the t_s it was pushed with, or None when it was refused (the feed says why)."""
        try:
            check_frame(frame, self.max_pixels)
        except InputError as error:
            self.refused += 1
            self.problem = str(error)
            return None
        if self._first_s is None:
            self._first_s = now_s
        self.frames += 1
        self.size = (frame.shape[1], frame.shape[0])
        self.last_frame_s = now_s
        self._recent.append(now_s)
        while self._recent[0] < now_s - RATE_WINDOW_S:
            self._recent.popleft()
        t_s = now_s - self._first_s if t_s is None else t_s
        if rate is not None:
            self._push(frame, t_s, float(rate), bool(skip), now_s)
        return t_s

    def _push(self, frame: np.ndarray, t_s: float, rate: float, skip: bool, now_s: float) -> None:
        with self._lock:
            if self.closed:
                return
            if self.live is not None and (self._pushed[:3] != (rate, skip, self.size) or t_s <= self._pushed[3]):
                self._close_live()  # a session's settings, frame size and clock are its own: a new one for new ones
            if self.live is None:
                if now_s < self._retry_s:
                    return
                try:
                    self.live = self.open_live(rate, skip)
                except InputError as error:  # BusyError among them: max_live_sessions open
                    self.problem, self._retry_s = str(error), now_s + RETRY_S
                    return
                self.view, self.turns = LiveView(now_s), []
                self.problem = self.watches.attach(self.live)
            self._pushed = (rate, skip, self.size, t_s)
            try:
                self.live.push(frame, t_s)
            except SessionEnded as error:  # the server's sentence (behind the replicas, its replica was lost)
                self.problem, self._retry_s = str(error), now_s + RETRY_S  # a new session then
                self._close_live()
            except InputError as error:  # this frame: the session goes on
                self.problem = str(error)
            except Exception:  # the session failed on the server (its sentence logged there): a new one later
                log.exception("a live feed's push failed")
                self.problem, self._retry_s = SERVER_FAULT, now_s + RETRY_S
                self._close_live()

    def frames_per_s(self) -> float:
        """Frames taken per second over the last RATE_WINDOW_S."""
        if len(self._recent) < 2 or self._recent[-1] <= self._recent[0]:
            return 0.0
        return (len(self._recent) - 1) / (self._recent[-1] - self._recent[0])

    def status_due(self, now_s: float) -> bool:
        """Whether a status update should go to the browser now (at most every STATUS_EVERY_S)."""
        if now_s - self._last_status_s < STATUS_EVERY_S:
            return False
        self._last_status_s = now_s
        return True

    def status(self) -> str:
        """One line for the page: frames, rate, size, and the last refusal's sentence (or the source's last
        status line)."""
        if not self.frames and not self.refused and not self.problem:
            return WAITING
        parts = [f"{self.frames} frames", f"{self.frames_per_s():.1f} per second"]
        if self.size:
            parts.append(f"{self.size[0]}×{self.size[1]}")
        line = " · ".join(parts)
        if self.refused:
            line += f" · {self.refused} refused: {self.problem}"
        elif self.problem:
            line += f" · {self.problem}"
        return line

    def updates(self, now_s: float, answers: list[str] | None = None) -> tuple:
        """The tab's outputs now: (status line, the session's numbers, the newest groups, the tokens-per-second
        plot, the watches' events), each gr.skip() where there is nothing new. answers: the words the model
        learned (an event's answer outside them is marked as a guess), None for any."""
        with self._lock:
            live, view = self.live, self.view
        if live is None:
            return self.status(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
        try:
            stats, picture = live.stats(), live.recent_picture()
            events = self.watches.html(answers)
        except SessionEnded as error:  # it ended meanwhile (behind the replicas, its replica was lost)
            with self._lock:
                if self.live is live:  # the next frame after RETRY_S opens a new one
                    self.problem, self._retry_s = str(error), now_s + RETRY_S
                    self._close_live()
            return self.status(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
        view.sample(stats, now_s)
        return (
            self.status(),
            stats_line(stats, view.ttft_s),
            view.gallery(picture),
            view.figure(),
            gr.skip() if events is None else events,
        )

    def close_if_idle(self, now_s: float, idle_s: float) -> bool:
        """Close the session when no frame came for idle_s; True when this call closed it."""
        with self._lock:
            if self.live is None or self.last_frame_s is None or now_s - self.last_frame_s < idle_s:
                return False
            self._close_live()
            self.problem = IDLE.format(seconds=idle_s)
            return True

    def close(self) -> None:
        """The tab is gone (closed or reloaded): nothing more arrives, and its session is closed."""
        with self._lock:
            self.closed = True
            self._close_live()

    def _close_live(self) -> None:
        if self.live is not None:
            self.live.close()  # closing never raises (behind the replicas, a lost one is already gone)
        self.live = None


class LiveFeeds:
    """Every open tab's feed, by Gradio's session hash, each feeding a live session of `engine`. max_pixels: the
    most pixels a frame may have as sent (max_video_source_pixels); idle_s: a feed without a frame this long closes
    its session (checked by a thread of its own, every idle_s / 4)."""

    def __init__(self, engine: Serving, max_pixels: int = MAX_VIDEO_SOURCE_PIXELS, idle_s: float = IDLE_S):
        self.engine, self.max_pixels, self.idle_s = engine, max_pixels, idle_s
        self.answers = engine.model_info.get("answers")  # the words the model learned; None: any
        self._feeds: dict[str, LiveFeed] = {}
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None

    def feed(self, key: str) -> LiveFeed:
        """The feed of the tab `key` (Gradio's session hash), made at its first frame."""
        with self._lock:
            feed = self._feeds.get(key)
            if feed is None:
                feed = self._feeds[key] = LiveFeed(open_live=self._open_live, max_pixels=self.max_pixels)
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._close_idle, name="live-idle", daemon=True)
                self._watcher.start()
            return feed

    def _open_live(self, rate: float, skip: bool):
        return self.engine.open_live(GenerationParams(pruning_rate=rate, skip_still_patches=skip))

    def on_frame(self, frame: np.ndarray | None, rate: float | None, request: gr.Request, skip: bool = False):
        """The stream event's handler: one frame from a tab's browser, pushed at the tab's pruning rate, skipping
        still patches when `skip`. Returns the tab's outputs (LiveFeed.updates), skipped between updates so the
        browser is not sent a message per frame."""
        feed = self.feed(request.session_hash)
        now_s = time.monotonic()
        if frame is not None:
            feed.arrive(frame, now_s, rate, skip=skip)
        return feed.updates(now_s, self.answers) if feed.status_due(now_s) else (gr.skip(),) * 5

    def watch(self, question: str, request: gr.Request) -> tuple[str, str]:
        """The Watch-for box's button: a standing question on the tab's sessions. Returns (the box, emptied once
        taken; the watches' list, or the refusal's sentence)."""
        feed = self.feed(request.session_hash)
        try:
            feed.watches.add(question, feed.live)
        except InputError as error:
            return question, str(error)
        return "", feed.watches.html(self.answers) or gr.skip()

    def unwatch(self, request: gr.Request) -> str:
        """The Clear button: the tab's watches end."""
        feed = self._feeds.get(request.session_hash)
        if feed is not None:
            feed.watches.clear()
        return ""

    async def ask(self, question: str, request: gr.Request):
        """The Ask button: the answer about what the tab's feed has streamed so far, as it streams (markdown),
        then its TTFT; a sentence instead when there is no session or the question is refused."""
        feed = self._feeds.get(request.session_hash)
        live = feed.live if feed is not None else None
        if live is None:
            yield feed.problem if feed is not None and feed.problem else NO_STREAM
            return
        stream, text, history = None, "", list(feed.turns[-MAX_TURNS:])
        try:
            stream = await asyncio.to_thread(live.ask, question or "", history)  # behind the replicas, a call to one
            async for event in stream.aevents():
                if event.kind == "text":
                    text += event.text
                    yield text
                elif event.kind == "done":
                    feed.view.ttft_s = event.stats["ttft_s"]
                    if feed.live is live:
                        feed.turns.append((question.strip(), text.strip()))
                    guess = self.answers is not None and text.strip() not in self.answers
                    after = f" · a follow-up to {len(history)} earlier" if history else ""
                    yield (
                        f"{text}\n\n<small>{'*' + GUESS[0].upper() + GUESS[1:] + '.* · ' if guess else ''}"
                        f"TTFT {event.stats['ttft_s']:.2f} s · "
                        f"{event.stats['video_tokens_kept']:,} video tokens seen{after}</small>"
                    )
        except InputError as error:
            yield str(error)
        except Exception:
            log.exception("a live question failed")
            yield SERVER_FAULT
        finally:
            if stream is not None and not stream.finished:
                stream.cancel()  # the tab went away or asked again: the answer stops decoding

    def close_session(self, request: gr.Request) -> None:
        """The page's unload event: the tab is gone, and its feed and session with it."""
        with self._lock:
            feed = self._feeds.pop(request.session_hash, None)
        if feed is not None:
            feed.close()

    def open_feeds(self) -> list[LiveFeed]:
        """The feeds of the tabs open now."""
        with self._lock:
            return list(self._feeds.values())

    def _close_idle(self) -> None:
        while True:
            time.sleep(self.idle_s / 4)
            now_s = time.monotonic()
            for feed in self.open_feeds():
                if feed.close_if_idle(now_s, self.idle_s):
                    log.info("closed an idle live feed's session")
