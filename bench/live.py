"""Live sessions (docs/live.md), shared by `python -m bench` and bench/gpu_check.py:

- TTFT of a question 10, 60 and 600 s into a stream, against the same question on an upload of the same
  recording: the stream's answer forks a state that is already there and bounded by its window, where the
  upload reads, encodes and prefills the whole recording first.
- Sessions kept in real time: n sessions each pushing 2 fps frames at their real capture pace, in threads; a
  session is kept when it dropped no frame and its lag (last frame of a group pushed -> the group in its state)
  stays under 1 s at the 95th percentile. The most n kept, at q = 0 and q = 0.7, without and with
  skip_still_patches: EVS prunes after the vision tower, so alone it shortens only each group's prefill; skipping
  still patches takes the units that did not change out of the vision tower too.

The recording is played faster than real time for the TTFT (`LiveSession.wait` after each group: no frame is
dropped), and at its real pace for the sessions.
"""

import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np

from assets.clips import write_clip
from engine import Engine, FrameSampling, GenerationParams

from .markdown import cell, table

LIVE_FPS = 2.0  # the sessions' sampling, and the recording's rate: every frame is sampled
REAL_TIME_LAG_S = 1.0  # p95 lag under this, and no frame dropped: a session kept in real time
RATES = (0.0, 0.7)


@dataclass(frozen=True)
class LiveWork:
    """moments_s: seconds into the stream a question is asked at (the last is the recording's length).
    size: (width, height) of the recording's frames. max_pixels_per_frame: the sessions' and the upload's cap.
    session_s: seconds each real-time trial runs. max_sessions: the most sessions tried. new_tokens: per answer;
    repeats: questions per moment (median kept)."""

    moments_s: tuple[float, ...]
    size: tuple[int, int]
    max_pixels_per_frame: int
    session_s: float
    max_sessions: int
    new_tokens: int
    repeats: int = 3

    @property
    def sampling(self) -> FrameSampling:
        return FrameSampling(fps=LIVE_FPS, max_pixels_per_frame=self.max_pixels_per_frame)


def recording(folder: Path, seconds: float, size: tuple[int, int], name: str = "recording") -> Path:
    """A `seconds`-long 2 fps H.264 recording of a moving object (x264 ultrafast: input, not the subject)."""
    return write_clip(
        folder / f"{name}.mp4",
        "moving_object",
        seconds=seconds,
        fps=int(LIVE_FPS),
        size=size,
        options={"preset": "ultrafast", "crf": "23", "threads": "0"},
    )


def frames_of(path: Path):
    """(frame, capture time in seconds) of every frame of a file, decoded as they are needed."""
    with av.open(str(path)) as container:
        for frame in container.decode(video=0):
            yield frame.to_ndarray(format="rgb24"), float(frame.time)


def _params(q: float, work: LiveWork, skip: bool = False) -> GenerationParams:
    return GenerationParams(
        pruning_rate=q,
        max_new_tokens=work.new_tokens,
        ignore_eos=True,
        frame_sampling=work.sampling,
        skip_still_patches=skip,
    )


