"""Serving a burst of users on the engine, and the run record every serving scenario shares.

A burst is N users (distinct clips) submitted back to back, as users pressing Ask at the same moment: the
engine admits each as soon as its video is read, exactly as in serving (`engine.paused()`, which holds
admission until the whole burst is read, would make the first user wait for every video's reading). Every
time in a run is seconds from the burst's start (time.perf_counter).
"""

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine import Answer, Engine, GenerationParams

from .workload import QUESTION, params


@dataclass(frozen=True)
class UserTiming:
    """One user's answer in a burst. ttft_s: burst start -> first answer token; done_s: burst start ->
    last token; decode_s: first -> last token (seconds); generated_tokens: answer length."""

    ttft_s: float
    done_s: float
    decode_s: float
    generated_tokens: int


@dataclass
class BurstRun:
    """Every user's timing in submission order, and wall_s: burst start -> every answer done (seconds).
    answers: the engine's answers with their stats (empty for the peer)."""

    users: list[UserTiming]
    wall_s: float
    answers: list[Answer] = field(default_factory=list)

    def first(self, count: int) -> "BurstRun":
        """The run of the first `count` users, for a server that serves one user after another: the first
        `count` users of a larger burst are served exactly as a burst of `count` would be."""
        kept = self.users[:count]
        return BurstRun(kept, max(user.done_s for user in kept), self.answers[:count])


def engine_burst(engine: Engine, clips: list[Path], request: GenerationParams, together: bool = False) -> BurstRun:
    """Submit one request per clip at the same instant and wait for every answer. together: hold
    admission until every video is read (`engine.paused()`), so the worker takes the burst in one
    iteration and batches its vision forward: the GPU check measures that batching."""
    start = time.perf_counter()
    with engine.paused() if together else contextlib.nullcontext():
        submitted = [(time.perf_counter() - start, engine.submit(clip, QUESTION, request)) for clip in clips]
    answers = [stream.result() for _, stream in submitted]
    wall_s = time.perf_counter() - start
    users = [
        UserTiming(
            ttft_s=offset + answer.stats["ttft_s"],
            done_s=offset + answer.stats["total_s"],
            decode_s=answer.stats["decode_s"],
            generated_tokens=answer.stats["generated_tokens"],
        )
        for (offset, _), answer in zip(submitted, answers)
    ]
    return BurstRun(users, wall_s, answers)


def median_run(runs: list[BurstRun]) -> BurstRun:
    """The run of median wall time (the lower middle one of an even count)."""
    return sorted(runs, key=lambda run: run.wall_s)[(len(runs) - 1) // 2]


def burst_round(
    engine: Engine, clips: list[Path], sizes: tuple[int, ...], rates: tuple[float, ...], new_tokens: int
) -> dict[tuple[int, float], BurstRun]:
    """{(users, q): one burst of the first `users` clips} for every size and q; the rates of one size run
    back to back, so drift on a shared machine hits them alike."""
    return {(size, q): engine_burst(engine, clips[:size], params(q, new_tokens)) for size in sizes for q in rates}


def median_runs(rounds: list[dict[tuple[int, float], BurstRun]]) -> dict[tuple[int, float], BurstRun]:
    """{key: the median-wall run of that key over the rounds}."""
    return {key: median_run([measured[key] for measured in rounds]) for key in rounds[0]}
