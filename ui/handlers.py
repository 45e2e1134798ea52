"""Async generator handlers that bridge Gradio events to the one engine.

Each question becomes one engine request (two in compare mode: q=0 and the chosen q, submitted together
so they share the ViT forward and decode steps). With "Think first" on, the model's thinking streams into a
collapsed block of its own above the answer. Engine events are read with `Stream.aevents()`, so a
waiting request holds no thread. When Gradio stops iterating a handler (Stop button, closed tab, API
cancel) the generator is cancelled or closed, and its `finally` cancels the engine requests.
"""

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import gradio as gr

from engine.config import GenerationParams, SamplingParams
from engine.errors import InputError
from engine.stream import Event, EvsPicture, Stream
from ui import figures, frame_files, overlays, stats_panel

log = logging.getLogger(__name__)

DEFAULT_MAX_NEW_TOKENS = 128
DEFAULT_TEMPERATURE = 0.0
NO_VIDEO = "Please upload a video first."
EXPIRED_VIDEO = ("This video is no longer on the server (uploads are deleted after a while); "
                 "please upload it again.")
BAD_HISTORY = "History must be a list of [question, answer] pairs of text."
SERVER_FAULT = "Something went wrong on the server; please try again."

THINKING_TITLE = "Thinking"  # the title of the block that holds the model's thinking in the chat
# Output order of the chat (browser) handler; layout.py wires components by these names.
CHAT_OUTPUTS = (
    "chat", "question", "status", "stats_html", "stats_json", "bars", "heatmap", "gallery",
    "compare_full", "compare_pruned", "compare_summary", "turns",
)


@dataclasses.dataclass
class RunView:
    """What is known so far about one engine request."""

    pruning_rate: float
    status: str = "queued"
    thinking: str = ""
    answer: str = ""
    picture: EvsPicture | None = None
    stats: dict | None = None

    def apply(self, event: Event) -> None:
        if event.kind == "status":
            self.status = event.text
        elif event.kind == "evs":
            self.picture = event.evs
        elif event.kind == "thinking":
            self.thinking += event.text
            self.status = "thinking"
        elif event.kind == "text":
            self.answer += event.text
            self.status = "answering"
        elif event.kind == "done":
            self.stats = event.stats
            self.status = f"done in {stats_panel.format_seconds(event.stats.get('total_s'))}"


def not_an_mcp_tool(fn):
    """Keep a public API endpoint out of Gradio's MCP tool list.

    Gradio 6 lists every public endpoint as a tool except functions that its gr.mcp decorators marked as
    another kind (`_mcp_type`); "hidden" is no kind it knows, so the endpoint is neither a tool, a
    resource nor a prompt. The only other way, api_visibility="undocumented", also hides the endpoint's
    parameters from gradio_client, which then refuses keyword arguments.
    """
    fn._mcp_type = "hidden"
    return fn


def generation_params(pruning_rate, fps, max_frames, max_pixels_per_frame, max_new_tokens,
                      temperature, enable_thinking=False) -> GenerationParams:
    """Settings from UI / API values; the engine checks ranges and answers with its own sentence."""
    try:
        sampling = SamplingParams(fps=float(fps), max_frames=int(round(float(max_frames))),
                                  max_pixels_per_frame=int(round(float(max_pixels_per_frame))))
        return GenerationParams(pruning_rate=float(pruning_rate), max_new_tokens=int(round(float(max_new_tokens))),
                                temperature=float(temperature), sampling=sampling, enable_thinking=enable_thinking)
    except (TypeError, ValueError):
        raise gr.Error("The pruning rate, fps, frame, pixel and token limits and temperature must be numbers.",
                       print_exception=False) from None


def api_params(engine, pruning_rate, fps, max_frames, max_pixels_per_frame, max_new_tokens,
               temperature, enable_thinking=False) -> GenerationParams:
    """generation_params for API callers, where a pruning rate left out (None) takes the model's
    (engine.model_info["default_pruning_rate"]) and a sampling setting left out the engine's default for its
    device, as the sliders do."""
    default = engine.default_sampling
    return generation_params(
        engine.model_info["default_pruning_rate"] if pruning_rate is None else pruning_rate,
        default.fps if fps is None else fps,
        default.max_frames if max_frames is None else max_frames,
        default.max_pixels_per_frame if max_pixels_per_frame is None else max_pixels_per_frame,
        max_new_tokens,
        temperature,
        enable_thinking,
    )


def history_pairs(history) -> list[tuple[str, str]]:
    """Earlier (question, answer) turns from an API value: a list of 2-item lists of text."""
    if history is None:
        return []
    if not isinstance(history, (list, tuple)) or not all(
        isinstance(turn, (list, tuple)) and len(turn) == 2 and all(isinstance(x, str) for x in turn)
        for turn in history
    ):
        raise gr.Error(BAD_HISTORY, print_exception=False)
    return [(q, a) for q, a in history]


def user_error(error: BaseException) -> gr.Error:
    """A toast for the browser / an error for API clients: the engine's sentence, never a traceback."""
    if isinstance(error, InputError):
        return gr.Error(str(error), print_exception=False)
    log.error("request failed", exc_info=error)
    return gr.Error(SERVER_FAULT, print_exception=False)


