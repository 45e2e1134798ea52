"""The Live tab: the browser's camera, or a shared screen, streams frames to the server while the person
watches (docs/live.md).

The transport is Gradio's streaming image input (`gr.Image(sources=["webcam"], streaming=True)` and its
`.stream` event): bench/live_transport.py measured it against WebRTC through fastrtc, whose component
does not load under the pinned Gradio (docs/live.md, "The transport"). A shared screen goes through the
same input: with "Screen" chosen, the page's script (live_head.html) answers the input's camera request
with the browser's screen picker instead.

Each browser tab has a feed of its own (`LiveFeed`, kept in `LiveFeeds` by Gradio's session): frames are timed
as they arrive, and the feed is what will hand them to the engine's live session. The page's unload event
(the tab closed or reloaded; Gradio sees the tab's connection end) closes it at once. Not a `gr.State`: Gradio
keeps a closed tab's state for an hour before its `delete_callback` runs.

With stream URLs on (`--live-urls`), a third source reads a stream URL the person names
(`StreamWatch`: ui/live_urls.py checks it, engine/reading/live_stream.py reads it in a reader process),
counted on a feed the same way, its status lines and last sentence shown under the count.
"""

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr
import numpy as np

from engine.config import MAX_VIDEO_SOURCE_PIXELS, EngineConfig, FrameSampling
from engine.errors import InputError
from engine.reading.live_stream import LiveFrame, LiveStream
from ui.gradio_errors import raises_gradio_errors
from ui.live_frames import check_frame
from ui.live_urls import checked_stream_url
from ui.video_inputs import VideoPolicy

# How often the browser sends a frame. 0.1 s: 10 frames a second reach the handler, five times the engine's
# default frame sampling (2 fps); the lag measured the same at 0.5, 0.1 and 0.033 s within the noise
# (docs/live.md, bench/live_transport.py).
STREAM_EVERY_S = 0.1
# The longest one stream event runs; the person presses Record again to go on. Gradio ends the event then,
# so an open tab left streaming does not hold a session for ever.
STREAM_TIME_LIMIT_S = 30 * 60
# A status update at most this often: each one is a message back to the browser.
STATUS_EVERY_S = 1.0
RATE_WINDOW_S = 5.0  # frames per second are counted over this trailing window
SOURCES = ("Camera", "Screen")
STREAM_URL = "Stream URL"  # the third source, shown when the operator turned stream URLs on
HEAD_PATH = Path(__file__).resolve().parent / "live_head.html"
WAITING = "Press **Record** to stream frames to the server."


@dataclass(eq=False)  # a feed is itself, not its counts
class LiveFeed:
    """The frames of one browser tab as they reach the server.

    t_s, the time each frame is handed on with, is its arrival in seconds from the feed's first frame: the
    browser sends no capture time, and the measured lag from capture to arrival (docs/live.md) is steady
    enough that differences of arrival times are differences of capture times. frames: frames taken;
    refused: frames not taken (too large); problem: the last refusal's sentence, or the source's last status
    line (a stream URL's).
    """

    max_pixels: int = MAX_VIDEO_SOURCE_PIXELS
    frames: int = 0
    refused: int = 0
    problem: str | None = None
    size: tuple[int, int] | None = None  # (width, height) of the last frame taken
    closed: bool = False
    _first_s: float | None = None
    _last_status_s: float = float("-inf")
    _recent: deque = field(default_factory=deque)  # arrival times (time.monotonic()) in the last RATE_WINDOW_S

    def arrive(self, frame: np.ndarray, now_s: float) -> float | None:
        """Take one (H, W, 3) uint8 RGB frame that arrived at `now_s` (time.monotonic()); its t_s, or None
        when it is refused (the feed says why)."""
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
        self._recent.append(now_s)
        while self._recent[0] < now_s - RATE_WINDOW_S:
            self._recent.popleft()
        return now_s - self._first_s

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

    def close(self) -> None:
        """The tab is gone (closed or reloaded): nothing more arrives."""
        self.closed = True


class LiveFeeds:
    """Every open tab's feed, by Gradio's session hash."""

    def __init__(self):
        self._feeds: dict[str, LiveFeed] = {}
        self._lock = threading.Lock()

    def on_frame(self, frame: np.ndarray | None, request: gr.Request):
        """The stream event's handler: one frame from a tab's browser. Returns the status line, skipped
        between updates so the browser is not sent a message per frame."""
        with self._lock:
            feed = self._feeds.setdefault(request.session_hash, LiveFeed())
        now_s = time.monotonic()
        if frame is not None:
            feed.arrive(frame, now_s)
        return feed.status() if feed.status_due(now_s) else gr.skip()

    def close_session(self, request: gr.Request) -> None:
        """The page's unload event: the tab is gone, and its feed with it."""
        with self._lock:
            feed = self._feeds.pop(request.session_hash, None)
        if feed is not None:
            feed.close()

    def open_feeds(self) -> list[LiveFeed]:
        """The feeds of the tabs open now."""
        with self._lock:
            return list(self._feeds.values())


