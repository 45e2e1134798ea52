"""The q sweep: one question about one video (or several uploads: videos and pictures) answered at several
pruning rates at once, with one pruning method or several (every method at every rate).

The requests go to the engine as one burst (`engine.paused()`, through door.follow): each upload is
read once, its features come from one ViT forward (identical uploads are encoded once), and the
prompts prefill and decode together. What comes back is the picture the EVS papers print, for the
user's own video: the answers side by side, kept tokens, TTFT and prefill time against q, and a table of
per-request stats.
"""

import dataclasses
import time
from collections.abc import AsyncIterator, Sequence

import gradio as gr
import pandas as pd

from engine.config import GenerationParams
from engine.errors import InputError
from engine.front.door import follow, request_params
from engine.front.serving import Serving
from pruning import PRUNING_METHODS
from ui import figures
from ui.gradio_errors import raises_gradio_errors
from ui.handlers import client_of, not_an_mcp_tool, upload_paths
from ui.runs import RunView, answer_cards

DEFAULT_RATES = (0.0, 0.3, 0.5, 0.7, 0.9)
DEFAULT_RATES_TEXT = ", ".join(f"{q:g}" for q in DEFAULT_RATES)
DEFAULT_METHODS = (GenerationParams.pruning_method,)
MAX_RATES = 8
MAX_REQUESTS = 16  # one sweep holds this many engine requests at once: rates x methods
BAD_RATES = f"Sweep rates must be 1 to {MAX_RATES} numbers separated by commas, e.g. {DEFAULT_RATES_TEXT}."
BAD_METHODS = f"Sweep methods must be 1 to {len(PRUNING_METHODS)} names separated by commas, e.g. evs, vidcom2."
TOO_MANY = (
    f"A sweep answers at most {MAX_REQUESTS} questions at once (rates times methods); choose fewer rates or methods."
)
UPDATE_EVERY_S = 0.15  # five answers growing token by token would otherwise send an update per token
TABLE_HEADERS = [
    "q",
    "method",
    "answer",
    "video tokens kept",
    "video tokens total",
    "prompt tokens",
    "TTFT (s)",
    "prefill (s)",
    "ViT (s)",
    "requests in the ViT forward",
    "total (s)",
]
PLACEHOLDER_HTML = (
    f'<div class="evs-sweep-empty">Press <b>Sweep</b> to answer the question at q = '
    f"{DEFAULT_RATES_TEXT} in one go: one read of the video, one ViT forward, the answers "
    "decoding together.</div>"
)


def parse_rates(rates: str | Sequence[float] | None) -> list[float]:
    """Distinct rates in increasing order from "0, 0.3, 0.5" or a list of numbers; the engine checks
    each is in [0, 1)."""
    if rates is None or (isinstance(rates, str) and not rates.strip()):
        return list(DEFAULT_RATES)
    items = rates.replace(";", ",").split(",") if isinstance(rates, str) else rates
    try:
        values = sorted({float(item) for item in items if not isinstance(item, str) or item.strip()})
    except (TypeError, ValueError):
        raise InputError(BAD_RATES) from None
    if not 1 <= len(values) <= MAX_RATES:
        raise InputError(BAD_RATES)
    return values


def parse_methods(methods: str | Sequence[str] | None) -> list[str]:
    """Distinct method names in the order given from "evs, vidcom2" or a list of names; the engine checks each
    is a pruning method."""
    if methods is None or (isinstance(methods, str) and not methods.strip()):
        return list(DEFAULT_METHODS)
    items = methods.replace(";", ",").split(",") if isinstance(methods, str) else methods
    if not isinstance(items, (list, tuple)) or not all(isinstance(item, str) for item in items):
        raise InputError(BAD_METHODS)
    names = list(dict.fromkeys(item.strip() for item in items if item.strip()))
    if not 1 <= len(names) <= len(PRUNING_METHODS):
        raise InputError(BAD_METHODS)
    return names


