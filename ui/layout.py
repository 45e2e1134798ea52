"""The Gradio Blocks page and its wiring: inputs on the left, conversation and numbers on the right,
the pruning picture and the q sweep underneath; the `/ask` API endpoint and the MCP tool on hidden
components, `/sweep` on the sweep's own."""

import math
from html import escape
from pathlib import Path

import gradio as gr

from assets.make_examples import example_questions

from ui import stats_panel
from ui.handlers import CHAT_OUTPUTS, DEFAULT_MAX_NEW_TOKENS, DEFAULT_TEMPERATURE, Handlers
from ui.mcp_tool import TOOL_MAX_NEW_TOKENS, VideoQuestionTool
from ui.sweep import (
    DEFAULT_RATES_TEXT,
    PLACEHOLDER_HTML as SWEEP_PLACEHOLDER_HTML,
    TABLE_HEADERS,
    Sweep,
    question_to_sweep,
)
from ui.video_inputs import DEFAULT_MAX_FILE_BYTES, video_policy

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
EXAMPLES_DIR = ASSETS_DIR / "examples"
CSS_PATH = ASSETS_DIR / "style.css"
# The page's own rules beside the app's stylesheet: the sweep, and the phone layout.
PAGE_CSS_PATH = Path(__file__).resolve().parent / "page.css"
QUEUE_MAX_SIZE = 64  # waiting events beyond this are refused at once instead of piling up
PIXELS_STEP = 112 * 112  # the pixel slider moves in 112x112 blocks; 224x224 is 4 steps, 448x448 16

EXAMPLES = example_questions()  # (clip file, question, pruning rate)

