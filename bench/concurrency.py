"""Throughput against concurrency: c users at once at each q, from the same bursts as the users scenario.

TTFT p50/p99 from the burst's start, TPOT (seconds per token after the first, mean over users), requests
and output tokens per second of wall time, and req/s at q > 0 over req/s at q = 0 (EVS must never lower
throughput: the ratio should be >= 1).
"""

from .bursts import BurstRun
from .markdown import cell, table
from .summary import burst_summary
from .targets import met_cell


def concurrency_rows(
    grid: dict[tuple[int, float], BurstRun], concurrency: tuple[int, ...], rates: tuple[float, ...]
) -> list[dict]:
    rows = []
    for c in concurrency:
        baseline = burst_summary(grid[(c, rates[0])])
        for q in rates:
            figures = burst_summary(grid[(c, q)])
            rows.append(
                {
                    "concurrency": c,
                    "pruning_rate": q,
                    **{
                        key: figures[key]
                        for key in (
                            "p50_ttft_s",
                            "p99_ttft_s",
                            "tpot_s",
                            "requests_per_s",
                            "output_tokens_per_s",
                            "wall_s",
                        )
                    },
                    "requests_per_s_over_q0": figures["requests_per_s"] / baseline["requests_per_s"],
                }
            )
    return rows


def markdown(rows: list[dict], targets: list[dict] = ()) -> str:
    """The table, with the throughput target's verdict on each pruned row (targets: the run's target rows)."""
    body = [
        [
            row["concurrency"],
            row["pruning_rate"],
            cell(row["p50_ttft_s"]),
            cell(row["p99_ttft_s"]),
            cell(None if row["tpot_s"] is None else row["tpot_s"] * 1000, 1),
            cell(row["requests_per_s"], 2),
            cell(row["output_tokens_per_s"], 1),
            cell(row["requests_per_s_over_q0"], 2),
            met_cell(targets, "concurrency", row),
        ]
        for row in rows
    ]
    return table(
        ["concurrency", "q", "TTFT p50 s", "TTFT p99 s", "TPOT ms", "req/s", "output tok/s", "req/s / q=0", "met"], body
    )
