"""Stream delivery across threads and event loops."""

import asyncio

import pytest

from engine.errors import InputError
from engine.stream import Event, Stream


def test_events_pushed_before_an_async_reader_starts_are_not_lost():
    stream = Stream(1)
    stream.push(Event("status", "decoding video"))

    async def read():
        stream.push(Event("text", "hi"))
        stream.push(Event("done", stats={"generated_tokens": 1}, token_ids=(7,)))
        return [event.kind async for event in stream.aevents()]

    assert asyncio.run(read()) == ["status", "text", "done"]
    answer = stream.result(1)
    assert answer.text == "hi" and answer.token_ids == (7,)


def test_a_reader_whose_loop_closed_does_not_break_the_writer():
    stream = Stream(2)

    async def read_one():
        async for event in stream.aevents():
            return event

    async def start_reader():
        task = asyncio.ensure_future(read_one())
        await asyncio.sleep(0)  # the reader registers, then this loop ends with it pending
        task.cancel()

    asyncio.run(start_reader())
    stream.push(Event("text", "still fine"))  # the worker thread must not raise here
    stream.push(Event("done", stats={}))
    assert stream.result(1).text == "still fine"


def test_a_failed_stream_raises_for_every_reader():
    stream = Stream(3)
    stream.fail(InputError("The file could not be read as a video."))
    with pytest.raises(InputError):
        list(stream)
    with pytest.raises(InputError):
        stream.result(1)


def test_cancel_tells_its_watchers_at_once_and_the_stream_takes_no_more_pieces():
    """Behind the replicas a call waits on its replica's next message; the cancel must wake it whatever the message
    rate (replicas/calls.py), and what the replica still sends must not reach the reader."""
    stream = Stream(4)
    told = []
    stream.when_cancelled(told.append)
    stream.push(Event("text", "before"))
    assert told == []
    stream.cancel()
    stream.cancel()  # twice: the watchers are told once
    assert told == [stream]
    later = []
    stream.when_cancelled(later.append)  # watching a cancelled stream: told at once
    assert later == [stream]
    for kind in ("status", "thinking", "text"):
        stream.push(Event(kind, "after"))
    stream.push(Event("done", stats={"generated_tokens": 1}))
    assert [event.kind for event in stream] == ["text", "done"]
    answer = stream.result(1)
    assert answer.cancelled and answer.text == "before" and answer.thinking == ""
    ended = []
    stream.when_cancelled(ended.append)  # an ended stream keeps no watchers and tells none
    assert ended == []
