"""The Gradio Blocks page and its wiring. The Video tab: inputs on the left (the uploads as a strip of videos
and pictures), conversation and numbers on the right, the pruning picture (one video at a time) and the q sweep
underneath; the Live tab (ui/live_tab.py); the `/ask` and `/sweep` API endpoints and the MCP tool on hidden
components."""

import math
from dataclasses import dataclass
from html import escape
from pathlib import Path

import gradio as gr

from assets.make_examples import example_questions
from engine.config import MAX_FILE_BYTES, EngineConfig, FrameSamplingLimits, GenerationParams
from engine.front.door import defaults
from engine.front.serving import Serving
from pruning import PRUNING_METHODS
from ui import stats_panel
from ui.handlers import CHAT_OUTPUTS, Handlers
from ui.live_tab import HEAD_PATH as LIVE_HEAD_PATH
from ui.live_tab import live_tab
from ui.mcp_tool import TOOL_MAX_NEW_TOKENS, VideoQuestionTool, string_list_input
from ui.runs import METHOD_LABELS
from ui.sweep import (
    DEFAULT_METHODS,
    DEFAULT_RATES_TEXT,
    TABLE_HEADERS,
    Sweep,
    question_to_sweep,
)
from ui.sweep import (
    PLACEHOLDER_HTML as SWEEP_PLACEHOLDER_HTML,
)
from ui.video_inputs import video_policy

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
EXAMPLES_DIR = ASSETS_DIR / "examples"
CSS_PATH = ASSETS_DIR / "style.css"
# The page's own rules beside the app's stylesheet: the sweep, and the phone layout.
PAGE_CSS_PATH = Path(__file__).resolve().parent / "page.css"
QUEUE_MAX_SIZE = 64  # waiting events beyond this are refused at once instead of piling up
PIXELS_STEP = 112 * 112  # the pixel slider moves in 112x112 blocks; 224x224 is 4 steps, 448x448 16

EXAMPLES = example_questions()  # (clip files, question, pruning rate)

HEADER_HTML = """
<div class="evs-header">
  <h1>EVS Video Chat</h1>
  <p>Upload a video (or several, and pictures) and ask about it. <b>Efficient Video Sampling</b> drops the
  video tokens that barely changed since the previous frame before the language model reads them; the slider
  sets how many, and two other pruning methods can take its place or stand beside it. Below the answer: token
  counts, time to first token, and which patches of each frame were kept.</p>
</div>
"""


def default_banner(model_info: dict, banner: str | None = None) -> str | None:
    """The warning line above the page, or None when there is nothing to warn about.

    `banner` (app.py's fallback: why the configured model cannot be served, and what runs instead) takes
    the place of the model's own note (random words, or what a trained tiny model knows); a full-size
    model on the CPU is noted either way.
    """
    notes = [banner] if banner else []
    if not banner and model_info.get("random_weights"):
        notes.append(
            f"{model_info.get('name', 'tiny')} model: the words are random, "
            "but the pipeline, EVS, timings and pictures are real."
        )
    elif not banner and model_info.get("about"):
        notes.append(f"{model_info.get('name')} is {model_info['about']}.")
    if model_info.get("live_about") and not (banner and model_info["live_about"] in banner):
        notes.append(model_info["live_about"])
    if str(model_info.get("device", "")).startswith("cpu") and not model_info.get("is_tiny"):
        notes.append("Running on CPU, so answers are slow.")
    if not notes:
        return None
    text = " ".join(notes)
    return text[0].upper() + text[1:]


def pixels_info(pixels: int) -> str:
    """The pixel slider's hint, worked out on its default value (224 x 224 = 50,176 on a CPU)."""
    side = math.isqrt(pixels)
    example = f"{side} × {side} = {pixels:,}" if side * side == pixels else f"the default is {pixels:,}"
    return f"Height × width after resizing; {example}."


@dataclass
class Controls:
    """The left column: the uploads, the question, the settings and the buttons."""

    media: gr.Gallery
    question: gr.Textbox
    pruning_rate: gr.Slider
    pruning_method: gr.Dropdown
    skip_still: gr.Checkbox
    compare: gr.Checkbox
    compare_methods: gr.Checkbox
    think: gr.Checkbox
    hear: gr.Checkbox
    ask: gr.Button
    sweep: gr.Button
    stop: gr.Button
    fps: gr.Slider
    max_frames: gr.Slider
    max_pixels: gr.Slider
    max_new_tokens: gr.Slider
    temperature: gr.Slider
    sweep_rates: gr.Textbox
    sweep_methods: gr.CheckboxGroup


