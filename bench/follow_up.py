"""A follow-up question's TTFT against the cold first question on the same video and q.

Runs on an engine with its caches on (as served): the follow-up reuses the video's ViT features and the
conversation's KV, and prefills only what the conversation does not share with the last one.
"""

from pathlib import Path

from engine import Engine

from .markdown import cell, table
from .workload import FOLLOW_UP_QUESTION, QUESTION, params


def follow_up_rows(engine: Engine, clips: list[Path], rates: tuple[float, ...], new_tokens: int) -> list[dict]:
    """One row per q, each on its own clip (clips[i] for rates[i]) so its first question is cold;
    clips[len(rates)] takes the untimed warm-up the app also runs at start."""
    engine.submit(clips[len(rates)], QUESTION, params(0.5, new_tokens)).result()
    rows = []
    for clip, q in zip(clips, rates):
        cold = engine.submit(clip, QUESTION, params(q, new_tokens)).result()
        follow = engine.submit(
            clip, FOLLOW_UP_QUESTION, params(q, new_tokens), history=[(QUESTION, cold.text)]
        ).result()
        first, then = cold.stats, follow.stats
        rows.append(
            {
                "pruning_rate": q,
                "cold_ttft_s": first["ttft_s"],
                "follow_up_ttft_s": then["ttft_s"],
                "follow_up_over_cold": then["ttft_s"] / first["ttft_s"],
                "prefill_tokens": then["prefill_tokens"],
                "prompt_tokens": then["prompt_tokens"],
                "vit_cache_hit": then["vit_cache_hit"],
                "prefix_cache_hit": then["prefix_cache_hit"],
            }
        )
    return rows


def markdown(rows: list[dict]) -> str:
    body = [
        [
            row["pruning_rate"],
            cell(row["cold_ttft_s"]),
            cell(row["follow_up_ttft_s"]),
            cell(row["follow_up_over_cold"], 3),
            f"{row['prefill_tokens']} / {row['prompt_tokens']}",
            f"ViT {'hit' if row['vit_cache_hit'] else 'miss'}, KV {'hit' if row['prefix_cache_hit'] else 'miss'}",
        ]
        for row in rows
    ]
    return table(
        ["q", "cold TTFT s", "follow-up TTFT s", "follow-up/cold", "follow-up prefilled / prompt tokens", "caches"],
        body,
    )