def ttft_into_stream(engine: Engine, folder: Path, work: LiveWork, question: str, q: float = 0.7) -> dict:
    """The median TTFT of `repeats` questions at each moment of one stream (with the kept video tokens its state
    held then), and of the same question on an upload of the whole recording (the engine's frame sampling for
    uploads; caches as the engine has them)."""
    path = recording(folder, work.moments_s[-1], work.size)
    moments, waiting = [], list(work.moments_s)
    with engine.open_live(_params(q, work)) as live:
        for frame, time_s in frames_of(path):
            live.push(frame, time_s)
            assert live.wait(600), "a live group did not reach the session's state"
            if waiting and time_s + 1 / LIVE_FPS >= waiting[0] - 1e-6:  # the frame that ends this second is in
                answers = [live.ask(question).result() for _ in range(work.repeats)]
                moments.append(
                    {
                        "seconds": waiting.pop(0),
                        "ttft_s": statistics.median(a.stats["ttft_s"] for a in answers),
                        "video_tokens_held": live.stats()["video_tokens_held"],
                    }
                )
    upload = [
        engine.submit(
            path, question, GenerationParams(pruning_rate=q, max_new_tokens=work.new_tokens, ignore_eos=True)
        ).result()
        for _ in range(work.repeats)
    ]
    return {
        "pruning_rate": q,
        "moments": moments,
        "upload_ttft_s": statistics.median(a.stats["ttft_s"] for a in upload),
        "upload_video_tokens": upload[0].stats["video_tokens_total"],
    }


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
    their stats."""
    sessions = [engine.open_live(_params(q, work, skip)) for _ in frames]

    def play(live, own):
        start = time.monotonic()
        for frame, time_s in own:
            time.sleep(max(0.0, time_s - (time.monotonic() - start)))
            live.push(frame, time_s)

    threads = [threading.Thread(target=play, args=pair) for pair in zip(sessions, frames)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for live in sessions:
        live.wait(REAL_TIME_LAG_S)
    stats = [live.stats() for live in sessions]
    for live in sessions:
        live.close()
    kept = all(
        s["frames_dropped"] == 0 and s["lag_s"]["p95"] is not None and s["lag_s"]["p95"] < REAL_TIME_LAG_S
        for s in stats
    )
    return kept, stats


def sessions_in_real_time(engine: Engine, folder: Path, work: LiveWork, skip: bool = False) -> list[dict]:
    """For each q of RATES, the most sessions kept in real time, up to max_sessions: doubling from one until a
    trial fails, then halving the gap; with the worst p95 lag of the largest trial kept (skip: every session skips
    still patches)."""
    frames = _session_frames(folder, work)
    rows = []
    for q in RATES:
        kept_lags, low, high, n = {}, 0, work.max_sessions + 1, 1  # low sessions kept; high did not
        while low + 1 < high:
            kept, stats = _kept_in_real_time(engine, frames[:n], q, work, skip)
            if kept:
                low, kept_lags[n] = n, max(row["lag_s"]["p95"] for row in stats)
            else:
                high = n
            n = min(2 * low, high - 1) if high > work.max_sessions else (low + high) // 2
        rows.append(
            {
                "pruning_rate": q,
                "skip_still_patches": skip,
                "sessions": low,
                "p95_lag_s": kept_lags.get(low),
                "tried_up_to": work.max_sessions,
            }
        )
    return rows


def live_rows(ttft: dict, sessions: list[dict]) -> dict:
    """The two figures as ratios: TTFT at the last moment over the first, live over upload at the last, and
    sessions kept at q = 0.7 over q = 0, without skipping still patches and with."""
    first, last = ttft["moments"][0], ttft["moments"][-1]
    at = {(row["pruning_rate"], row.get("skip_still_patches", False)): row["sessions"] for row in sessions}
    ratios = {
        "ttft_last_over_first": last["ttft_s"] / first["ttft_s"],
        "live_over_upload": last["ttft_s"] / ttft["upload_ttft_s"],
        "sessions_pruned_over_q0": at[0.7, False] / at[0.0, False] if at[0.0, False] else None,
    }
    if (0.0, True) in at:
        ratios["sessions_pruned_over_q0_skipping"] = at[0.7, True] / at[0.0, True] if at[0.0, True] else None
    return ratios


def markdown(live: dict) -> str:
    ttft, sessions = live["ttft"], live["sessions"]
    rows = [[f"live, {m['seconds']:g} s in", cell(m["ttft_s"]), m["video_tokens_held"]] for m in ttft["moments"]]
    rows.append(
        [
            f"upload of the {ttft['moments'][-1]['seconds']:g} s recording",
            cell(ttft["upload_ttft_s"]),
            ttft["upload_video_tokens"],
        ]
    )
    ratios = live["ratios"]
    return (
        table([f"question at q = {ttft['pruning_rate']}", "TTFT s", "video tokens (held / upload's)"], rows)
        + "\n\n"
        + table(
            [
                "q",
                "skip still patches",
                f"sessions kept in real time ({LIVE_FPS:g} fps, p95 lag < {REAL_TIME_LAG_S:g} s)",
                "worst p95 lag s",
                "tried up to",
            ],
            [
                [
                    row["pruning_rate"],
                    "yes" if row.get("skip_still_patches") else "no",
                    row["sessions"],
                    cell(row["p95_lag_s"]),
                    row["tried_up_to"],
                ]
                for row in sessions
            ],
        )
        + f"\n\nTTFT {ttft['moments'][-1]['seconds']:g} s in / {ttft['moments'][0]['seconds']:g} s in: "
        f"{cell(ratios['ttft_last_over_first'], 2)}; live / upload: {cell(ratios['live_over_upload'], 3)}; "
        f"sessions at q = 0.7 / q = 0: {cell(ratios['sessions_pruned_over_q0'], 2)}"
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