def table(runs: Sequence[RunView]) -> pd.DataFrame:
    """One row per request (rate and method): the answer and the numbers a sweep is for."""
    rows = []
    for run in runs:
        stats = run.stats or {}

        def seconds(key: str, stats=stats):
            return None if stats.get(key) is None else round(stats[key], 4)

        rows.append(
            [
                run.pruning_rate,
                run.pruning_method,
                run.answer,
                stats.get("video_tokens_kept"),
                stats.get("video_tokens_total"),
                stats.get("prompt_tokens"),
                seconds("ttft_s"),
                seconds("prefill_s"),
                seconds("vit_s"),
                stats.get("vit_batch_requests"),
                seconds("total_s"),
            ]
        )
    return pd.DataFrame(rows, columns=TABLE_HEADERS)


def question_to_sweep(question: str, turns: list) -> str:
    """The Sweep button's question: the one typed, else the last one asked (Ask empties the box)."""
    if (question or "").strip() or not turns:
        return question
    return turns[-1][0]


class Sweep:
    """The sweep handler of one demo (the Sweep button and the `/sweep` endpoint)."""

    def __init__(self, engine: Serving):
        self.engine = engine

    @not_an_mcp_tool
    @raises_gradio_errors
    async def sweep(
        self,
        video: str | list | None,
        question: str,
        rates: str = DEFAULT_RATES_TEXT,
        fps: float | None = None,
        max_frames: int | None = None,
        max_pixels_per_frame: int | None = None,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        enable_thinking: bool = False,
        hear_soundtrack: bool | None = None,
        methods: str | Sequence[str] | None = None,
        media: list | None = None,
        skip_still_patches: bool | None = None,
        request: gr.Request = None,
    ) -> AsyncIterator[tuple]:
        """The `/sweep` endpoint: streams (table, figure, answers_html); see ui/__init__.py.

        video: one upload (the page gives its strip of uploads here); media: more uploads (videos and pictures)
        asked about after it, in order.
        rates: pruning rates as "0, 0.3, 0.5" (or a list of numbers). methods: pruning methods as "evs, vidcom2"
        (or a list of names; default evs alone): every method answers at every rate. A setting left out (None)
        takes the engine's default (door.defaults). enable_thinking: every request thinks first (the page's
        "Think first"); the cards show the answers, the stats count the thinking. hear_soundtrack: every
        request hears the soundtrack (None: on a model that can); no method prunes it. skip_still_patches: every
        request skips still patches before the vision tower (None: the engine's default).
        """
        params = request_params(
            self.engine,
            fps=fps,
            max_frames=max_frames,
            max_pixels_per_frame=max_pixels_per_frame,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            enable_thinking=enable_thinking,
            hear_soundtrack=hear_soundtrack,
            skip_still_patches=skip_still_patches,
        )
        rates, methods = parse_rates(rates), parse_methods(methods)
        if len(rates) * len(methods) > MAX_REQUESTS:
            raise InputError(TOO_MANY)
        params_list = [
            dataclasses.replace(params, pruning_rate=q, pruning_method=method) for q in rates for method in methods
        ]
        runs = [RunView.of(p) for p in params_list]
        titles = [run.label(with_method=len(methods) > 1) for run in runs]
        yield gr.skip(), gr.skip(), answer_cards(runs, titles)
        last_update = time.monotonic()
        uploads = upload_paths(video) + upload_paths(media)
        async for index, event in follow(
            self.engine, uploads, question, params_list, [], burst=True, client=client_of(request)
        ):
            runs[index].apply(event)
            now = time.monotonic()
            if event.kind == "done" or now - last_update >= UPDATE_EVERY_S:
                last_update = now
                yield gr.skip(), gr.skip(), answer_cards(runs, titles)
        finished = [run for run in runs if run.stats and run.stats.get("ttft_s") is not None]
        figure = figures.sweep_figure([run.stats for run in finished]) if finished else None
        yield table(runs), figure, answer_cards(runs, titles)
