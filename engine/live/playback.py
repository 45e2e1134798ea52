"""A feed played into a live session, with a question asked at given moments (docs/live.md, "A file played as
live"): `python -m engine --live` and bench/live.py.

At its own pace each frame is pushed when the wall clock, from the first frame, reaches its capture time, so the
session sees what a camera would (and drops what it cannot keep up with, as for a camera). As fast as possible,
each frame is pushed as soon as it is read and the session is waited for after it, so nothing is dropped and a
recording plays in the time the engine takes. A moment's question is asked once every frame captured up to that
moment is pushed; moments past the feed's end are asked at its end.
"""

import time
from collections.abc import Callable, Iterable, Sequence

from engine.errors import InputError
from engine.reading.live_stream import LiveFrame
from engine.stream import Stream

CATCH_UP_TIMEOUT_S = 600.0  # as fast as possible: the longest one push may wait for the session


def play(
    live,
    feed: Iterable[LiveFrame | str],
    moments_s: Sequence[float],
    ask: Callable[[], Stream],
    on_answer: Callable[[float, float, Stream | InputError], None],
    on_status: Callable[[str], None] = lambda line: None,
    as_fast_as_possible: bool = False,
) -> float | None:
    """Push the feed's frames into `live` and, at each of moments_s (seconds of the feed, any order), call
    on_answer(moment_s, asked_at_s, ask()): the Stream, or the InputError ask raised (e.g. no whole group yet);
    asked_at_s is the capture time of the last frame pushed. Status lines (str items of the feed) go to on_status.
    Returns the last frame's capture time; None when the feed gave none (nothing was asked)."""
    waiting = sorted(moments_s)
    start, last_s = time.monotonic(), None

    def ask_due(until_s: float) -> None:
        while waiting and waiting[0] < until_s:
            moment_s = waiting.pop(0)
            if not as_fast_as_possible:
                time.sleep(max(0.0, moment_s - (time.monotonic() - start)))
            try:
                answer = ask()
            except InputError as error:
                answer = error
            on_answer(moment_s, last_s, answer)

    for item in feed:
        if isinstance(item, str):
            on_status(item)
            continue
        ask_due(item.t_s)
        if as_fast_as_possible:
            live.push(item.frame, item.t_s)
            live.wait(CATCH_UP_TIMEOUT_S)
        else:
            time.sleep(max(0.0, item.t_s - (time.monotonic() - start)))
            live.push(item.frame, item.t_s)
        last_s = item.t_s
    if last_s is not None:
        as_fast_as_possible = True  # the feed is over: what is left is asked now
        ask_due(float("inf"))
    return last_s