async def follow(engine, video: str | None, question: str, params_list: Sequence[GenerationParams],
                 history: list[tuple[str, str]], *, burst: bool = False) -> AsyncIterator[tuple[int, Event]]:
    """Submit one request per params and yield (request index, event) as events arrive, merged.

    burst: submit them inside `engine.paused()`, so the worker takes them all in one iteration: the
    video is decoded once, encoded by one ViT forward, and the prompts decode together.
    Raises gr.Error for a user's mistake. Whatever ends the iteration (finish, error, cancel, close),
    unfinished engine requests are cancelled on the way out.
    """
    if not video:
        raise gr.Error(NO_VIDEO, print_exception=False)
    if not Path(video).is_file():
        raise gr.Error(EXPIRED_VIDEO, print_exception=False)
    streams: list[Stream] = []
    pumps: list[asyncio.Task] = []
    arrivals: asyncio.Queue = asyncio.Queue()
    submitting: asyncio.Future | None = None
    try:
        if burst:
            submitting = asyncio.ensure_future(
                asyncio.to_thread(_submit_burst, engine, streams, video, question, params_list, history))
            # shield: a cancelled handler must not abandon the thread's later submissions (see finally)
            await asyncio.shield(submitting)
        else:
            for params in params_list:
                streams.append(engine.submit(video=video, question=question, params=params, history=history))
        pumps = [asyncio.create_task(_pump(i, stream, arrivals)) for i, stream in enumerate(streams)]
        open_streams = len(streams)
        while open_streams:
            index, event, error = await arrivals.get()
            if error is not None:
                raise user_error(error)
            if event is None:
                open_streams -= 1
                continue
            yield index, event
    except InputError as error:  # from submit
        raise user_error(error) from None
    finally:
        _cancel_unfinished(streams)
        if submitting is not None and not submitting.done():
            submitting.add_done_callback(lambda _: _cancel_unfinished(streams))
        for pump in pumps:
            pump.cancel()


def _submit_burst(engine, streams: list[Stream], video: str, question: str,
                  params_list: Sequence[GenerationParams], history: list[tuple[str, str]]) -> None:
    """Submit every request while admission is held, appending to `streams` as it goes (a failure
    halfway still leaves the caller what to cancel); returns once all are prepared. Blocks: run it in
    a thread."""
    with engine.paused():
        for params in params_list:
            streams.append(engine.submit(video=video, question=question, params=params, history=history))


def _cancel_unfinished(streams: list[Stream]) -> None:
    for stream in streams:
        if not stream.finished:
            stream.cancel()


async def _pump(index: int, stream: Stream, arrivals: asyncio.Queue) -> None:
    """Move one stream's events into the shared queue; (index, None, None) marks its end."""
    try:
        async for event in stream.aevents():
            arrivals.put_nowait((index, event, None))
        arrivals.put_nowait((index, None, None))
    except Exception as error:  # the request failed: InputError (user) or a bug
        arrivals.put_nowait((index, None, error))


def _params_for(compare: bool, params: GenerationParams) -> list[GenerationParams]:
    """Compare mode puts the unpruned baseline first; the chosen q is always the last request."""
    if not compare:
        return [params]
    return [dataclasses.replace(params, pruning_rate=0.0), params]


