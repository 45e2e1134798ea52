"""Reading a video as a share of TTFT: one request alone on a short clip and on a long file, its TTFT
split into waiting for a reader, reading (the file to sampled frames, in the reader processes), and the
rest (hashing, the HF processor, ViT, EVS, prefill, the first decode step). Shared by `python -m bench`
(the bench's 4-s 224x224 clip and bench/decoding.py's long-GOP file) and bench/gpu_check.py.

Caches must be off, so every request reads its file: the stats `read_wait_s` and `read_s` are 0 when the
frames come from the engine's cache.
"""

import statistics
from pathlib import Path

from engine import Engine, GenerationParams

from .markdown import cell, table
from .targets import met_cell


def reading_rows(
    engine: Engine, videos: dict[str, Path], question: str, params: GenerationParams, repeats: int = 1
) -> list[dict]:
    """One row per video (name -> file), from `repeats` requests one at a time: the median-TTFT request's
    seconds waiting for a reader, reading, and the rest of its TTFT (which add up to its TTFT), and apart from it
    read_median_s, the median over the runs of waiting and reading together (what the reading target holds)."""
    rows = []
    for name, path in videos.items():
        runs = sorted(
            (engine.submit(path, question, params).result().stats for _ in range(repeats)),
            key=lambda stats: stats["ttft_s"],
        )
        stats = runs[(len(runs) - 1) // 2]
        read = stats["read_wait_s"] + stats["read_s"]
        rows.append(
            {
                "video": name,
                "frames_sampled": stats["frames_sampled"],
                "read_wait_s": stats["read_wait_s"],
                "read_s": stats["read_s"],
                "rest_s": stats["ttft_s"] - read,
                "ttft_s": stats["ttft_s"],
                "read_share": read / stats["ttft_s"],
                "read_median_s": statistics.median(run["read_wait_s"] + run["read_s"] for run in runs),
                "runs": repeats,
            }
        )
    return rows


def markdown(rows: list[dict], targets: list[dict] = ()) -> str:
    """The table, with the reading target's verdict on its row (targets: the run's target rows)."""
    body = [
        [
            row["video"],
            row["frames_sampled"],
            cell(row["read_wait_s"], 4),
            cell(row["read_s"]),
            cell(row["rest_s"]),
            cell(row["ttft_s"]),
            f"{100 * row['read_share']:.0f} %",
            f"{cell(row['read_median_s'])} ({row['runs']})",
            met_cell(targets, "reading", row),
        ]
        for row in rows
    ]
    return table(
        [
            "video",
            "frames",
            "waiting for a reader s",
            "reading s",
            "rest of TTFT s",
            "TTFT s",
            "reading's share",
            "waiting + reading s, median (runs)",
            "met",
        ],
        body,
    )