HEADER_HTML = """
<div class="evs-header">
  <h1>EVS Video Chat</h1>
  <p>Upload a video and ask about it. <b>Efficient Video Sampling</b> drops the video tokens that barely
  changed since the previous frame before the language model reads them; the slider sets how many.
  Below the answer: token counts, time to first token, and which patches of each frame were kept.</p>
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
        notes.append(f"{model_info.get('name', 'tiny')} model: the words are random, "
                     "but the pipeline, EVS, timings and pictures are real.")
    elif not banner and model_info.get("about"):
        notes.append(f"{model_info.get('name')} is {model_info['about']}.")
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


def build_demo(engine, *, banner: str | None = None, delete_cache: tuple[int, int] | None = None,
               max_file_bytes: int = DEFAULT_MAX_FILE_BYTES, fetch_video_urls: bool = False) -> gr.Blocks:
    """The whole page for one engine; `banner` is an extra warning (see default_banner).

    delete_cache: (every_s, older_than_s): uploads and generated images older than `older_than_s` seconds
    are deleted every `every_s` seconds (None keeps them until the server stops).
    max_file_bytes, fetch_video_urls: what the MCP tool accepts as its video (ui/video_inputs.py), as for
    openai_routes.
    """
    handlers = Handlers(engine)
    q_sweep = Sweep(engine)
    tool = VideoQuestionTool(engine, video_policy(max_file_bytes, fetch_video_urls))
    model_info = engine.model_info
    banner = default_banner(model_info, banner)
    # Sampling sliders start at the engine's defaults for its device (a GPU samples far more than a CPU).
    sampling, limits = engine.default_sampling, engine.sampling_limits
    with gr.Blocks(title="EVS Video Chat", delete_cache=delete_cache) as demo:
        gr.HTML(HEADER_HTML)
        if banner:
            gr.HTML(f'<div class="evs-banner" role="status">⚠ {escape(banner)}</div>', elem_id="evs-banner")

        with gr.Row(equal_height=False):
            with gr.Column(scale=4, min_width=320):
                video = gr.Video(label="Video", sources=["upload"], height=240, elem_id="evs-video")
                question = gr.Textbox(label="Question", placeholder="What happens in this video?", lines=2,
                                      max_lines=6, elem_id="evs-question")
                pruning_rate = gr.Slider(0.0, 0.95, value=model_info["default_pruning_rate"], step=0.05,
                                         label="Pruning rate q",
                                         info="Fraction of video tokens EVS drops; 0 keeps them all.",
                                         elem_id="evs-pruning-rate")
                compare = gr.Checkbox(label="Compare with q = 0 side by side", elem_id="evs-compare")
                # Off, as the smaller Qwen3.5 templates default: thinking costs many tokens before the answer.
                think = gr.Checkbox(False, label="Think first", visible=model_info["thinks"], elem_id="evs-think",
                                    info="The model reasons before it answers; the reasoning shows in a block "
                                         "above the answer.")
                with gr.Row(elem_id="evs-actions"):
                    ask = gr.Button("Ask", variant="primary", elem_id="evs-ask", min_width=80)
                    sweep = gr.Button("Sweep", variant="secondary", elem_id="evs-sweep-button", min_width=80)
                    stop = gr.Button("Stop", variant="stop", elem_id="evs-stop", min_width=80)
                with gr.Accordion("Advanced", open=False, elem_id="evs-advanced"):
                    fps = gr.Slider(0.5, max(limits.max_fps, sampling.fps), value=sampling.fps, step=0.5,
                                    label="Frames sampled per second", elem_id="evs-fps")
                    max_frames = gr.Slider(2, max(limits.max_frames, sampling.max_frames), value=sampling.max_frames,
                                           step=2, precision=0, label="Max frames", elem_id="evs-max-frames")
                    max_pixels = gr.Slider(PIXELS_STEP, max(limits.max_pixels_per_frame, sampling.max_pixels_per_frame),
                                           value=sampling.max_pixels_per_frame, step=PIXELS_STEP, precision=0,
                                           label="Max pixels per frame", elem_id="evs-max-pixels",
                                           info=pixels_info(sampling.max_pixels_per_frame))
                    max_new_tokens = gr.Slider(1, 1024, value=DEFAULT_MAX_NEW_TOKENS, step=1, precision=0,
                                               label="Max new tokens", elem_id="evs-max-new-tokens")
                    temperature = gr.Slider(0.0, 2.0, value=DEFAULT_TEMPERATURE, step=0.05,
                                            label="Temperature", info="0 answers greedily.")
                    sweep_rates = gr.Textbox(DEFAULT_RATES_TEXT, label="Sweep rates",
                                             info="The values of q that Sweep answers at, separated by commas.",
                                             elem_id="evs-sweep-rates")
                examples = [[str(EXAMPLES_DIR / name), text, q] for name, text, q in EXAMPLES
                            if (EXAMPLES_DIR / name).is_file()]
                if examples:
                    gr.Examples(examples, inputs=[video, question, pruning_rate], label="Examples",
                                elem_id="evs-examples")

            with gr.Column(scale=6, min_width=360):
                status = gr.Markdown(elem_id="evs-status")
                chat = gr.Chatbot(label="Conversation", height=360, elem_id="evs-chat",
                                  placeholder="Upload a video, type a question and press **Ask**.",
                                  feedback_options=None, buttons=["copy"])
                with gr.Row(visible=False, elem_id="evs-compare-row") as compare_row:
                    compare_full = gr.Markdown(elem_classes="evs-compare-panel", elem_id="evs-compare-full")
                    compare_pruned = gr.Markdown(elem_classes="evs-compare-panel", elem_id="evs-compare-pruned")
                compare_summary = gr.Markdown(elem_id="evs-compare-summary")
                stats_html = gr.HTML(stats_panel.stats_html(None), elem_id="evs-stats")

        gr.Markdown("### What the model sees", elem_classes="evs-section")
        with gr.Row(equal_height=True):
            # the figures carry their own titles
            bars = gr.Plot(label="Kept vs pruned tokens per temporal group", show_label=False, elem_id="evs-bars")
            heatmap = gr.Plot(label="Change since the previous group", show_label=False, elem_id="evs-heatmap")
        gallery = gr.Gallery(label="Sampled frames, one per temporal group; pruned patches are dimmed and tinted",
                             columns=6, fit_columns=False, object_fit="contain",
                             elem_id="evs-gallery")
        with gr.Accordion("Raw stats (JSON)", open=False):
            stats_json = gr.JSON(elem_id="evs-stats-json")

        gr.Markdown("### q sweep: the same question at several pruning rates", elem_classes="evs-section")
        sweep_cards = gr.HTML(SWEEP_PLACEHOLDER_HTML, elem_id="evs-sweep-answers")
        with gr.Row(equal_height=False):
            sweep_plot = gr.Plot(label="Kept tokens, TTFT and prefill time against q", show_label=False,
                                 elem_id="evs-sweep-plot")
            sweep_table = gr.Dataframe(headers=TABLE_HEADERS, label="Per-rate stats", interactive=False,
                                       elem_id="evs-sweep-table")

        turns = gr.State([])  # earlier [question, answer, thinking] turns about the current video
        # `/ask` lives on hidden components: API clients get plain values, the page stays a chat.
        history = gr.JSON([], visible=False)
        api_answer = gr.Textbox(label="answer", visible=False)
        api_stats = gr.JSON(label="stats", visible=False)
        api_figures = gr.JSON(label="figures", visible=False)
        api_frames = gr.Gallery(label="frames", visible=False)
        api_trigger = gr.Button(visible=False)
        # The MCP tool's endpoint, also on hidden components.
        tool_video = gr.Textbox(label="video", visible=False)
        tool_question = gr.Textbox(label="question", visible=False)
        tool_rate = gr.Number(model_info["default_pruning_rate"], label="pruning_rate", visible=False)
        tool_tokens = gr.Number(TOOL_MAX_NEW_TOKENS, label="max_new_tokens", precision=0, visible=False)
        tool_think = gr.Checkbox(False, label="enable_thinking", visible=False)
        tool_answer = gr.Textbox(label="answer", visible=False)
        tool_trigger = gr.Button(visible=False)

        shown = dict(chat=chat, question=question, status=status, stats_html=stats_html, stats_json=stats_json,
                     bars=bars, heatmap=heatmap, gallery=gallery, compare_full=compare_full,
                     compare_pruned=compare_pruned, compare_summary=compare_summary, turns=turns)
        chat_outputs = [shown[name] for name in CHAT_OUTPUTS]
        settings = [video, question, pruning_rate, fps, max_frames, max_pixels, max_new_tokens, temperature, compare]

        asked = [
            trigger(handlers.chat, inputs=[*settings, think, turns], outputs=chat_outputs, api_visibility="private",
                    concurrency_limit=None, show_progress="hidden")
            for trigger in (ask.click, question.submit)
        ]
        # /ask and /sweep are public API endpoints but not MCP tools (handlers.not_an_mcp_tool): agents
        # see the one tool below.
        api_trigger.click(handlers.ask, inputs=[*settings, history, think],
                          outputs=[api_answer, api_stats, api_figures, api_frames], api_name="ask",
                          concurrency_limit=None, show_progress="hidden")
        swept = sweep.click(
            question_to_sweep, inputs=[question, turns], outputs=question, api_visibility="private", queue=False,
        ).then(q_sweep.sweep, inputs=[video, question, sweep_rates, fps, max_frames, max_pixels, max_new_tokens,
                                      temperature, think],
               outputs=[sweep_table, sweep_plot, sweep_cards], api_name="sweep", concurrency_limit=None,
               show_progress="hidden")
        tool_trigger.click(tool.answer_video_question,
                           inputs=[tool_video, tool_question, tool_rate, tool_tokens, tool_think],
                           outputs=tool_answer, api_name="answer_video_question",
                           concurrency_limit=None, show_progress="hidden")
        stop.click(None, cancels=[*asked, swept])
        video.change(handlers.new_video, outputs=chat_outputs, api_visibility="private", queue=False)
        video.change(lambda: (None, None, SWEEP_PLACEHOLDER_HTML), outputs=[sweep_table, sweep_plot, sweep_cards],
                     api_visibility="private", queue=False)
        compare.change(lambda on: gr.Row(visible=on), inputs=compare, outputs=compare_row,
                       api_visibility="private", queue=False)

    demo.queue(default_concurrency_limit=None, max_size=QUEUE_MAX_SIZE)
    return demo


def launch_kwargs(max_file_bytes: int) -> dict:
    """Keyword arguments for `demo.launch(...)`: upload size limit, stylesheets, the example clips' folder,
    and Gradio's MCP server (streamable HTTP at /gradio_api/mcp/)."""
    return dict(
        mcp_server=True,
        max_file_size=max_file_bytes,
        css_paths=[CSS_PATH, PAGE_CSS_PATH],
        theme=gr.themes.Soft(primary_hue="teal", secondary_hue="rose", neutral_hue="slate"),
        allowed_paths=[str(EXAMPLES_DIR)],
    )