@dataclass
class SweepView:
    """The q sweep's outputs, in Sweep.sweep's order."""

    table: gr.Dataframe
    plot: gr.Plot
    cards: gr.HTML

    def outputs(self) -> list:
        return [self.table, self.plot, self.cards]


def build_demo(
    engine: Serving,
    *,
    banner: str | None = None,
    delete_cache: tuple[int, int] | None = None,
    max_file_bytes: int = MAX_FILE_BYTES,
    fetch_video_urls: bool = False,
    live_urls: bool = False,
    limits: EngineConfig | None = None,
) -> gr.Blocks:
    """The whole page for one engine; `banner` is an extra warning (see default_banner).

    delete_cache: (every_s, older_than_s): uploads and generated images older than `older_than_s` seconds
    are deleted every `every_s` seconds (None keeps them until the server stops).
    max_file_bytes, fetch_video_urls: what the MCP tool accepts as its video (ui/video_inputs.py), as for
    openai_routes. live_urls: whether the Live tab reads stream URLs, under `limits` (the engine's limits for
    uploads; None: EngineConfig's defaults).
    """
    handlers = Handlers(engine)
    settings = defaults(engine)
    policy = video_policy(max_file_bytes, fetch_video_urls, live_urls)
    with gr.Blocks(title="EVS Video Chat", delete_cache=delete_cache) as demo:
        _header(default_banner(engine.model_info, banner))
        with gr.Tabs(elem_id="evs-tabs"):
            with gr.Tab("Video", id="video", elem_id="evs-tab-video"):
                with gr.Row(equal_height=False):
                    controls = _controls(engine, settings)
                    answer, compare_row = _answer_column()
                pictures = _what_the_model_sees()
                sweep_view = _sweep_section()
            with gr.Tab("Live", id="live", elem_id="evs-tab-live"):
                live_feeds = live_tab(
                    engine, policy, settings.frame_sampling, limits or EngineConfig(), settings.pruning_rate
                )
        turns = gr.State([])  # the earlier [question, answer, thinking] turns about the current uploads
        asked_media = gr.State([])  # the uploads those turns were about
        shown = {**answer, **pictures, "question": controls.question, "turns": turns, "asked_media": asked_media}
        q_sweep = Sweep(engine)
        # The API endpoints first: the page's Sweep runs the same function, and Gradio would give its
        # private event the name "sweep" and this endpoint "sweep_1".
        _ask_endpoint(handlers, controls, settings)
        _sweep_endpoint(q_sweep, controls, settings)
        _tool_endpoint(VideoQuestionTool(engine, policy), settings, engine.model_info["hears"])
        _wire_page(handlers, q_sweep, controls, shown, compare_row, sweep_view)
        demo.unload(live_feeds.close_session)
        demo.unload(handlers.pictures.close_tab)
    demo.live_feeds = live_feeds  # the Live tab's open feeds and their sessions, for the tests
    demo.tab_pictures = handlers.pictures  # the Video tab's pictures per open tab, for the tests
    demo.queue(default_concurrency_limit=None, max_size=QUEUE_MAX_SIZE)
    return demo


def _header(banner: str | None) -> None:
    gr.HTML(HEADER_HTML)
    if banner:
        gr.HTML(f'<div class="evs-banner" role="status">⚠ {escape(banner)}</div>', elem_id="evs-banner")


