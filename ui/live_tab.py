"""The Live tab: the browser's camera, or a shared screen, streams frames to the server while the person
watches (docs/live.md).

The transport is Gradio's streaming image input (`gr.Image(sources=["webcam"], streaming=True)` and its
`.stream` event): bench/live_transport.py measured it against WebRTC through fastrtc, whose component
does not load under the pinned Gradio (docs/live.md, "The transport"). A shared screen goes through the
same input: with "Screen" chosen, the page's script (live_head.html) answers the input's camera request
with the browser's screen picker instead.

Each browser tab has a feed of its own (ui/live_feeds.py), which pushes its frames into a live session of the
tab's own at the tab's pruning rate; the question box asks that session about what it has seen while the stream
goes on, and the tab shows the session as it happens (ui/live_view.py).

With stream URLs on (`--live-urls`), a third source reads a stream URL the person names
(`StreamWatch`: ui/live_urls.py checks it, engine/reading/live_stream.py reads it in a reader process),
into the tab's feed the same way, its status lines and last sentence shown under the count.
"""

import asyncio
import time
from pathlib import Path

import gradio as gr

from engine.config import EngineConfig, FrameSampling, GenerationParams
from engine.front.serving import Serving
from engine.reading.live_stream import LiveFrame, LiveStream
from ui.gradio_errors import raises_gradio_errors
from ui.live_feeds import WAITING, LiveFeeds
from ui.live_urls import checked_stream_url
from ui.video_inputs import VideoPolicy

# How often the browser sends a frame. 0.1 s: 10 frames a second reach the handler, five times the engine's
# default frame sampling (2 fps); the lag measured the same at 0.5, 0.1 and 0.033 s within the noise
# (docs/live.md, bench/live_transport.py).
STREAM_EVERY_S = 0.1
# The longest one stream event runs; the person presses Record again to go on. Gradio ends the event then,
# so an open tab left streaming does not hold a session for ever.
STREAM_TIME_LIMIT_S = 30 * 60
SOURCES = ("Camera", "Screen")
STREAM_URL = "Stream URL"  # the third source, shown when the operator turned stream URLs on
HEAD_PATH = Path(__file__).resolve().parent / "live_head.html"
GROUPS_LABEL = "The newest groups as the model saw them (dropped patches dimmed)"


def live_input(source: str, visible: bool = True) -> gr.Image:
    """The streaming image input for one source ("Camera" or "Screen"). Not mirrored: the server must see
    text the right way round (Gradio mirrors a webcam by default)."""
    return gr.Image(
        label=source,
        sources=["webcam"],
        streaming=True,
        type="numpy",
        image_mode="RGB",
        webcam_options=gr.WebcamOptions(mirror=False),
        height=240,
        visible=visible,
        elem_id=f"evs-live-{source.lower()}",
        elem_classes="evs-live-input",
    )


def stream_frames(image: gr.Image, handler, inputs: list, outputs: list, every_s: float = STREAM_EVERY_S):
    """Wire `image`'s stream event: a frame every `every_s` seconds, for STREAM_TIME_LIMIT_S at most, every
    tab's frames handled at once (no queue limit: each handler call is short)."""
    return image.stream(
        handler,
        inputs=inputs,
        outputs=outputs,
        stream_every=every_s,
        time_limit=STREAM_TIME_LIMIT_S,
        concurrency_limit=None,
        api_visibility="private",
        show_progress="hidden",
    )


class StreamWatch:
    """The Stream URL source: a stream read into the tab's feed while the Watch event runs (Stop, or a closed tab,
    cancels it and stops the reader; the feed's session then closes when idle, so that the person can still ask
    about what it showed)."""

    def __init__(self, feeds: LiveFeeds, policy: VideoPolicy, sampling: FrameSampling, limits: EngineConfig):
        self.feeds = feeds
        self.policy = policy
        self.sampling = sampling
        self.limits = limits

    @raises_gradio_errors
    async def watch(self, url: str, rate: float, request: gr.Request, skip: bool = False):
        """The tab's outputs (LiveFeed.updates) as the stream's frames arrive, about once a second, at each status
        line, and at its end; its frames pushed at their capture times into the feed's session at `rate`, skipping
        still patches when `skip`."""
        url = await checked_stream_url(url, self.policy)
        feed = self.feeds.feed(request.session_hash)
        stream = LiveStream.under_limits(url, self.sampling, self.limits)
        items = iter(stream)
        try:
            while (item := await asyncio.to_thread(next, items, None)) is not None:
                now_s = time.monotonic()
                if isinstance(item, LiveFrame):
                    await asyncio.to_thread(feed.arrive, item.frame, now_s, rate, item.t_s, skip)
                else:
                    feed.problem = item
                if isinstance(item, str) or feed.status_due(now_s):
                    yield feed.updates(now_s, self.feeds.answers)
            yield feed.updates(time.monotonic(), self.feeds.answers)
        finally:
            stream.close()


