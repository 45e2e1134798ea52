"""One request alone at each pruning rate q: its TTFT split by stage, next to the ideal "prefill scales
with the kept tokens" (shared by `python -m bench` and bench/gpu_check.py).

ideal TTFT(q) = read_video + ViT + EVS + prefill(q = 0) * prompt_tokens(q) / prompt_tokens(0), with
each request's own video read, ViT and EVS: prefill is the only stage EVS shortens.
"""

from collections.abc import Callable
from pathlib import Path

from engine import Engine, GenerationParams

from .markdown import cell, table

STAGES = ("read_video_s", "vit_s", "evs_s", "prefill_s")  # the parts of TTFT, seconds
ROW_KEYS = ("pruning_rate", "video_tokens_total", "video_tokens_kept", "prompt_tokens", *STAGES, "ttft_s")


def ttft_by_rate(
    engine: Engine,
    clip: Path,
    rates: tuple[float, ...],
    question: str,
    params_for: Callable[[float], GenerationParams],
    repeats: int = 1,
) -> list[dict]:
    """One row per q: the stats of the median-TTFT request of `repeats` (rates interleaved), the ideal
    TTFT and TTFT / ideal. rates[0] must be 0, the reference of the ideal. Caches must be off."""
    if rates[0] != 0:
        raise ValueError("the first rate must be 0: the ideal scales its prefill")
    measured: dict[float, list[dict]] = {q: [] for q in rates}
    for _ in range(repeats):
        for q in rates:
            measured[q].append(engine.submit(clip, question, params_for(q)).result().stats)
    rows = []
    for q in rates:
        runs = sorted(measured[q], key=lambda stats: stats["ttft_s"])
        stats = runs[(len(runs) - 1) // 2]
        rows.append({key: stats[key] for key in ROW_KEYS})
    full = rows[0]
    for row in rows:
        row["ideal_ttft_s"] = (
            row["read_video_s"]
            + row["vit_s"]
            + row["evs_s"]
            + full["prefill_s"] * row["prompt_tokens"] / full["prompt_tokens"]
        )
        row["ttft_over_ideal"] = row["ttft_s"] / row["ideal_ttft_s"]
    return rows


def markdown(rows: list[dict]) -> str:
    body = [
        [
            row["pruning_rate"],
            f"{row['video_tokens_kept']}/{row['video_tokens_total']}",
            row["prompt_tokens"],
            cell(row["read_video_s"]),
            cell(row["vit_s"]),
            cell(row["evs_s"], 4),
            cell(row["prefill_s"]),
            cell(row["ttft_s"]),
            cell(row["ideal_ttft_s"]),
            cell(row["ttft_over_ideal"], 2),
        ]
        for row in rows
    ]
    return table(
        [
            "q",
            "video tokens kept/total",
            "prompt tokens",
            "read video s",
            "ViT s",
            "EVS s",
            "prefill s",
            "TTFT s",
            "ideal s",
            "TTFT/ideal",
        ],
        body,
    )
