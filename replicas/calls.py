"""One deployment call read into its requests' streams, on the client's event loop.

A call's messages (replicas/wire.py) are pushed to its streams in order. Two things end the wait for the next
message early: every unfinished stream cancelled by its reader (Stream.when_cancelled wakes the loop the moment
Stream.cancel() is called, whatever the message rate), and the progress deadline: a replica sends ALIVE while
its engine works, so a call with no message for `deadline_s` is on a replica that stopped or hung.
"""

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from ray.exceptions import RayActorError
from ray.serve.exceptions import RequestCancelledError

from engine.errors import SERVER_FAULT, BusyError
from engine.stats import Stats
from engine.stream import Event, Stream

from .wire import ALIVE, ERROR, HELLO, error_from_wire, event_from_wire

log = logging.getLogger(__name__)

REPLICA_LOST = "The server restarted part of its capacity; please ask again."


class ReplicaLost(BusyError):
    """The replica answering this request died or stopped answering; asking again reaches a live one."""


@dataclass(frozen=True)
class Placement:
    """Where a request is being answered: the Serve replica id, its process id, its Ray node id."""

    replica: str
    pid: int
    node: str


class _Cancelled(Exception):
    """Every stream of a call was cancelled by its reader."""


class _Silent(Exception):
    """The call sent nothing within the progress deadline."""


class CancelWatch:
    """Wakes the loop reading a call when any of its streams is cancelled (from whichever thread cancels it)."""

    def __init__(self, streams: list[Stream]):
        self.streams = streams
        self.woken = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        for stream in streams:
            stream.when_cancelled(self._wake)

    def _wake(self, _stream: Stream) -> None:
        try:
            self._loop.call_soon_threadsafe(self.woken.set)
        except RuntimeError:  # the client's loop has closed (shutdown): nobody is reading the call
            pass

    def all_cancelled(self) -> bool:
        unfinished = [stream for stream in self.streams if not stream.finished]
        return bool(unfinished) and all(stream.cancelled for stream in unfinished)


async def next_message(response, watch: CancelWatch, deadline_s: float) -> dict | None:
    """The call's next message (None at its end). Raises _Cancelled once every unfinished stream has been
    cancelled, _Silent when nothing came for deadline_s."""
    pending = asyncio.ensure_future(response.__anext__())
    # Once abandoned, its outcome (often RequestCancelledError) is nobody's: read it so asyncio does not log it.
    pending.add_done_callback(lambda task: task.cancelled() or task.exception())
    waiter = None
    try:
        while True:
            watch.woken.clear()  # before the check: a cancel from now on sets it again
            if watch.all_cancelled():
                raise _Cancelled
            waiter = asyncio.ensure_future(watch.woken.wait())
            done, _ = await asyncio.wait({pending, waiter}, timeout=deadline_s, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if pending in done:
                try:
                    return pending.result()
                except StopAsyncIteration:
                    return None
            if not done:
                raise _Silent
            # A stream was cancelled: the call goes on unless every one of them was.
    finally:
        if waiter is not None:
            waiter.cancel()
        if not pending.done():
            pending.cancel()


async def read_call(
    response, streams: list[Stream], deadline_s: float, placed: Callable[[Placement], None] = lambda _: None
) -> bool:
    """Push one call's messages (`response`, the streaming handle's answer to it) to `streams` until it ends.
    Returns whether a replica started on it (said hello); False only when it failed or fell silent before that,
    so that sending it again is safe. placed(Placement): told once the replica has said hello.

    The call's last ending message (done or error) is held until the call has ended on its replica: a caller
    that asks again as soon as its answer is complete then finds that replica's load without it (the router
    counts a call against its replica until the replica's generator returns).
    """
    placement = None
    last = None  # (stream, message) of the call's last ending message, until the call ends
    watch = CancelWatch(streams)

    def deliver(stream: Stream, message: dict) -> None:
        if message["kind"] == ERROR:
            stream.fail(error_from_wire(message))
        else:
            stream.push(event_from_wire(message))  # a piece for a cancelled stream is dropped there

    try:
        while True:
            message = await next_message(response, watch, deadline_s)
            if message is None:
                break
            if message["kind"] == ALIVE:
                continue
            if message["kind"] == HELLO:
                placement = Placement(message["replica"], message["pid"], message["node"])
                placed(placement)
                continue
            stream = streams[message["index"]]
            ends = message["kind"] in ("done", ERROR)
            if ends and all(other.finished for other in streams if other is not stream):
                last = (stream, message)
            else:
                deliver(stream, message)
    except (_Cancelled, asyncio.CancelledError) as cancelled:
        response.cancel()  # the replica's generator is cancelled, and cancels its engine requests
        if isinstance(cancelled, asyncio.CancelledError):
            raise
        return True
    except RequestCancelledError:
        return True
    except _Silent:
        response.cancel()
        if placement is None:
            log.warning("a call had no answer in %g s; sending it again", deadline_s)
            return False
        log.warning("replica %s (pid %d) sent nothing for %g s", placement.replica, placement.pid, deadline_s)
        fail_unfinished(streams, ReplicaLost(REPLICA_LOST))
        return True
    except RayActorError:
        if placement is None:
            return False
        if last is not None:  # its answer was complete: only the call's end was lost
            deliver(*last)
            last = None
        log.warning("replica %s (pid %d) died with requests in flight", placement.replica, placement.pid)
        fail_unfinished(streams, ReplicaLost(REPLICA_LOST))
        return True
    finally:
        if last is not None:  # a complete answer (or its error) is delivered whatever ended the call
            deliver(*last)
    # A call that ended without ending a request is a bug on the replica's side.
    fail_unfinished(streams, RuntimeError(SERVER_FAULT))
    return True


def fail_unfinished(streams: list[Stream], error: Exception) -> None:
    for stream in streams:
        if not stream.finished:
            stream.fail(error)


def end_cancelled(streams: list[Stream]) -> None:
    """A cancelled request ends as the engine ends one: a done event, with stats not measured."""
    for stream in streams:
        if stream.cancelled and not stream.finished:
            stream.push(Event("done", stats=Stats().as_dict()))