def _controls(engine: Serving, settings: GenerationParams) -> Controls:
    """The left column; its settings start at the engine's defaults."""
    with gr.Column(scale=4, min_width=320):
        # A strip of the uploads, in the order they are asked about: videos and pictures, several at once.
        media = gr.Gallery(
            label="Videos and pictures",
            file_types=["video", "image"],
            type="filepath",
            interactive=True,
            columns=4,
            rows=1,
            height=200,
            object_fit="contain",
            allow_preview=False,
            elem_id="evs-media",
        )
        question = gr.Textbox(
            label="Question", placeholder="What happens in this video?", lines=2, max_lines=6, elem_id="evs-question"
        )
        pruning_rate = gr.Slider(
            0.0,
            0.95,
            value=settings.pruning_rate,
            step=0.05,
            label="Pruning rate q",
            info="Fraction of video tokens dropped; 0 keeps them all.",
            elem_id="evs-pruning-rate",
        )
        pruning_method = gr.Dropdown(
            [(METHOD_LABELS[name], name) for name in PRUNING_METHODS],
            value=settings.pruning_method,
            label="Pruning method",
            info="Which tokens go: the same number, chosen three ways.",
            elem_id="evs-pruning-method",
        )
        # Shown only where the vision tower can encode part of a frame (Engine.model_info["skips_still_patches"]).
        skip_still = gr.Checkbox(
            settings.skip_still_patches,
            label="Skip still patches",
            visible=engine.model_info["skips_still_patches"],
            elem_id="evs-skip-still",
            info="Patches that did not change since they were last encoded skip the vision tower and the prompt; "
            "an exact repeat of a frame is never encoded again.",
        )
        compare = gr.Checkbox(label="Compare with q = 0 side by side", elem_id="evs-compare")
        compare_methods = gr.Checkbox(label="Compare the pruning methods side by side", elem_id="evs-compare-methods")
        # Off, as the smaller Qwen3.5 templates default: thinking costs many tokens before the answer.
        think = gr.Checkbox(
            settings.enable_thinking,
            label="Think first",
            visible=engine.model_info["thinks"],
            elem_id="evs-think",
            info="The model reasons before it answers; the reasoning shows in a block above the answer.",
        )
        # On, and shown, only for a model with an audio tower: the others cannot hear.
        hears = engine.model_info["hears"]
        hear = gr.Checkbox(
            hears,
            label="Hear the soundtrack",
            visible=hears,
            elem_id="evs-hear",
            info="The model hears the video's sound (speech, music, noises) beside its frames; "
            "EVS prunes the frames only.",
        )
        with gr.Row(elem_id="evs-actions"):
            ask = gr.Button("Ask", variant="primary", elem_id="evs-ask", min_width=80)
            sweep = gr.Button("Sweep", variant="secondary", elem_id="evs-sweep-button", min_width=80)
            stop = gr.Button("Stop", variant="stop", elem_id="evs-stop", min_width=80)
        advanced = _advanced(settings, engine.frame_sampling_limits)
        examples = [
            [[str(EXAMPLES_DIR / name) for name in names], text, q]
            for names, text, q in EXAMPLES
            if all((EXAMPLES_DIR / name).is_file() for name in names)
        ]
        if examples:
            gr.Examples(examples, inputs=[media, question, pruning_rate], label="Examples", elem_id="evs-examples")
    return Controls(
        media=media,
        question=question,
        pruning_rate=pruning_rate,
        pruning_method=pruning_method,
        skip_still=skip_still,
        compare=compare,
        compare_methods=compare_methods,
        think=think,
        hear=hear,
        ask=ask,
        sweep=sweep,
        stop=stop,
        **advanced,
    )


def _advanced(settings: GenerationParams, limits: FrameSamplingLimits) -> dict:
    """The folded settings: sampling up to the device's limits (a GPU samples far more than a CPU), the
    answer's length and temperature, the sweep's rates."""
    sampling = settings.frame_sampling
    with gr.Accordion("Advanced", open=False, elem_id="evs-advanced"):
        fps = gr.Slider(
            0.5,
            max(limits.max_fps, sampling.fps),
            value=sampling.fps,
            step=0.5,
            label="Frames sampled per second",
            elem_id="evs-fps",
        )
        max_frames = gr.Slider(
            2,
            max(limits.max_frames, sampling.max_frames),
            value=sampling.max_frames,
            step=2,
            precision=0,
            label="Max frames",
            elem_id="evs-max-frames",
        )
        max_pixels = gr.Slider(
            PIXELS_STEP,
            max(limits.max_pixels_per_frame, sampling.max_pixels_per_frame),
            value=sampling.max_pixels_per_frame,
            step=PIXELS_STEP,
            precision=0,
            label="Max pixels per frame",
            elem_id="evs-max-pixels",
            info=pixels_info(sampling.max_pixels_per_frame),
        )
        max_new_tokens = gr.Slider(
            1,
            1024,
            value=settings.max_new_tokens,
            step=1,
            precision=0,
            label="Max new tokens",
            elem_id="evs-max-new-tokens",
        )
        temperature = gr.Slider(
            0.0, 2.0, value=settings.temperature, step=0.05, label="Temperature", info="0 answers greedily."
        )
        sweep_rates = gr.Textbox(
            DEFAULT_RATES_TEXT,
            label="Sweep rates",
            info="The values of q that Sweep answers at, separated by commas.",
            elem_id="evs-sweep-rates",
        )
        sweep_methods = gr.CheckboxGroup(
            [(name, name) for name in PRUNING_METHODS],
            value=list(DEFAULT_METHODS),
            label="Sweep methods",
            info="Sweep answers with each at every rate.",
            elem_id="evs-sweep-methods",
        )
    return dict(
        fps=fps,
        max_frames=max_frames,
        max_pixels=max_pixels,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        sweep_rates=sweep_rates,
        sweep_methods=sweep_methods,
    )


