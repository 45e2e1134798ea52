"""The q sweep: one question about one video (or several uploads: videos and pictures) answered at several
pruning rates at once.

The requests go to the engine as one burst (`engine.paused()`, through door.follow): each upload is
read once, its features come from one ViT forward (identical uploads are encoded once), and the
prompts prefill and decode together. What comes back is the picture the EVS papers print, for the
user's own video: the answers side by side, kept tokens, TTFT and prefill time against q, and a table of
per-rate stats.
"""

import dataclasses
import time
from collections.abc import AsyncIterator, Sequence
from html import escape

import gradio as gr
import pandas as pd

from engine.errors import InputError
from engine.front.door import follow, request_params
from engine.front.serving import Serving
from ui import figures, stats_panel
from ui.gradio_errors import raises_gradio_errors
from ui.handlers import RunView, not_an_mcp_tool, upload_paths

DEFAULT_RATES = (0.0, 0.3, 0.5, 0.7, 0.9)
DEFAULT_RATES_TEXT = ", ".join(f"{q:g}" for q in DEFAULT_RATES)
MAX_RATES = 8  # one sweep holds this many engine requests at once
BAD_RATES = f"Sweep rates must be 1 to {MAX_RATES} numbers separated by commas, e.g. {DEFAULT_RATES_TEXT}."
UPDATE_EVERY_S = 0.15  # five answers growing token by token would otherwise send an update per token
TABLE_HEADERS = ["q", "answer", "video tokens kept", "video tokens total", "prompt tokens", "TTFT (s)",
                 "prefill (s)", "ViT (s)", "requests in the ViT forward", "total (s)"]
PLACEHOLDER_HTML = (f'<div class="evs-sweep-empty">Press <b>Sweep</b> to answer the question at q = '
                    f'{DEFAULT_RATES_TEXT} in one go: one read of the video, one ViT forward, the answers '
                    "decoding together.</div>")


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


def table(runs: Sequence[RunView]) -> pd.DataFrame:
    """One row per rate: the answer and the numbers a sweep is for."""
    rows = []
    for run in runs:
        stats = run.stats or {}

        def seconds(key: str):
            return None if stats.get(key) is None else round(stats[key], 4)

        rows.append([run.pruning_rate, run.answer, stats.get("video_tokens_kept"), stats.get("video_tokens_total"),
                     stats.get("prompt_tokens"), seconds("ttft_s"), seconds("prefill_s"), seconds("vit_s"),
                     stats.get("vit_batch_requests"), seconds("total_s")])
    return pd.DataFrame(rows, columns=TABLE_HEADERS)


def answer_cards(runs: Sequence[RunView]) -> str:
    """The answers side by side (stacked on a phone), each with its q, tokens kept and TTFT."""
    cards = []
    for run in runs:
        stats = run.stats
        numbers = (f"kept {stats['video_tokens_kept']:,}/{stats['video_tokens_total']:,} · "
                   f"TTFT {stats_panel.format_seconds(stats['ttft_s'])}") if stats else escape(run.status)
        answer = escape(run.answer) if run.answer else "<i>…</i>"
        cards.append(f'<div class="evs-sweep-card"><div class="evs-sweep-q">q = {run.pruning_rate:g}</div>'
                     f'<div class="evs-sweep-numbers">{numbers}</div>'
                     f'<div class="evs-sweep-answer">{answer}</div></div>')
    return '<div class="evs-sweep">' + "".join(cards) + "</div>"


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
        media: list | None = None,
    ) -> AsyncIterator[tuple]:
        """The `/sweep` endpoint: streams (table, figure, answers_html); see ui/__init__.py.

        video: one upload (the page gives its strip of uploads here); media: more uploads (videos and pictures)
        asked about after it, in order.
        rates: pruning rates as "0, 0.3, 0.5" (or a list of numbers). A setting left out (None) takes the
        engine's default (door.defaults). enable_thinking: every rate thinks first (the page's
        "Think first"); the cards show the answers, the stats count the thinking. hear_soundtrack: every rate
        hears the soundtrack (None: on a model that can); EVS never prunes it.
        """
        params = request_params(self.engine, fps=fps, max_frames=max_frames, max_pixels_per_frame=max_pixels_per_frame,
                                max_new_tokens=max_new_tokens, temperature=temperature, enable_thinking=enable_thinking,
                                hear_soundtrack=hear_soundtrack)
        rates = parse_rates(rates)
        runs = [RunView(q) for q in rates]
        yield gr.skip(), gr.skip(), answer_cards(runs)
        last_update = time.monotonic()
        params_list = [dataclasses.replace(params, pruning_rate=q) for q in rates]
        uploads = upload_paths(video) + upload_paths(media)
        async for index, event in follow(self.engine, uploads, question, params_list, [], burst=True):
            runs[index].apply(event)
            now = time.monotonic()
            if event.kind == "done" or now - last_update >= UPDATE_EVERY_S:
                last_update = now
                yield gr.skip(), gr.skip(), answer_cards(runs)
        finished = [run for run in runs if run.stats and run.stats.get("ttft_s") is not None]
        figure = figures.sweep_figure([run.stats for run in finished]) if finished else None
        yield table(runs), figure, answer_cards(runs)
