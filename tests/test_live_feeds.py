"""The Live tab's feeds on a real engine, without a browser: a tab's frames feed a session of its own, a new rate or
frame size opens a new one, a refusal is a sentence in the status line, an idle feed closes its session; the
tab's watches go with it to each session and list their events, alerts and guesses marked; a follow-up carries the
conversation."""

import asyncio
import threading
import time

import gradio as gr
import numpy as np
import pytest

from app_harness import wait_until
from engine import Engine, EngineConfig
from engine.live.watch import WatchEvent
from live_helpers import clip_frames
from ui.live_feeds import NO_STREAM, LiveFeed, LiveFeeds
from ui.live_watches import GUESS, NO_EVENTS, event_html

FRAMES = clip_frames(1_000_050, fps=2)


@pytest.fixture(scope="module")
def one_session_engine(tiny_cache_dir):
    with Engine(
        EngineConfig(model="tiny-random", device="cpu", cache_dir=tiny_cache_dir, max_live_sessions=1)
    ) as engine:
        yield engine


def tab(name: str) -> gr.Request:
    return gr.Request(session_hash=name)


def test_a_new_rate_or_size_opens_a_new_session_and_a_full_server_is_one_sentence(one_session_engine):
    feeds = LiveFeeds(one_session_engine)
    first, second = feeds.feed("first"), feeds.feed("second")
    start = time.monotonic()
    first.arrive(FRAMES[0], start, 0.5)
    opened = first.live
    assert opened.stats()["pruning_rate"] == 0.5
    first.arrive(FRAMES[1], start + 0.5, 0.5)
    assert first.live is opened and opened.stats()["frames_received"] == 2
    second.arrive(FRAMES[0], start, 0.5)  # the engine takes one session: the second tab reads why
    assert second.live is None
    assert second.status().endswith(
        "This server already has 1 live sessions open, as many as it takes; close one or try again later."
    )
    assert asyncio.run(last(feeds.ask("What moves?", tab("second")))) == second.problem
    first.arrive(FRAMES[2], start + 1.0, 0.7)  # a new rate: the old session is closed, a new one opened
    assert opened.stats()["closed"] and first.live.stats()["pruning_rate"] == 0.7
    at_rate = first.live
    first.arrive(np.zeros((32, 48, 3), np.uint8), start + 1.5, 0.7)  # a screen instead of the camera
    assert at_rate.stats()["closed"] and first.live.stats()["frames_received"] == 1
    feeds.close_session(tab("first"))
    feeds.close_session(tab("second"))


def test_an_idle_feed_closes_its_session_and_the_next_frame_opens_one(one_session_engine, monkeypatch):
    # The watcher looks only once the question is answered, however slow the machine: a question not yet forked
    # when the session closes ends with the session's sentence, not an answer.
    asked = threading.Event()
    close_if_idle = LiveFeed.close_if_idle

    def after_the_question(self, now_s, idle_s):
        return asked.is_set() and close_if_idle(self, now_s, idle_s)

    monkeypatch.setattr(LiveFeed, "close_if_idle", after_the_question)
    feeds = LiveFeeds(one_session_engine, idle_s=1.5)
    feed = feeds.feed("tab")
    start = time.monotonic() - 1.5  # arrived half a second apart, the last one now
    for index, frame in enumerate(FRAMES[:4]):
        feed.arrive(frame, start + index / 2, 0.5)
    live = feed.live
    assert live.wait(60)
    assert asyncio.run(last(feeds.ask("What moves?", tab("tab")))).endswith("video tokens seen</small>")
    asked.set()
    assert wait_until(lambda: live.stats()["closed"], timeout_s=10)  # no frame for 1.5 s: the watcher closed it
    assert feed.live is None and feed.status().endswith(
        "No frame came for 1.5 s, so the live session was closed; press **Record** to start a new one."
    )
    assert asyncio.run(last(feeds.ask("What moves?", tab("tab")))) == feed.problem
    assert asyncio.run(last(feeds.ask("What moves?", tab("never streamed")))) == NO_STREAM
    feed.arrive(FRAMES[4], time.monotonic(), 0.5)
    assert feed.live is not None and not feed.live.stats()["closed"]
    feeds.close_session(tab("tab"))


async def last(updates):
    return [update async for update in updates][-1]


def test_a_tabs_watch_lists_its_events_and_follows_the_tab_to_each_new_session(one_session_engine):
    feeds = LiveFeeds(one_session_engine, idle_s=3600)  # never idle, however busy the machine
    feed = feeds.feed("tab")
    assert feeds.watch("   ", tab("tab")) == ("   ", "Type what to watch for, e.g. “Is there a red shape?”.")
    box, listing = feeds.watch("What <b>moves</b>?", tab("tab"))  # before any frame: put on the first session
    assert box == "" and "Watching for “What &lt;b&gt;moves&lt;/b&gt;?”" in listing and NO_EVENTS in listing
    start = time.monotonic()
    for index, frame in enumerate(FRAMES[:4]):
        feed.arrive(frame, start + index / 2, 0.5)
    first = feed.live
    (watch,) = first.watches()
    assert first.wait(60) and watch.wait_idle(first.groups_in_state, 60)
    events = feed.updates(time.monotonic())[4]  # the tab's fifth output: the events list
    assert events.count('<li class="evs-watch-event') == len(watch.poll()) >= 1
    assert f"{watch.poll()[0].t_s:.1f} s</span>" in events and 'src="data:image/webp;base64,' in events
    assert feed.updates(time.monotonic())[4] is not events  # nothing new: not sent again (gr.skip())
    feed.arrive(FRAMES[4], start + 2.0, 0.7)  # a new rate opens a new session: the watch goes with the tab
    assert watch.stats()["closed"] and len(feed.live.watches()) == 1 and feed.live.watches()[0] is not watch
    assert feeds.unwatch(tab("tab")) == "" and not feed.live.watches()
    feeds.close_session(tab("tab"))


def test_a_follow_up_in_the_live_tab_carries_the_conversation_so_far(one_session_engine):
    feeds = LiveFeeds(one_session_engine, idle_s=3600)
    feed = feeds.feed("tab")
    start = time.monotonic()
    for index, frame in enumerate(FRAMES[:4]):
        feed.arrive(frame, start + index / 2, 0.5)
    assert feed.live.wait(60)
    first = asyncio.run(last(feeds.ask("What moves?", tab("tab"))))
    second = asyncio.run(last(feeds.ask("Which way?", tab("tab"))))
    assert "a follow-up to 1 earlier" in second and "follow-up" not in first
    said = first.split("\n\n<small>")[0]
    assert feed.turns == [("What moves?", said), ("Which way?", second.split("\n\n<small>")[0])]
    # the engine's answer with that history, asked again of the same frames
    assert second.split("\n\n<small>")[0] == feed.live.ask("Which way?", [("What moves?", said)]).result().text
    feeds.close_session(tab("tab"))


def test_an_event_shows_an_alert_as_one_and_an_unknown_word_as_a_guess():
    def event(answer, alert):
        return WatchEvent(12.5, answer, alert, None, 24, None, {})

    alert = event_html("Is there a red shape?", event("yes", True), ["yes", "no"])
    assert 'class="evs-watch-event evs-watch-alert"' in alert and ">alert</span>" in alert and GUESS not in alert
    guess = event_html("Is there a red shape?", event("<i>bnd</i>", False), ["yes", "no"])
    assert "evs-watch-guess" in guess and GUESS in guess and "&lt;i&gt;bnd&lt;/i&gt;" in guess and "alert" not in guess
    assert GUESS not in event_html("What moves?", event("bnd", False), None)  # a model that names no words
