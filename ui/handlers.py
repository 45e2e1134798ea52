"""Async generator handlers that bridge Gradio events to the one engine, through its front door
(engine/front/door.py: settings, sentences, the merged stream).

Each question becomes one engine request about the uploads shown (videos and pictures, in order); in compare
mode more, submitted as one burst (as the sweep's) so
they share the read, one ViT forward and the decode steps: q = 0 beside the chosen q, and the other pruning
methods at the chosen q beside the chosen one. With "Think first" on, the model's thinking streams into a
collapsed block of its own above the answer; with "Hear the soundtrack" on, a model that hears is given the
video's sound beside its frames. Engine events are read with `Stream.aevents()`, so a
waiting request holds no thread. When Gradio stops iterating a handler (Stop button, closed tab, API
cancel) the generator is cancelled or closed, and the front door cancels the engine requests.
"""

import dataclasses
from collections.abc import AsyncIterator

import gradio as gr

from engine.config import GenerationParams
from engine.errors import NO_VIDEO, InputError
from engine.front.door import follow, history_pairs, request_params
from engine.front.serving import Serving
from pruning import PRUNING_METHODS
from ui import frame_files, media_view, overlays, stats_panel
from ui.gradio_errors import raises_gradio_errors
from ui.runs import RunView, answer_cards
from ui.tab_pictures import TabPictures

THINKING_TITLE = "Thinking"  # the title of the block that holds the model's thinking in the chat
# Output order of the chat (browser) handler; layout.py wires components by these names.
CHAT_OUTPUTS = (
    "chat",
    "question",
    "status",
    "stats_html",
    "stats_json",
    "bars",
    "heatmap",
    "gallery",
    "compare_cards",
    "compare_pictures",
    "compare_summary",
    "turns",
    "video_choice",
    "asked_media",
)
BASELINE_TITLE = "q = 0 · all tokens"


def upload_paths(uploads) -> list[str]:
    """The paths of a request's uploads, in order, from what a component gives: one path (gr.Video, gr.File),
    a list of paths (gr.File with several), or the strip's (path, caption) pairs (gr.Gallery)."""
    if not uploads:
        return []
    if isinstance(uploads, str):
        return [uploads]
    return [item[0] if isinstance(item, (list, tuple)) else item for item in uploads if item]


def client_of(request: gr.Request | None) -> str | None:
    """Who asks, for the client's share of the queue (engine/front/shares.py): the tab's or gradio_client's
    session, else the caller's address; None for a Python caller that passes no request."""
    if request is None:
        return None
    if request.session_hash:
        return f"session {request.session_hash}"
    return f"address {request.client.host}" if request.client else None


def continues(uploads: list[str], asked: list[str] | None) -> bool:
    """Whether a conversation about `asked` goes on with `uploads`: the same ones, or more added after them (a
    second video for a follow-up)."""
    asked = list(asked or [])
    return bool(asked) and uploads[: len(asked)] == asked


def not_an_mcp_tool(fn):
    """Keep a public API endpoint out of Gradio's MCP tool list.

    Gradio 6 lists every public endpoint as a tool except functions that its gr.mcp decorators marked as
    another kind (`_mcp_type`); "hidden" is no kind it knows, so the endpoint is neither a tool, a
    resource nor a prompt. The only other way, api_visibility="undocumented", also hides the endpoint's
    parameters from gradio_client, which then refuses keyword arguments.
    """
    fn._mcp_type = "hidden"
    return fn


def _params_for(compare: bool, compare_methods: bool, params: GenerationParams) -> list[GenerationParams]:
    """The requests of one question: the unpruned baseline first (compare), then the other pruning methods at
    the chosen q (compare_methods); the chosen settings are always the last request."""
    baseline = [dataclasses.replace(params, pruning_rate=0.0)] if compare else []
    others = (
        [
            dataclasses.replace(params, pruning_method=method)
            for method in PRUNING_METHODS
            if method != params.pruning_method
        ]
        if compare_methods
        else []
    )
    return [*baseline, *others, params]


def _titles(runs: list[RunView], compare: bool, compare_methods: bool) -> list[str]:
    """Each request's title in the compare view: the baseline's, else its q (and method, comparing them)."""
    return [
        BASELINE_TITLE if compare and index == 0 else run.label(with_method=compare_methods)
        for index, run in enumerate(runs)
    ]