def live_tab(
    engine: Serving, policy: VideoPolicy, sampling: FrameSampling, limits: EngineConfig, pruning_rate: float
) -> LiveFeeds:
    """The tab's components and events, inside the page's `gr.Tab("Live")`: a camera, a shared screen and,
    when `policy.live_urls`, a stream URL read at `sampling`'s fps and size under `limits`, each feeding a live
    session of `engine` at the tab's pruning rate (starting at `pruning_rate`); a question box that asks it; the
    session as it happens. Returns the tabs' feeds, whose `close_session` the page runs on unload."""
    sources = [*SOURCES, STREAM_URL] if policy.live_urls else list(SOURCES)
    with gr.Row(equal_height=False, elem_id="evs-live-row"):
        with gr.Column(scale=1, min_width=300):
            gr.Markdown(
                "Stream your camera or a shared screen to the server, then ask about what it has seen while "
                "it goes on, or name something to watch for. Choose the source, allow access, then press "
                "**Record**." + (f" {engine.model_info['live_about']}" if engine.model_info.get("live_about") else ""),
                elem_classes="evs-live-intro",
                elem_id="evs-live-intro",
            )
            source = gr.Radio(sources, value=sources[0], label="Source", elem_id="evs-live-source")
            inputs = {name: live_input(name, visible=name == SOURCES[0]) for name in SOURCES}
            with gr.Group(visible=False) as url_group:
                url = gr.Textbox(label=STREAM_URL, placeholder="rtsp://camera.example.com/live", elem_id="evs-live-url")
                with gr.Row():
                    watch = gr.Button("Watch", variant="primary", elem_id="evs-live-watch", min_width=80)
                    stop = gr.Button("Stop", variant="stop", elem_id="evs-live-stop", min_width=80)
            status = gr.Markdown(WAITING, elem_id="evs-live-status")
            rate = gr.Slider(
                0.0,
                0.95,
                value=pruning_rate,
                step=0.05,
                label="Pruning rate q",
                info="Fraction of video tokens dropped; a new rate starts a new live session.",
                elem_id="evs-live-rate",
            )
            skip = gr.Checkbox(
                GenerationParams.skip_still_patches,
                label="Skip still patches",
                visible=engine.model_info["skips_still_patches"],
                info="What did not change since it was last encoded skips the vision tower; a new setting starts "
                "a new live session.",
                elem_id="evs-live-skip-still",
            )
        with gr.Column(scale=1, min_width=300):
            question = gr.Textbox(
                label="Question",
                placeholder="What is happening now?",
                lines=1,
                max_lines=4,
                elem_id="evs-live-question",
            )
            ask = gr.Button("Ask", variant="primary", elem_id="evs-live-ask", min_width=80)
            answer = gr.Markdown(elem_id="evs-live-answer")
            watch_for = gr.Textbox(
                label="Watch for",
                placeholder="Is there a red shape?",
                info="Asked again each time something in view changes; each new answer is listed below.",
                lines=1,
                max_lines=2,
                elem_id="evs-live-watch-for",
            )
            with gr.Row():
                add_watch = gr.Button("Watch for it", elem_id="evs-live-watch-add", min_width=80)
                clear_watches = gr.Button("Stop watching", elem_id="evs-live-watch-clear", min_width=80)
            events = gr.HTML(elem_id="evs-live-events")
            numbers = gr.Markdown(elem_id="evs-live-numbers")
            groups = gr.Gallery(
                label=GROUPS_LABEL,
                columns=4,
                rows=1,
                height=160,
                object_fit="contain",
                allow_preview=False,
                elem_id="evs-live-groups",
            )
            plot = gr.Plot(show_label=False, elem_id="evs-live-plot")
    shown = [status, numbers, groups, plot, events]
    feeds = LiveFeeds(engine, max_pixels=limits.max_video_source_pixels)
    for image in inputs.values():
        stream_frames(image, feeds.on_frame, inputs=[image, rate, skip], outputs=shown)
    source.change(
        lambda chosen: [
            *(gr.Image(visible=name == chosen) for name in SOURCES),
            gr.Group(visible=chosen == STREAM_URL),
        ],
        inputs=source,
        outputs=[*inputs.values(), url_group],
        api_visibility="private",
        queue=False,
    )
    # Named: Gradio would name it "ask" after its function, and the `/ask` endpoint, made later, "ask_1".
    gr.on(
        [ask.click, question.submit],
        feeds.ask,
        inputs=question,
        outputs=answer,
        api_name="live_ask",
        api_visibility="private",
        show_progress="hidden",
    )
    gr.on(
        [add_watch.click, watch_for.submit],
        feeds.watch,
        inputs=watch_for,
        outputs=[watch_for, events],
        api_visibility="private",
        show_progress="hidden",
    )
    clear_watches.click(feeds.unwatch, outputs=events, api_visibility="private", show_progress="hidden")
    if policy.live_urls:
        watching = watch.click(
            StreamWatch(feeds, policy, sampling, limits).watch,
            inputs=[url, rate, skip],
            outputs=shown,
            api_visibility="private",
            concurrency_limit=None,
            show_progress="hidden",
        )
        stop.click(None, cancels=[watching])
    return feeds