def live_input(source: str, visible: bool = True) -> gr.Image:
    """The streaming image input for one source ("Camera" or "Screen"). Not mirrored: the server must see
    text the right way round (Gradio mirrors a webcam by default)."""
    return gr.Image(label=source, sources=["webcam"], streaming=True, type="numpy", image_mode="RGB",
                    webcam_options=gr.WebcamOptions(mirror=False), height=240, visible=visible,
                    elem_id=f"evs-live-{source.lower()}", elem_classes="evs-live-input")


def stream_frames(image: gr.Image, handler, inputs: list, outputs: list, every_s: float = STREAM_EVERY_S):
    """Wire `image`'s stream event: a frame every `every_s` seconds, for STREAM_TIME_LIMIT_S at most, every
    tab's frames handled at once (no queue limit: each handler call is short)."""
    return image.stream(handler, inputs=inputs, outputs=outputs, stream_every=every_s,
                        time_limit=STREAM_TIME_LIMIT_S, concurrency_limit=None, api_visibility="private",
                        show_progress="hidden")


class StreamWatch:
    """The Stream URL source: a stream read as a feed while the Watch event runs (Stop, or a closed tab,
    cancels it and stops the reader)."""

    def __init__(self, policy: VideoPolicy, sampling: FrameSampling, limits: EngineConfig):
        self.policy = policy
        self.sampling = sampling
        self.limits = limits

    @raises_gradio_errors
    async def watch(self, url: str):
        """Status lines for the page as the stream's frames arrive, about once a second, and its last one."""
        url = await checked_stream_url(url, self.policy)
        feed = LiveFeed(max_pixels=self.limits.max_video_source_pixels)
        stream = LiveStream.under_limits(url, self.sampling, self.limits)
        items = iter(stream)
        try:
            while (item := await asyncio.to_thread(next, items, None)) is not None:
                now_s = time.monotonic()
                if isinstance(item, LiveFrame):
                    feed.arrive(item.frame, now_s)
                else:
                    feed.problem = item
                if isinstance(item, str) or feed.status_due(now_s):
                    yield feed.status()
            yield feed.status()
        finally:
            stream.close()


def live_tab(policy: VideoPolicy, sampling: FrameSampling, limits: EngineConfig) -> LiveFeeds:
    """The tab's components and events, inside the page's `gr.Tab("Live")`: a camera, a shared screen and,
    when `policy.live_urls`, a stream URL read at `sampling`'s fps and size under `limits`. Returns the
    tabs' feeds, whose `close_session` the page runs on unload."""
    sources = [*SOURCES, STREAM_URL] if policy.live_urls else list(SOURCES)
    gr.Markdown("Stream your camera or a shared screen to the server. Choose the source, allow access, then "
                "press **Record**.", elem_classes="evs-live-intro")
    source = gr.Radio(sources, value=sources[0], label="Source", elem_id="evs-live-source")
    inputs = {name: live_input(name, visible=name == SOURCES[0]) for name in SOURCES}
    with gr.Group(visible=False) as url_group:
        url = gr.Textbox(label=STREAM_URL, placeholder="rtsp://camera.example.com/live", elem_id="evs-live-url")
        with gr.Row():
            watch = gr.Button("Watch", variant="primary", elem_id="evs-live-watch", min_width=80)
            stop = gr.Button("Stop", variant="stop", elem_id="evs-live-stop", min_width=80)
    status = gr.Markdown(WAITING, elem_id="evs-live-status")
    feeds = LiveFeeds()
    for image in inputs.values():
        stream_frames(image, feeds.on_frame, inputs=[image], outputs=[status])
    source.change(lambda chosen: [*(gr.Image(visible=name == chosen) for name in SOURCES),
                                  gr.Group(visible=chosen == STREAM_URL)],
                  inputs=source, outputs=[*inputs.values(), url_group], api_visibility="private", queue=False)
    if policy.live_urls:
        watching = watch.click(StreamWatch(policy, sampling, limits).watch, inputs=url, outputs=status,
                               api_visibility="private", concurrency_limit=None, show_progress="hidden")
        stop.click(None, cancels=[watching])
    return feeds