class Handlers:
    """The event functions of one demo; they all feed the same engine."""

    def __init__(self, engine: Serving):
        self.engine = engine
        self.pictures = TabPictures()  # the Video tab's latest pruning pictures, per browser tab

    @not_an_mcp_tool
    @raises_gradio_errors
    async def ask(
        self,
        video: str | None,
        question: str,
        pruning_rate: float | None = None,
        fps: float | None = None,
        max_frames: int | None = None,
        max_pixels_per_frame: int | None = None,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        compare: bool = False,
        history: list | None = None,
        enable_thinking: bool = False,
        hear_soundtrack: bool | None = None,
        pruning_method: str | None = None,
        compare_methods: bool = False,
        media: list | None = None,
        skip_still_patches: bool | None = None,
        request: gr.Request = None,
    ) -> AsyncIterator[tuple]:
        """The `/ask` API endpoint: streams (answer, stats, figures, frames); see ui/__init__.py.

        A setting left out (None) takes the engine's default (door.defaults), as the sliders do. With
        enable_thinking, the thinking so far rides in the stats output. hear_soundtrack: None hears it on a
        model that can. compare_methods: also answer with the other pruning methods at the same q. media: more
        uploads (videos and pictures) asked about after `video`, in order. skip_still_patches: still patches
        skip the vision tower and the prompt (a model whose tower encodes whole frames only ignores it).
        """
        params = request_params(
            self.engine,
            pruning_rate=pruning_rate,
            pruning_method=pruning_method,
            fps=fps,
            max_frames=max_frames,
            max_pixels_per_frame=max_pixels_per_frame,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            enable_thinking=enable_thinking,
            hear_soundtrack=hear_soundtrack,
            skip_still_patches=skip_still_patches,
        )
        params_list = _params_for(bool(compare), bool(compare_methods), params)
        runs = [RunView.of(p) for p in params_list]
        chosen = runs[-1]
        figures_json, frames = gr.skip(), gr.skip()
        yield "", {"status": chosen.status}, figures_json, frames
        uploads = upload_paths(video) + upload_paths(media)
        async for index, event in follow(
            self.engine,
            uploads,
            question,
            params_list,
            history_pairs(history),
            burst=len(params_list) > 1,
            client=client_of(request),
        ):
            runs[index].apply(event)
            if index != len(runs) - 1:
                continue
            if event.kind == "status":
                yield chosen.answer, {"status": chosen.status}, gr.skip(), gr.skip()
            elif event.kind == "thinking":
                yield chosen.answer, {"status": chosen.status, "thinking": chosen.thinking}, gr.skip(), gr.skip()
            elif event.kind == "evs":
                figures_json = media_view.media_figures_payload(chosen.pictures)
                frames = frame_files.saved(media_view.media_frame_gallery(chosen.pictures, len(uploads)))
                yield chosen.answer, gr.skip(), figures_json, frames
            elif event.kind == "text":
                yield chosen.answer, gr.skip(), gr.skip(), gr.skip()
        stats = dict(chosen.stats or {})
        if params.enable_thinking:
            stats["thinking"] = chosen.thinking
        if compare:
            stats["compare"] = {"pruning_rate": 0.0, "answer": runs[0].answer, "stats": runs[0].stats}
        if compare_methods:
            stats["compare_methods"] = {
                run.pruning_method: {"answer": run.answer, "stats": run.stats}
                for run in sorted(runs[bool(compare) :], key=lambda run: PRUNING_METHODS.index(run.pruning_method))
            }
        # The final update repeats every output so that a client's result holds all four values.
        yield chosen.answer, stats, figures_json, frames

    @raises_gradio_errors
    async def chat(
        self,
        uploads: list | None,
        question: str,
        pruning_rate: float,
        pruning_method: str,
        fps: float,
        max_frames: int,
        max_pixels_per_frame: int,
        max_new_tokens: int,
        temperature: float,
        compare: bool,
        compare_methods: bool,
        enable_thinking: bool,
        hear_soundtrack: bool,
        skip_still_patches: bool,
        turns: list,
        asked_media: list,
        request: gr.Request = None,
    ) -> AsyncIterator[tuple]:
        """The browser's Ask (the button or Enter): streams updates of CHAT_OUTPUTS (chat view, status, numbers,
        pictures).

        uploads: the strip's videos and pictures. turns: the earlier [question, answer, thinking] of this
        conversation, and asked_media the uploads they were about: turns about other uploads (an answer that ended
        after the strip changed) are no history of this question. The pruning picture shows the first video; the
        video choice switches to another.
        """
        params = request_params(
            self.engine,
            pruning_rate=pruning_rate,
            pruning_method=pruning_method,
            fps=fps,
            max_frames=max_frames,
            max_pixels_per_frame=max_pixels_per_frame,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            enable_thinking=enable_thinking,
            hear_soundtrack=hear_soundtrack,
            skip_still_patches=skip_still_patches,
        )
        paths = upload_paths(uploads)
        if not paths:  # before the question shows up in the chat
            raise InputError(NO_VIDEO)
        turns = list(turns or []) if continues(paths, asked_media) else []
        tab = request.session_hash if request is not None else None
        params_list = _params_for(bool(compare), bool(compare_methods), params)
        runs = [RunView.of(p) for p in params_list]
        chosen = runs[-1]
        comparing = len(runs) > 1
        titles = _titles(runs, bool(compare), bool(compare_methods))

        def chat_view() -> list[dict]:
            earlier = [m for q, a, thought in turns for m in _turn(q, thought, a, thinking_done=True)]
            return earlier + _turn(question, chosen.thinking, chosen.answer, thinking_done=chosen.status != "thinking")

        def update(**changes) -> tuple:
            return tuple(changes.get(name, gr.skip()) for name in CHAT_OUTPUTS)

        def compare_cards() -> dict:
            return dict(compare_cards=answer_cards(runs, titles)) if comparing else {}

        def status() -> str:
            return _status_line(runs, titles)

        chosen_picture: dict = {}  # the chosen request's pruning picture, once it has come

        yield update(
            chat=chat_view(), question="", status=status(), **compare_cards(), compare_pictures=None, compare_summary=""
        )
        history = [(q, a) for q, a, _ in turns]
        async for index, event in follow(
            self.engine, paths, question, params_list, history, burst=comparing, client=client_of(request)
        ):
            runs[index].apply(event)
            is_chosen = index == len(runs) - 1
            if event.kind == "evs":
                pictures = dict(compare_pictures=_compare_pictures(runs, titles)) if comparing else {}
                if is_chosen:
                    shown = media_view.first_picture(chosen.pictures)
                    chosen_picture = dict(
                        **media_view.picture_outputs(shown),
                        video_choice=media_view.video_choice(chosen.pictures, len(paths), shown.medium),
                    )
                    if tab is not None:
                        self.pictures.put(tab, chosen.pictures)
                yield update(status=status(), **(chosen_picture if is_chosen else {}), **pictures)
            elif event.kind in ("thinking", "text"):
                shown_answer = dict(chat=chat_view()) if is_chosen else {}
                yield update(**shown_answer, status=status(), **compare_cards())
            elif event.kind == "status" or (event.kind == "done" and comparing):
                yield update(status=status(), **compare_cards())
        summary = stats_panel.compare_summary(runs[0].stats, chosen.stats) if compare else ""
        # The pruning picture again: the uploads' change event and Ask can reach a busy server in either order,
        # and a change handled after the question started (new_media, before asked_media is set) clears it.
        yield update(
            chat=chat_view(),
            status=status(),
            stats_html=stats_panel.stats_html(chosen.stats),
            stats_json=chosen.stats,
            compare_summary=summary,
            turns=[*turns, [question, chosen.answer, chosen.thinking]],
            asked_media=paths,
            **chosen_picture,
            **compare_cards(),
        )

    def new_media(self, uploads: list | None, asked: list | None, request: gr.Request = None) -> tuple:
        """Other uploads start a new conversation: clear everything shown about the old one (an answer still
        streaming is stopped by the same change: layout.py). Uploads added after the ones already asked about
        (a second video for a follow-up) keep the conversation going."""
        if continues(upload_paths(uploads), asked):
            return tuple(gr.skip() for _ in CHAT_OUTPUTS)
        if request is not None:
            self.pictures.drop(request.session_hash)
        cleared = dict(
            chat=[],
            status="",
            stats_html=stats_panel.stats_html(None),
            stats_json=None,
            bars=None,
            heatmap=None,
            gallery=None,
            compare_cards="",
            compare_pictures=None,
            compare_summary="",
            turns=[],
            video_choice=media_view.video_choice({}, 0, None),
            asked_media=[],
        )
        return tuple(cleared.get(name, gr.skip()) for name in CHAT_OUTPUTS)

    def show_video(self, choice: str | None, request: gr.Request = None) -> tuple:
        """The choice of video's change: the bars, heatmap and dimmed frames of the chosen video of the tab's
        latest answer."""
        return media_view.show(choice, self.pictures.get(request.session_hash) if request is not None else {})


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


def _status_line(runs: list[RunView], titles: list[str]) -> str:
    """Markdown status: what the engine is doing for each request of this question."""
    if len(runs) == 1:
        return f"**Status:** {runs[0].status}"
    return " · ".join(f"**{title}:** {run.status}" for run, title in zip(runs, titles))


def _compare_pictures(runs: list[RunView], titles: list[str]) -> list[tuple[str, str]]:
    """The compare view's pruning pictures: each request's frames of its first video in one image, captioned with
    its title and the tokens it kept, for the requests whose picture has come."""
    shown = []
    for run, title in zip(runs, titles):
        if run.pictures:
            picture = media_view.first_picture(run.pictures)
            kept, total = int(picture.kept_mask.sum()), picture.kept_mask.size
            shown.append((overlays.pruning_montage(picture), f"{title} · kept {kept:,}/{total:,}"))
    return frame_files.saved(shown)
