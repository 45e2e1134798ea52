"""Live sessions (docs/live.md), shared by `python -m bench` and bench/gpu_check.py:

- TTFT of a question 10, 60 and 600 s into a stream pushed at its capture pace, against the same question on an
  upload of the same recording cut there, at the same q (bench/live_ttft.py): the stream's answer forks a state
  that is already there and bounded by its window, once the group in flight is in; the upload reads, encodes and
  prefills the recording first.
- Sessions kept in real time: n sessions each pushing 2 fps frames at their capture pace, each from its own
  thread. A session is kept when it dropped no frame, its lag (its group's last frame handed to `push` -> the
  group in its state, the HF processor's time on the pushing thread included) stays under 1 s at the 95th
  percentile, and its pusher kept pace: no frame pushed more than one frame interval after its capture time. The
  most n kept, at q = 0 and q = 0.7, without and with skip_still_patches: EVS prunes after the vision tower, so
  alone it shortens only each group's prefill; skipping still patches takes the units that did not change out of
  the vision tower too.
"""

import threading
import time
from pathlib import Path

import numpy as np

from engine import Engine

from .live_ttft import ttft_into_stream
from .live_work import LIVE_FPS, PACE_S, LiveWork, frames_of, recording
from .markdown import cell, table
from .targets import met_cell

REAL_TIME_LAG_S = 1.0  # p95 lag under this, no frame dropped and the pushers on time: a session kept in real time
RATES = (0.0, 0.7)


def _session_frames(folder: Path, work: LiveWork) -> list[list[tuple[np.ndarray, float]]]:
    """Each session's frames for a trial: session i plays one recording from its i-th frame, so that no two
    show the same frame at once, with capture times from 0 (the frames are shared, not copied)."""
    frames = list(frames_of(recording(folder, work.session_s + work.max_sessions, work.size, name="sessions")))
    count = int(work.session_s * LIVE_FPS)
    return [
        [(frame, index / LIVE_FPS) for index, (frame, _) in enumerate(frames[first : first + count])]
        for first in range(work.max_sessions)
    ]


