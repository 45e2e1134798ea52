"""Standing questions on a live session: a question asked again as the stream goes on, an event each time its
answer changes (docs/live.md, "Watches").

    watch = live.watch("Is there a red shape?")
    for event in watch:                 # blocks for the next event; ends when the watch or its session closes
        print(event.t_s, event.answer, event.alert)

The caller holds the Watch; the worker decides when it is asked (engine/worker/live.py): when a temporal group
that changed beyond the session's noise floor has entered the state since its last ask, at most once per group,
below users' questions and never queued (an ask the engine has no room for is dropped and counted). Each ask is
a question forked from the session's state like any other; its answer, when it differs from the last one, is an
event. A yes/no question whose answer turns `yes` is an alert.
"""

import collections
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from engine.config import GenerationParams
from engine.stream import Answer, EvsPicture

# Events a watch keeps for poll(): one per answer change, at most one per temporal group, so an hour at 2 fps
# and 2 frames a group changing every group is 1,800; the oldest past this many are let go.
MAX_EVENTS = 1000
# Events that keep the picture of the group they saw (a frame at the session's size each): the newest ones, for a
# page that shows the latest events with their pictures.
EVENTS_WITH_PICTURES = 16
YES = "yes"


@dataclass(frozen=True)
class WatchEvent:
    """An answer of a watch that differs from its last one (the first answer included).

    t_s: the capture time of the newest frame the answer saw, in seconds from the stream's first frame. answer:
    its text. alert: a yes/no answer that turned `yes` (from anything else, or as the first answer). previous: the
    answer before (None for the first). group: the index of the newest temporal group it saw. picture: that group
    as the model saw it (its first frame, the tokens causal EVS kept), None once the event is older than the
    newest EVENTS_WITH_PICTURES. stats: the ask's stats (an answer's). logits: (generated, V) float32 when the
    watch's params set return_logits, else None.
    """

    t_s: float
    answer: str
    alert: bool
    previous: str | None
    group: int
    picture: EvsPicture | None
    stats: dict
    logits: np.ndarray | None = None

    def without_picture(self) -> "WatchEvent":
        return WatchEvent(self.t_s, self.answer, self.alert, self.previous, self.group, None, self.stats, self.logits)