def _answer_column() -> tuple[dict, gr.Column]:
    """The right column: status, conversation, the side-by-side comparison and the numbers; returns the
    chat outputs it holds by name, and the comparison (shown in compare mode)."""
    with gr.Column(scale=6, min_width=360):
        status = gr.Markdown(elem_id="evs-status")
        chat = gr.Chatbot(
            label="Conversation",
            height=360,
            elem_id="evs-chat",
            placeholder="Upload a video, type a question and press **Ask**.",
            feedback_options=None,
            buttons=["copy"],
        )
        with gr.Column(visible=False, elem_id="evs-compare-row") as compare_row:
            compare_cards = gr.HTML(elem_id="evs-compare-cards")
            compare_pictures = gr.Gallery(
                label="What each kept: every group's frame, pruned patches dimmed",
                columns=4,
                height="auto",
                object_fit="contain",
                elem_id="evs-compare-pictures",
            )
        compare_summary = gr.Markdown(elem_id="evs-compare-summary")
        stats_html = gr.HTML(stats_panel.stats_html(None), elem_id="evs-stats")
    return dict(
        status=status,
        chat=chat,
        compare_cards=compare_cards,
        compare_pictures=compare_pictures,
        compare_summary=compare_summary,
        stats_html=stats_html,
    ), compare_row


def _what_the_model_sees() -> dict:
    """The pruning picture of one video at a time (the choice of video, shown when a question has several): kept
    tokens per group, change between groups, the dimmed frames; the raw stats."""
    gr.Markdown("### What the model sees", elem_classes="evs-section")
    video_choice = gr.Radio([], label="Which video", visible=False, elem_id="evs-video-choice")
    with gr.Row(equal_height=True):
        # the figures carry their own titles
        bars = gr.Plot(label="Kept vs pruned tokens per temporal group", show_label=False, elem_id="evs-bars")
        heatmap = gr.Plot(label="Change since the previous group", show_label=False, elem_id="evs-heatmap")
    gallery = gr.Gallery(
        label="Sampled frames, one per temporal group; pruned patches are dimmed and tinted",
        columns=6,
        fit_columns=False,
        object_fit="contain",
        elem_id="evs-gallery",
    )
    with gr.Accordion("Raw stats (JSON)", open=False):
        stats_json = gr.JSON(elem_id="evs-stats-json")
    return dict(bars=bars, heatmap=heatmap, gallery=gallery, stats_json=stats_json, video_choice=video_choice)


def _sweep_section() -> SweepView:
    """The q sweep under the picture: the answers side by side, the plot and the per-rate table."""
    gr.Markdown("### q sweep: the same question at several pruning rates (and methods)", elem_classes="evs-section")
    cards = gr.HTML(SWEEP_PLACEHOLDER_HTML, elem_id="evs-sweep-answers")
    with gr.Row(equal_height=False):
        plot = gr.Plot(label="Kept tokens, TTFT and prefill time against q", show_label=False, elem_id="evs-sweep-plot")
        table = gr.Dataframe(
            headers=TABLE_HEADERS, label="Per-rate stats", interactive=False, elem_id="evs-sweep-table"
        )
    return SweepView(table, plot, cards)


