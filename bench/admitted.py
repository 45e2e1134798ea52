"""Submitting more requests than the engine takes at once, as a patient client would.

The engine refuses a request as busy when its queue or the host memory it keeps for waiting videos is full
(engine/scheduling/admission.py); a bench that hands it a whole table of questions at once waits for the oldest
one still unanswered and asks again, so every request is answered and as many as fit are batched together.
"""

from engine import Engine
from engine.errors import BusyError
from engine.stream import Stream


def submit_admitted(engine: Engine, submitted: list[Stream], **request) -> Stream:
    """engine.submit(**request), waiting for the oldest of `submitted` still unanswered each time the engine is
    busy; BusyError only when none is left to wait for (the engine is busy with someone else's requests)."""
    while True:
        try:
            return engine.submit(**request)
        except BusyError:
            unanswered = next((stream for stream in submitted if not stream.finished), None)
            if unanswered is None:
                raise
            try:
                unanswered.result()
            except Exception:  # its error is the caller's to read, where it reads its answer
                pass