class Watch:
    """A standing question on a live session (`LiveSession.watch`). Iterating it blocks for the next event and ends
    when it closes (each iteration from the first event); `poll()` returns every event so far at once;
    `events_after(n)` the ones after the first n; `stats()` counts its asks and events; `close()` ends it
    (closing its session ends it too).

    watch_id: its number within the session; question, params: what is asked and the answers' settings;
    on_close(watch): tells the session it ended.
    """

    def __init__(self, watch_id: int, question: str, params: GenerationParams, on_close: Callable[["Watch"], None]):
        self.id, self.question, self.params = watch_id, question, params
        self._on_close = on_close
        self._lock = threading.Condition()
        self._events: collections.deque[WatchEvent] = collections.deque(maxlen=MAX_EVENTS)
        self._events_total = 0
        self._counts = {"asks": 0, "answered": 0, "dropped": 0}
        self._last: str | None = None  # the last answer
        self._changed = True  # something changed since the last ask (a new watch is asked for its first answer)
        self._asking = False  # an ask is under way
        self._pending = False  # it was found due, and the worker has not yet made or dropped the ask
        self._groups_seen = 0  # the stream's groups the watch has been told of
        self._ended: str | None = None
        self.make_ask: Callable[[], object] | None = None  # the engine's: a request for its next ask

    # --- the caller's side ---------------------------------------------------------------------------------
    def poll(self) -> list[WatchEvent]:
        """Every event so far (the newest MAX_EVENTS), oldest first, without blocking."""
        with self._lock:
            return list(self._events)

    def __iter__(self) -> Iterator[WatchEvent]:
        seen = 0
        while True:
            events, seen = self.events_after(seen)
            if not events:
                return
            yield from events

    def events_after(self, seen: int, timeout_s: float | None = None) -> tuple[list[WatchEvent], int]:
        """(the events after the first `seen` ever made, as many as are still kept; how many there have been),
        waiting up to timeout_s (None: as long as it takes) for one while there is none and the watch is open."""
        with self._lock:
            self._lock.wait_for(lambda: self._ended is not None or self._events_total > seen, timeout_s)
            new = max(0, min(len(self._events), self._events_total - seen))
            return list(self._events)[len(self._events) - new :], self._events_total

    def stats(self) -> dict:
        """asks: questions asked so far; answered: of those, the ones answered (the rest failed, were taken back,
        or are under way); events: answers that changed; dropped: asks due that the engine had no room for (they
        are not queued); asking: whether an ask is due or under way; groups_seen: the stream's groups in the state when
        the watch was last told of one; closed."""
        with self._lock:
            return {
                **self._counts,
                "events": self._events_total,
                "asking": self._asking or self._pending,
                "groups_seen": self._groups_seen,
                "closed": self._ended is not None,
            }

    def wait_idle(self, groups: int, timeout_s: float | None = None) -> bool:
        """Block until the watch has been told of `groups` groups in the session's state and has no ask under way
        (or it has ended), at most timeout_s; True when it is: a recording played to its end is watched to it."""
        with self._lock:
            return self._lock.wait_for(
                lambda: (
                    self._ended is not None or (self._groups_seen >= groups and not self._asking and not self._pending)
                ),
                timeout_s,
            )

    def close(self) -> None:
        """End the watch: no more asks; an iterator ends after the events so far. Closing twice is harmless."""
        if self.end("This watch is closed."):
            self._on_close(self)

    @property
    def ended(self) -> str | None:
        """Why the watch ended (a sentence), or None while it runs."""
        return self._ended

    # --- the engine's side -----------------------------------------------------------------------------------
    def end(self, why: str) -> bool:
        """End the watch with why; True when this call ended it."""
        with self._lock:
            if self._ended:
                return False
            self._ended = why
            self._lock.notify_all()
            return True

    @property
    def due(self) -> bool:
        """Whether the watch is due an ask: something changed since its last ask and it has none under way."""
        with self._lock:
            return self._ended is None and self._changed and not self._asking

    def saw(self, changed: bool, groups: int) -> bool:
        """Groups entered the state, `groups` of the stream's in it now (changed: any beyond the noise floor, or
        the stream's first); True when the watch is due an ask now: something changed since its last ask and it
        has none under way."""
        with self._lock:
            self._changed = self._changed or changed
            self._groups_seen = groups
            self._pending = self._ended is None and self._changed and not self._asking
            self._lock.notify_all()
            return self._pending

    def asking(self) -> None:
        """An ask was made for the changes so far."""
        with self._lock:
            self._changed, self._asking, self._pending = False, True, False
            self._counts["asks"] += 1

    def dropped(self) -> None:
        """An ask due was not made, or was taken back, for want of room: the change waits for the next group."""
        with self._lock:
            self._changed, self._asking, self._pending = True, False, False
            self._counts["dropped"] += 1
            self._lock.notify_all()

    def answered(self, answer: Answer | None, seen: tuple[int, float], picture: EvsPicture | None) -> None:
        """An ask ended: its answer (None when it failed), the (group, t_s) it saw and that group's picture."""
        with self._lock:
            self._asking = False
            self._lock.notify_all()
            if answer is None or self._ended:
                return
            self._counts["answered"] += 1
            text = answer.text.strip()
            if text == self._last:
                return
            previous, self._last = self._last, text
            alert = text.lower() == YES and (previous or "").lower() != YES
            self._events.append(
                WatchEvent(seen[1], text, alert, previous, seen[0], picture, answer.stats, answer.logits)
            )
            self._events_total += 1
            pictured = len(self._events) - EVENTS_WITH_PICTURES - 1
            if pictured >= 0 and self._events[pictured].picture is not None:
                self._events[pictured] = self._events[pictured].without_picture()
            self._lock.notify_all()