def _wire_page(
    handlers: Handlers, q_sweep: Sweep, controls: Controls, shown: dict, compare_row: gr.Column, sweep_view: SweepView
) -> None:
    """The browser's events: Ask (button or Enter), Sweep, Stop, other uploads, the choice of video, the compare
    switch.

    One conversation at a time per tab: Ask and Enter are one event, so a question sent while an answer streams
    waits for it (trigger_mode "always_last": the question box is read when its turn comes) and is answered after
    it, in order, instead of racing it for the conversation. Other uploads stop an answer still streaming, whose
    conversation they end."""
    c = controls
    chat_outputs = [shown[name] for name in CHAT_OUTPUTS]
    asked = gr.on(
        triggers=[c.ask.click, c.question.submit],
        fn=handlers.chat,
        inputs=[
            c.media,
            c.question,
            c.pruning_rate,
            c.pruning_method,
            c.fps,
            c.max_frames,
            c.max_pixels,
            c.max_new_tokens,
            c.temperature,
            c.compare,
            c.compare_methods,
            c.think,
            c.hear,
            c.skip_still,
            shown["turns"],
            shown["asked_media"],
        ],
        outputs=chat_outputs,
        api_visibility="private",
        concurrency_limit=None,
        show_progress="hidden",
        trigger_mode="always_last",
    )
    swept = c.sweep.click(
        question_to_sweep,
        inputs=[c.question, shown["turns"]],
        outputs=c.question,
        api_visibility="private",
        queue=False,
    ).then(
        q_sweep.sweep,
        inputs=[
            c.media,
            c.question,
            c.sweep_rates,
            c.fps,
            c.max_frames,
            c.max_pixels,
            c.max_new_tokens,
            c.temperature,
            c.think,
            c.hear,
            c.sweep_methods,
            gr.State(None),  # the page's media come as the video
            c.skip_still,
        ],
        outputs=sweep_view.outputs(),
        api_visibility="private",
        concurrency_limit=None,
        show_progress="hidden",
    )
    c.stop.click(None, cancels=[asked, swept])
    c.media.change(
        handlers.new_media,
        inputs=[c.media, shown["asked_media"]],
        outputs=chat_outputs,
        api_visibility="private",
        queue=False,
        cancels=[asked],
    )
    c.media.change(
        lambda: (None, None, SWEEP_PLACEHOLDER_HTML),
        outputs=sweep_view.outputs(),
        api_visibility="private",
        queue=False,
    )
    shown["video_choice"].change(
        handlers.show_video,
        inputs=[shown["video_choice"]],
        outputs=[shown["bars"], shown["heatmap"], shown["gallery"]],
        api_visibility="private",
        queue=False,
    )
    for switch in (c.compare, c.compare_methods):
        switch.change(
            lambda baseline, methods: gr.Column(visible=baseline or methods),
            inputs=[c.compare, c.compare_methods],
            outputs=compare_row,
            api_visibility="private",
            queue=False,
        )


def _api_numbers(settings: GenerationParams, *names: str) -> list[gr.Number]:
    """Hidden inputs for an API endpoint's numbers, at the engine's defaults and without the sliders' ends,
    so that a number out of range gets the engine's sentence, as on every other way in."""
    sampling = settings.frame_sampling
    values = dict(
        pruning_rate=settings.pruning_rate,
        fps=sampling.fps,
        max_frames=sampling.max_frames,
        max_pixels_per_frame=sampling.max_pixels_per_frame,
        max_new_tokens=settings.max_new_tokens,
        temperature=settings.temperature,
    )
    return [gr.Number(values[name], label=name, visible=False) for name in names]


def _api_method(settings: GenerationParams, label: str) -> gr.Textbox:
    """A hidden text input for an API endpoint's pruning method, at the engine's default and without the page's
    choices, so that a name the engine does not take gets its sentence, as on every other way in."""
    return gr.Textbox(settings.pruning_method, label=label, visible=False)


def _api_switch(settings: GenerationParams, name: str) -> gr.Checkbox:
    """A hidden switch of an API endpoint, at the engine's default."""
    return gr.Checkbox(getattr(settings, name), label=name, visible=False)


