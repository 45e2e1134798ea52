"""TTFT of a question asked into a live stream while it is pushed at its capture pace, against the same question on
an upload of the same recording at the same q (bench/live.py's first figure).

The recording is fast-forwarded (each frame pushed, then the session waited for, so nothing is dropped) up to
LEAD_S before a moment, then played at its capture pace from its own clock: each frame pushed when the wall clock
reaches its capture time. From the moment on, `questions` questions are asked one after another, each just as a
group's last frame has been pushed and only once the answer before it has ended: a question waits for that group's
vision forward and prefill (and for any group the engine is behind on), the most a live question waits at capture
pace, while the stream goes on. The recording runs `tail_s` past the last moment for them; a question that would
come after its end is not asked, and the count asked is reported. For each moment the same question is asked on
an upload of the recording cut there (`live_work.cut`), `uploads` times at the same q, caches as the engine has
them (off in the benchmarks): the upload reads, encodes and prefills it all first.
"""

import time
from pathlib import Path

from engine import Engine, GenerationParams

from .live_work import LIVE_FPS, PACE_S, LiveWork, cut, frames_of, quartiles, recording

LEAD_S = 4.0  # seconds played at capture pace before a moment: the session is in its steady state when asked
ANSWER_TIMEOUT_S = 600.0


def ttft_into_stream(engine: Engine, folder: Path, work: LiveWork, question: str, q: float = 0.7) -> dict:
    """{"pruning_rate", "moments": one row per moment, "worst_lateness_s": the most a paced push came after its
    capture time, "frames_dropped": by the session, "paced": whether the stream kept its capture pace (no push more
    than a frame interval late, no frame dropped; on a machine too busy for that the questions were asked into a
    slower stream, so the live figures do not measure what they say)}. A moment's row: the live questions' TTFT
    quartiles and count, the video tokens kept and total the median question saw, the uploads' the same, and live /
    upload with the range the quartiles allow."""
    path = recording(folder, work.moments_s[-1] + work.tail_s, work.size)
    waiting, asking, asked = list(work.moments_s), None, {moment: [] for moment in work.moments_s}
    origin, worst_late = None, 0.0  # origin: perf_counter() - capture time while playing at pace
    group = engine.family.temporal_patch  # every frame of the recording is sampled: a group is this many frames
    with engine.open_live(work.params(q)) as live:
        for index, (frame, time_s) in enumerate(frames_of(path)):
            if asking is None and not waiting:
                break
            seen_s = time_s + 1 / LIVE_FPS  # seconds of stream once this frame is in
            if asking is None and seen_s <= waiting[0] - LEAD_S:
                live.push(frame, time_s)
                assert live.wait(ANSWER_TIMEOUT_S), "a live group did not reach the session's state"
                origin = None
                continue
            if origin is None:
                origin = time.perf_counter() - time_s
            late = time.perf_counter() - (origin + time_s)
            if late < 0:
                time.sleep(-late)
            worst_late = max(worst_late, late)
            live.push(frame, time_s)
            if (index + 1) % group:
                continue  # questions are asked as a group's last frame is pushed
            if asking is None and seen_s >= waiting[0] - 1e-6:
                asking = waiting.pop(0)
            if asking is None or (asked[asking] and not asked[asking][-1].finished):
                continue
            if len(asked[asking]) < work.questions:
                asked[asking].append(live.ask(question))
            else:
                asking = None
        answers = {moment: [stream.result(ANSWER_TIMEOUT_S) for stream in asked[moment]] for moment in asked}
        dropped = live.stats()["frames_dropped"]
    upload_params = GenerationParams(pruning_rate=q, max_new_tokens=work.new_tokens, ignore_eos=True)
    rows = []
    for moment in work.moments_s:
        upload = cut(path, moment, folder / f"upload-{moment:g}s.mp4")
        uploads = [engine.submit(upload, question, upload_params).result() for _ in range(work.uploads)]
        rows.append(moment_row(moment, answers[moment], uploads))
    return {
        "pruning_rate": q,
        "moments": rows,
        "worst_lateness_s": worst_late,
        "frames_dropped": dropped,
        "paced": worst_late <= PACE_S and dropped == 0,
    }


def moment_row(moment: float, live: list, uploads: list) -> dict:
    """One moment's figures from its live answers and its uploads' answers (engine Answers)."""
    if not live:
        raise RuntimeError(f"no question was asked {moment:g} s into the stream: the recording ended first")
    live_q = quartiles([answer.stats["ttft_s"] for answer in live])
    upload_q = quartiles([answer.stats["ttft_s"] for answer in uploads])
    return {
        "seconds": moment,
        "questions": len(live),
        "ttft_s": live_q[1],
        "ttft_quartiles_s": [live_q[0], live_q[2]],
        **tokens("", _median_answer(live)),
        "uploads": len(uploads),
        "upload_ttft_s": upload_q[1],
        "upload_ttft_quartiles_s": [upload_q[0], upload_q[2]],
        **tokens("upload_", _median_answer(uploads)),
        "live_over_upload": live_q[1] / upload_q[1],
        "live_over_upload_spread": [live_q[0] / upload_q[2], live_q[2] / upload_q[0]],
    }


def _median_answer(answers: list):
    return sorted(answers, key=lambda answer: answer.stats["ttft_s"])[(len(answers) - 1) // 2]


def tokens(prefix: str, answer) -> dict:
    """The video tokens an answer saw: kept and total (before pruning); a live answer's count the window's groups."""
    return {
        f"{prefix}video_tokens_kept": answer.stats["video_tokens_kept"],
        f"{prefix}video_tokens_total": answer.stats["video_tokens_total"],
    }
