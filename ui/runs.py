"""The engine requests of one question, as they stream: what each has said so far (`RunView`), and the answers
side by side as cards, each with its title, kept tokens and TTFT (the compare view and the sweep)."""

import dataclasses
from collections.abc import Sequence
from html import escape

from engine.config import GenerationParams
from engine.stream import Event, EvsPicture
from ui import stats_panel

# How the page names each pruning method (pruning.PRUNING_METHODS), in its own words.
METHOD_LABELS = {
    "evs": "EVS: drop what did not change",
    "vidcom2": "VidCom2: keep what is unique",
    "uniform": "Uniform: fewer frames",
}


@dataclasses.dataclass
class RunView:
    """What is known so far about one engine request."""

    pruning_rate: float
    pruning_method: str = GenerationParams.pruning_method
    status: str = "queued"
    thinking: str = ""
    answer: str = ""
    pictures: dict[int, EvsPicture] = dataclasses.field(default_factory=dict)  # by the video's place in media
    stats: dict | None = None

    @classmethod
    def of(cls, params: GenerationParams) -> "RunView":
        return cls(params.pruning_rate, params.pruning_method)

    def label(self, with_method: bool) -> str:
        """ "q = 0.7", or "vidcom2 · q = 0.7" where requests of several methods stand side by side."""
        rate = f"q = {self.pruning_rate:g}"
        return f"{self.pruning_method} · {rate}" if with_method else rate

    def apply(self, event: Event) -> None:
        if event.kind == "status":
            self.status = event.text
        elif event.kind == "evs":
            self.pictures[event.evs.medium] = event.evs
        elif event.kind == "thinking":
            self.thinking += event.text
            self.status = "thinking"
        elif event.kind == "text":
            self.answer += event.text
            self.status = "answering"
        elif event.kind == "done":
            self.stats = event.stats
            self.status = f"done in {stats_panel.format_seconds(event.stats.get('total_s'))}"


def answer_cards(runs: Sequence[RunView], titles: Sequence[str]) -> str:
    """The answers side by side (stacked on a phone), each under its title with its tokens kept and TTFT."""
    cards = []
    for run, title in zip(runs, titles):
        stats = run.stats
        numbers = (
            (
                f"kept {stats['video_tokens_kept']:,}/{stats['video_tokens_total']:,} · "
                f"TTFT {stats_panel.format_seconds(stats['ttft_s'])}"
            )
            if stats
            else escape(run.status)
        )
        answer = escape(run.answer) if run.answer else "<i>…</i>"
        cards.append(
            f'<div class="evs-answer-card"><div class="evs-answer-title">{escape(title)}</div>'
            f'<div class="evs-answer-numbers">{numbers}</div>'
            f'<div class="evs-answer-text">{answer}</div></div>'
        )
    return '<div class="evs-answers">' + "".join(cards) + "</div>"