class Handlers:
    """The event functions of one demo; they all feed the same engine."""

    def __init__(self, engine):
        self.engine = engine

    @not_an_mcp_tool
    async def ask(
        self,
        video: str | None,
        question: str,
        pruning_rate: float | None = None,
        fps: float | None = None,
        max_frames: int | None = None,
        max_pixels_per_frame: int | None = None,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        temperature: float = DEFAULT_TEMPERATURE,
        compare: bool = False,
        history: list | None = None,
        enable_thinking: bool = False,
    ) -> AsyncIterator[tuple]:
        """The `/ask` API endpoint: streams (answer, stats, figures, frames); see ui/__init__.py.

        A pruning rate left out (None) takes the model's, a sampling setting the engine's default for its
        device, as the sliders do. With enable_thinking, the thinking so far rides in the stats output.
        """
        params = api_params(self.engine, pruning_rate, fps, max_frames, max_pixels_per_frame, max_new_tokens,
                            temperature, enable_thinking)
        params_list = _params_for(bool(compare), params)
        runs = [RunView(p.pruning_rate) for p in params_list]
        chosen = runs[-1]
        figures_json, frames = gr.skip(), gr.skip()
        yield "", {"status": chosen.status}, figures_json, frames
        async for index, event in follow(self.engine, video, question, params_list, history_pairs(history)):
            runs[index].apply(event)
            if index != len(runs) - 1:
                continue
            if event.kind == "status":
                yield chosen.answer, {"status": chosen.status}, gr.skip(), gr.skip()
            elif event.kind == "thinking":
                yield chosen.answer, {"status": chosen.status, "thinking": chosen.thinking}, gr.skip(), gr.skip()
            elif event.kind == "evs":
                figures_json = figures.figures_payload(event.evs)
                frames = frame_files.saved(overlays.frame_gallery(event.evs))
                yield chosen.answer, gr.skip(), figures_json, frames
            elif event.kind == "text":
                yield chosen.answer, gr.skip(), gr.skip(), gr.skip()
        stats = dict(chosen.stats or {})
        if params.enable_thinking:
            stats["thinking"] = chosen.thinking
        if compare:
            stats["compare"] = {"pruning_rate": 0.0, "answer": runs[0].answer, "stats": runs[0].stats}
        # The final update repeats every output so that a client's result holds all four values.
        yield chosen.answer, stats, figures_json, frames

    async def chat(
        self,
        video: str | None,
        question: str,
        pruning_rate: float,
        fps: float,
        max_frames: int,
        max_pixels_per_frame: int,
        max_new_tokens: int,
        temperature: float,
        compare: bool,
        enable_thinking: bool,
        turns: list,
    ) -> AsyncIterator[tuple]:
        """The browser's Ask: streams updates of CHAT_OUTPUTS (chat view, status, numbers, pictures).

        turns: the earlier [question, answer, thinking] of this video's conversation.
        """
        params = generation_params(pruning_rate, fps, max_frames, max_pixels_per_frame, max_new_tokens,
                                   temperature, enable_thinking)
        if not video:  # before the question shows up in the chat
            raise gr.Error(NO_VIDEO, print_exception=False)
        turns = list(turns or [])
        params_list = _params_for(bool(compare), params)
        runs = [RunView(p.pruning_rate) for p in params_list]
        chosen = runs[-1]

        def chat_view() -> list[dict]:
            earlier = [m for q, a, thought in turns for m in _turn(q, thought, a, thinking_done=True)]
            return earlier + _turn(question, chosen.thinking, chosen.answer, thinking_done=chosen.status != "thinking")

        def update(**changes) -> tuple:
            return tuple(changes.get(name, gr.skip()) for name in CHAT_OUTPUTS)

        def compare_panels() -> dict:
            if not compare:
                return {}
            return dict(compare_full=_compare_panel("q = 0 · all tokens", runs[0]),
                        compare_pruned=_compare_panel(f"q = {chosen.pruning_rate:.2f}", chosen))

        yield update(chat=chat_view(), question="", status=_status_line(runs), **compare_panels(),
                     compare_summary="")
        history = [(q, a) for q, a, _ in turns]
        async for index, event in follow(self.engine, video, question, params_list, history):
            runs[index].apply(event)
            is_chosen = index == len(runs) - 1
            if event.kind == "evs" and is_chosen:
                yield update(status=_status_line(runs), bars=figures.tokens_per_group_figure(event.evs),
                             heatmap=figures.dissimilarity_figure(event.evs),
                             gallery=frame_files.saved(overlays.frame_gallery(event.evs)))
            elif event.kind in ("thinking", "text"):
                shown_answer = dict(chat=chat_view()) if is_chosen else {}
                yield update(**shown_answer, status=_status_line(runs), **compare_panels())
            elif event.kind == "status" or (event.kind == "done" and compare):
                yield update(status=_status_line(runs), **compare_panels())
        summary = stats_panel.compare_summary(runs[0].stats, chosen.stats) if compare else ""
        yield update(chat=chat_view(), status=_status_line(runs), stats_html=stats_panel.stats_html(chosen.stats),
                     stats_json=chosen.stats, compare_summary=summary,
                     turns=[*turns, [question, chosen.answer, chosen.thinking]],
                     **compare_panels())

    @staticmethod
    def new_video() -> tuple:
        """A different video starts a new conversation: clear everything shown about the old one."""
        cleared = dict(chat=[], status="", stats_html=stats_panel.stats_html(None), stats_json=None,
                       bars=None, heatmap=None, gallery=None, compare_full="", compare_pruned="",
                       compare_summary="", turns=[])
        return tuple(cleared.get(name, gr.skip()) for name in CHAT_OUTPUTS)


def _turn(question: str, thinking: str, answer: str, thinking_done: bool) -> list[dict]:
    """One question's chat messages: the question, the thinking (a collapsed block, when there is any) and the
    answer (once it has begun)."""
    messages = [{"role": "user", "content": question}]
    if thinking:
        title = THINKING_TITLE if thinking_done else f"{THINKING_TITLE}…"
        # status "done" keeps the block closed until the reader opens it, also while it grows
        messages.append({"role": "assistant", "content": thinking, "metadata": {"title": title, "status": "done"}})
    if answer:
        messages.append({"role": "assistant", "content": answer})
    return messages


def _status_line(runs: list[RunView]) -> str:
    """Markdown status: what the engine is doing for each request of this question."""
    if len(runs) == 1:
        return f"**Status:** {runs[0].status}"
    return " · ".join(f"**q={run.pruning_rate:.2f}:** {run.status}" for run in runs)


def _compare_panel(title: str, run: RunView) -> str:
    answer = run.answer or f"*{run.status}…*"
    return f"#### {title}\n\n{answer}\n\n{stats_panel.compare_line(run.stats)}"