def _kept_in_real_time(
    engine: Engine, frames: list[list[tuple[np.ndarray, float]]], q: float, work: LiveWork, skip: bool = False
) -> tuple[bool, list[dict]]:
    """Play len(frames) sessions at once, each at its frames' capture pace; whether every one kept up, and
    their stats, each with "worst_lateness_s": the most its pusher came after a frame's capture time."""
    sessions = [engine.open_live(work.params(q, skip)) for _ in frames]
    lateness = [0.0] * len(frames)

    def play(number: int, live, own) -> None:
        start = time.perf_counter()
        for frame, time_s in own:
            late = time.perf_counter() - (start + time_s)
            if late < 0:
                time.sleep(-late)
            lateness[number] = max(lateness[number], late)
            live.push(frame, time_s)

    threads = [
        threading.Thread(target=play, args=(i, live, own)) for i, (live, own) in enumerate(zip(sessions, frames))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for live in sessions:
        live.wait(REAL_TIME_LAG_S)
    stats = [{**live.stats(), "worst_lateness_s": late} for live, late in zip(sessions, lateness)]
    for live in sessions:
        live.close()
    kept = all(
        s["frames_dropped"] == 0
        and s["lag_s"]["p95"] is not None
        and s["lag_s"]["p95"] < REAL_TIME_LAG_S
        and s["worst_lateness_s"] <= PACE_S
        for s in stats
    )
    return kept, stats


def sessions_in_real_time(engine: Engine, folder: Path, work: LiveWork, skip: bool = False) -> list[dict]:
    """For each q of RATES, the most sessions kept in real time, up to max_sessions: doubling from one until a
    trial fails, then halving the gap; with the worst p95 lag and pusher lateness of the largest trial kept (skip:
    every session skips still patches)."""
    frames = _session_frames(folder, work)
    rows = []
    for q in RATES:
        kept_worst, low, high, n = {}, 0, work.max_sessions + 1, 1  # low sessions kept; high did not
        while low + 1 < high:
            kept, stats = _kept_in_real_time(engine, frames[:n], q, work, skip)
            if kept:
                low = n
                kept_worst[n] = (
                    max(row["lag_s"]["p95"] for row in stats),
                    max(row["worst_lateness_s"] for row in stats),
                )
            else:
                high = n
            n = min(2 * low, high - 1) if high > work.max_sessions else (low + high) // 2
        lag, late = kept_worst.get(low, (None, None))
        rows.append(
            {
                "pruning_rate": q,
                "skip_still_patches": skip,
                "sessions": low,
                "p95_lag_s": lag,
                "worst_lateness_s": late,
                "tried_up_to": work.max_sessions,
            }
        )
    return rows


def live_rows(ttft: dict, sessions: list[dict]) -> dict:
    """The ratios across rows: TTFT at the last moment over the first (with the range their quartiles allow), and
    sessions kept at q = 0.7 over q = 0, without skipping still patches and with."""
    first, last = ttft["moments"][0], ttft["moments"][-1]
    at = {(row["pruning_rate"], row.get("skip_still_patches", False)): row["sessions"] for row in sessions}
    (first_low, first_high), (last_low, last_high) = first["ttft_quartiles_s"], last["ttft_quartiles_s"]
    ratios = {
        "ttft_last_over_first": last["ttft_s"] / first["ttft_s"],
        "ttft_last_over_first_spread": [last_low / first_high, last_high / first_low],
        "sessions_pruned_over_q0": at[0.7, False] / at[0.0, False] if at[0.0, False] else None,
    }
    if (0.0, True) in at:
        ratios["sessions_pruned_over_q0_skipping"] = at[0.7, True] / at[0.0, True] if at[0.0, True] else None
    return ratios


def _median_and_quartiles(median: float, quartiles: list[float]) -> str:
    return f"{cell(median)} ({cell(quartiles[0])}–{cell(quartiles[1])})"


def markdown(live: dict, targets: list[dict] = ()) -> str:
    """The moments table and the sessions table, each with its targets' verdicts (targets: the run's target rows)."""
    ttft, sessions, ratios = live["ttft"], live["sessions"], live["ratios"]
    moments = [
        [
            f"{m['seconds']:g} s",
            _median_and_quartiles(m["ttft_s"], m["ttft_quartiles_s"]),
            m["questions"],
            f"{m['video_tokens_kept']} / {m['video_tokens_total']}",
            _median_and_quartiles(m["upload_ttft_s"], m["upload_ttft_quartiles_s"]),
            m["uploads"],
            f"{m['upload_video_tokens_kept']} / {m['upload_video_tokens_total']}",
            f"{cell(m['live_over_upload'])} ({cell(m['live_over_upload_spread'][0])}–"
            f"{cell(m['live_over_upload_spread'][1])})",
            met_cell(targets, "live", m),
        ]
        for m in ttft["moments"]
    ]
    first, last = ttft["moments"][0]["seconds"], ttft["moments"][-1]["seconds"]
    low, high = ratios["ttft_last_over_first_spread"]
    return (
        table(
            [
                f"into the stream, q = {ttft['pruning_rate']:g}",
                "live TTFT s, median (quartiles)",
                "questions",
                "live video tokens kept / total",
                "upload TTFT s, median (quartiles)",
                "uploads",
                "upload video tokens kept / total",
                "live / upload (range)",
                "met",
            ],
            moments,
        )
        + f"\n\nTTFT {last:g} s in / {first:g} s in: {cell(ratios['ttft_last_over_first'], 2)} (range "
        f"{cell(low, 2)}–{cell(high, 2)}). Pushed at capture pace while asked: the latest push came "
        f"{cell(ttft['worst_lateness_s'])} s after its capture time; {ttft['frames_dropped']} frames dropped"
        + ("." if ttft["paced"] else ": the stream fell behind its pace, so its TTFTs meet no target.")
        + "\n\n"
        + table(
            [
                "q",
                "skip still patches",
                f"sessions kept in real time ({LIVE_FPS:g} fps, p95 lag < {REAL_TIME_LAG_S:g} s, pushers on time)",
                "worst p95 lag s",
                "latest push s",
                "tried up to",
                "met",
            ],
            [
                [
                    row["pruning_rate"],
                    "yes" if row.get("skip_still_patches") else "no",
                    row["sessions"],
                    cell(row["p95_lag_s"]),
                    cell(row["worst_lateness_s"]),
                    row["tried_up_to"],
                    met_cell(targets, "live_sessions", row),
                ]
                for row in sessions
            ],
        )
        + f"\n\nsessions at q = 0.7 / q = 0: {cell(ratios['sessions_pruned_over_q0'], 2)}"
        + (
            f", skipping still patches: {cell(ratios['sessions_pruned_over_q0_skipping'], 2)}"
            if "sessions_pruned_over_q0_skipping" in ratios
            else ""
        )
    )


def live_scenario(engine: Engine, folder: Path, work: LiveWork, question: str) -> dict:
    """Both figures on one engine (its max_live_sessions at least work.max_sessions)."""
    ttft = ttft_into_stream(engine, folder, work, question)
    sessions = sessions_in_real_time(engine, folder, work) + sessions_in_real_time(engine, folder, work, skip=True)
    return {
        "work": {**work.__dict__, "fps": LIVE_FPS},
        "ttft": ttft,
        "sessions": sessions,
        "ratios": live_rows(ttft, sessions),
    }
