"""The Live tab's standing questions (docs/live.md, "The Live tab"): the "Watch for" questions a tab holds, put on
each live session its feed opens (`LiveSession.watch`), and their events as the tab lists them: the stream time,
the question, the answer and the group the answer saw as the model saw it (dropped patches dimmed), alerts
highlighted, an answer outside the words the model learned marked as the guess it is."""

import base64
import html
import io
import threading

import numpy as np
from PIL import Image

from engine.errors import InputError
from ui import overlays

SHOWN_EVENTS = 20  # the newest events listed
PICTURE_SIDE_PX = 96  # an event's picture is scaled to fit this square (nearest pixel: the patches stay sharp)
NO_EVENTS = "No events yet: a watch is asked again each time something in view changes."
GUESS = "not an answer this model learned: read it as a guess"


class TabWatches:
    """One tab's watch questions and their watches on its feed's current session."""

    def __init__(self):
        self.questions: list[str] = []
        self._watches: list = []  # (question, Watch) on the current session
        self._lock = threading.Lock()
        self._shown: tuple | None = None  # what the list showed last: (watch, events) counts

    def add(self, question: str, live) -> None:
        """Watch for `question` on this tab's sessions, from the current one (when there is one) on; InputError for
        a question the engine refuses (the tab keeps its other watches)."""
        question = (question or "").strip()
        watch = live.watch(question) if live is not None else None
        if watch is None and not question:
            raise InputError("Type what to watch for, e.g. “Is there a red shape?”.")
        with self._lock:
            self.questions.append(question)
            if watch is not None:
                self._watches.append((question, watch))

    def clear(self) -> None:
        """Stop every watch of the tab."""
        with self._lock:
            watches, self._watches, self.questions = self._watches, [], []
        for _, watch in watches:
            try:
                watch.close()
            except InputError:  # behind the replicas, a session lost with its replica: the watch went with it
                pass

    def attach(self, live) -> str | None:
        """A new session opened: the tab's questions are put on it (their old watches ended with the old session);
        the first refusal's sentence, or None."""
        problem, watches = None, []
        for question in list(self.questions):
            try:
                watches.append((question, live.watch(question)))
            except InputError as error:
                problem = problem or str(error)
        with self._lock:
            self._watches = watches
        return problem

    def events(self) -> list[tuple[str, object]]:
        """(question, WatchEvent) of the current session's watches, newest first, at most SHOWN_EVENTS."""
        with self._lock:
            watches = list(self._watches)
        found = [(question, event) for question, watch in watches for event in watch.poll()[-SHOWN_EVENTS:]]
        found.sort(key=lambda pair: pair[1].t_s, reverse=True)
        return found[:SHOWN_EVENTS]

    def html(self, answers: list[str] | None) -> str | None:
        """The events list as HTML, or None when it has not changed since last shown."""
        events = self.events()
        shown = (tuple(question for question, _ in self._watches), tuple(id(event) for _, event in events))
        if shown == self._shown:
            return None
        self._shown = shown
        if not self.questions:
            return ""
        watching = ", ".join(f"“{html.escape(question)}”" for question in self.questions)
        items = "".join(event_html(question, event, answers) for question, event in events)
        listing = f'<ol class="evs-watch-events">{items}</ol>' if items else f"<p>{NO_EVENTS}</p>"
        return f'<div class="evs-watch"><p>Watching for {watching}.</p>{listing}</div>'


def event_html(question: str, event, answers: list[str] | None) -> str:
    """One event as a list item: its picture, stream time, question and answer; an alert highlighted, a guess
    marked. Everything the model or the person wrote is escaped."""
    guess = answers is not None and event.answer not in answers
    classes = "evs-watch-event" + (" evs-watch-alert" if event.alert else "") + (" evs-watch-guess" if guess else "")
    picture = ""
    if event.picture is not None:
        picture = f'<img src="{picture_url(event.picture)}" alt="the stream at {event.t_s:.1f} s as the model saw it">'
    flag = '<span class="evs-watch-flag">alert</span>' if event.alert else ""
    note = f' <small class="evs-watch-note">({GUESS})</small>' if guess else ""
    return (
        f'<li class="{classes}">{picture}<span class="evs-watch-time">{event.t_s:.1f} s</span> '
        f'<span class="evs-watch-question">{html.escape(question)}</span> '
        f'<b class="evs-watch-answer">{html.escape(event.answer) or "(no answer)"}</b>{note}{flag}</li>'
    )


def picture_url(picture) -> str:
    """An event's group (EvsPicture of one group) with its dropped patches dimmed, as a small WebP data URL."""
    frame = overlays.dim_pruned(picture.frames[0], picture.kept_mask[0])
    height, width = frame.shape[:2]
    scale = PICTURE_SIDE_PX / max(height, width)
    rows = np.arange(max(1, round(height * scale))) * height // max(1, round(height * scale))
    cols = np.arange(max(1, round(width * scale))) * width // max(1, round(width * scale))
    buffer = io.BytesIO()
    Image.fromarray(frame[np.ix_(rows, cols)]).save(buffer, format="webp")
    return "data:image/webp;base64," + base64.b64encode(buffer.getvalue()).decode()