def _ask_endpoint(handlers: Handlers, controls: Controls, settings: GenerationParams) -> None:
    """`/ask`, a public API endpoint but not an MCP tool (handlers.not_an_mcp_tool), on hidden components:
    API clients get plain values while the page stays a chat. It takes one video (and `media`, a list of more
    uploads asked about after it), the page's question and switches, and numbers and a pruning method of its
    own."""
    numbers = _api_numbers(
        settings, "pruning_rate", "fps", "max_frames", "max_pixels_per_frame", "max_new_tokens", "temperature"
    )
    history = gr.JSON([], visible=False)
    outputs = [
        gr.Textbox(label="answer", visible=False),
        gr.JSON(label="stats", visible=False),
        gr.JSON(label="figures", visible=False),
        gr.Gallery(label="frames", visible=False),
    ]
    gr.Button(visible=False).click(
        handlers.ask,
        inputs=[
            gr.Video(label="video", visible=False),
            controls.question,
            *numbers,
            controls.compare,
            history,
            controls.think,
            controls.hear,
            _api_method(settings, "pruning_method"),
            controls.compare_methods,
            _media_files(),
            _api_switch(settings, "skip_still_patches"),
        ],
        outputs=outputs,
        api_name="ask",
        concurrency_limit=None,
        show_progress="hidden",
    )


def _sweep_endpoint(q_sweep: Sweep, controls: Controls, settings: GenerationParams) -> None:
    """`/sweep`, public but not an MCP tool either, on hidden outputs like `/ask`: one video (and `media`, more
    uploads after it), the page's question, rates, Think first and Hear the soundtrack, and numbers and methods
    (as text) of its own."""
    numbers = _api_numbers(settings, "fps", "max_frames", "max_pixels_per_frame", "max_new_tokens", "temperature")
    view = SweepView(
        gr.Dataframe(headers=TABLE_HEADERS, label="table", visible=False),
        gr.Plot(label="figure", visible=False),
        gr.HTML(label="answers_html", visible=False),
    )
    gr.Button(visible=False).click(
        q_sweep.sweep,
        inputs=[
            gr.Video(label="video", visible=False),
            controls.question,
            controls.sweep_rates,
            *numbers,
            controls.think,
            controls.hear,
            gr.Textbox(", ".join(DEFAULT_METHODS), label="methods", visible=False),
            _media_files(),
            _api_switch(settings, "skip_still_patches"),
        ],
        outputs=view.outputs(),
        api_name="sweep",
        concurrency_limit=None,
        show_progress="hidden",
    )


def _media_files() -> gr.File:
    """An API endpoint's `media`: more uploads (videos and pictures) asked about after its video, in order."""
    return gr.File(file_count="multiple", label="media", visible=False)


def _tool_endpoint(tool: VideoQuestionTool, settings: GenerationParams, hears: bool) -> None:
    """The MCP tool's endpoint, `/answer_video_question`, on hidden components of its own (hears: whether the
    model has an audio tower, which is the soundtrack switch's default)."""
    inputs = [
        gr.Textbox(label="video", visible=False),
        gr.Textbox(label="question", visible=False),
        gr.Number(settings.pruning_rate, label="pruning_rate", visible=False),
        gr.Number(TOOL_MAX_NEW_TOKENS, label="max_new_tokens", precision=0, visible=False),
        gr.Checkbox(settings.enable_thinking, label="enable_thinking", visible=False),
        gr.Checkbox(hears, label="hear_soundtrack", visible=False),
        _api_method(settings, "pruning_method"),
        string_list_input("media"),
        _api_switch(settings, "skip_still_patches"),
    ]
    gr.Button(visible=False).click(
        tool.answer_video_question,
        inputs=inputs,
        outputs=gr.Textbox(label="answer", visible=False),
        api_name="answer_video_question",
        concurrency_limit=None,
        show_progress="hidden",
    )


def launch_kwargs(max_file_bytes: int) -> dict:
    """Keyword arguments for `demo.launch(...)`: upload size limit, stylesheets, the Live tab's script, the
    example clips' folder, and Gradio's MCP server (streamable HTTP at /gradio_api/mcp/)."""
    return dict(
        mcp_server=True,
        max_file_size=max_file_bytes,
        css_paths=[CSS_PATH, PAGE_CSS_PATH],
        head_paths=[LIVE_HEAD_PATH],
        theme=gr.themes.Soft(primary_hue="teal", secondary_hue="rose", neutral_hue="slate"),
        allowed_paths=[str(EXAMPLES_DIR)],
        # Gradio's own start-up check HEADs the page once with a 3 s timeout and refuses to start on a timeout,
        # asking for a share link: a busy machine (a model loading beside it) is not a proxy problem, and this
        # server never shares. The flag gates that check alone (gradio 6.31, Blocks.launch).
        _frontend=False,
    )
