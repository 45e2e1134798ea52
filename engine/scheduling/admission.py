"""Admission: the one place where the engine decides whether a request may come in.

A request is counted twice from `submit` on: as one of at most `max_queue` requests on their way to the worker
(a queue slot, given back when the worker takes it), and by the host bytes it holds until its vision forward
(its frames, the processor's float32 pixel values, a heard soundtrack, and while it is prepared the HF
processor's working copies), against `admission_bytes`. The bytes are estimated from the request's frame
sampling before anything is read (`request_host_bytes`: an upper bound), settled to what it holds once
prepared, and given back when the vision forward no longer needs them (`Request.drop_pixels`) or the request
ends. Past either bound `take` raises BusyError with a sentence that says which; a request that alone exceeds
the byte budget could never come in, and gets an InputError.

Bookkeeping only: no torch.
"""

import os
import threading
from pathlib import Path

from engine.config import FrameSampling
from engine.errors import QUEUE_FULL, BusyError, InputError

MB = 1 << 20
RGB = 3  # channels of a sampled frame
FRAME_BYTES_PER_VALUE = 1  # a sampled frame: uint8
PIXEL_BYTES_PER_VALUE = 4  # the processor's pixel values: float32, one per frame value
# What the HF processor holds besides its output while it makes one medium's pixel values: the fast video
# processors keep the resized frames as floats, the normalised values, their patches and the patches concatenated.
# Measured at the CPU's largest sampling (128 frames of 548x732, tiny-random's Qwen3-VL processor): 2,062 MB above
# the frames at its peak for 586 MB of pixel values, so 1,476 MB besides them, 2.5 times; counted as 3 times.
PROCESSOR_BYTES_PER_VALUE = 3 * PIXEL_BYTES_PER_VALUE
# A heard soundtrack: its float32 samples, and the audio tower's input made from them (log-mel frames: 128 bins
# every 160 samples on Nemotron-H Omni's Parakeet, 0.8 floats a sample), at most as many floats again.
SOUNDTRACK_BYTES_PER_SAMPLE = 2 * 4
# The share of the machine's memory that waiting requests' frames and pixels may hold by default: the model,
# the caches and the worker's forwards need the rest.
DEFAULT_SHARE = 4  # a quarter


def machine_memory_bytes() -> int:
    """This process's memory: the machine's, or its control group's limit when lower (a container)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def default_admission_bytes() -> int:
    """EngineConfig.admission_bytes when it is None: a quarter of machine_memory_bytes."""
    return machine_memory_bytes() // DEFAULT_SHARE


def request_host_bytes(
    media: int, sampling: FrameSampling, soundtrack_rate_hz: int | None, max_soundtrack_seconds: float
) -> int:
    """The most host memory a request about `media` uploads holds from its read to its vision forward: every
    medium read as a video at `sampling`'s most frames of its most pixels, as uint8 frames and float32 pixel
    values (a still picture is less: the Qwen processors repeat it to one temporal group), when it is heard
    (soundtrack_rate_hz not None) the longest soundtrack's samples and mel frames, and the HF processor's working
    copies of one medium (the media are processed one after another)."""
    values = sampling.max_frames * sampling.max_pixels_per_frame * RGB
    per_medium = values * (FRAME_BYTES_PER_VALUE + PIXEL_BYTES_PER_VALUE)
    if soundtrack_rate_hz is not None:
        per_medium += int(max_soundtrack_seconds * soundtrack_rate_hz) * SOUNDTRACK_BYTES_PER_SAMPLE
    return media * per_medium + values * PROCESSOR_BYTES_PER_VALUE


def memory_full(needed: int) -> str:
    """The busy sentence of a request the byte budget has no room for now."""
    return (
        "The server is holding as many videos as its memory allows right now (this request may need "
        f"{needed / MB:,.0f} MB more); please try again in a minute, or choose fewer frames or fewer pixels per frame."
    )


def too_large_alone(needed: int, budget: int) -> str:
    return (
        f"These videos and pictures may take {needed / MB:,.0f} MB of the server's memory once read, more than the "
        f"{budget / MB:,.0f} MB it holds for every waiting request together: send fewer of them, or choose fewer "
        "frames or fewer pixels per frame."
    )


class Admission:
    """The queue slots and the byte budget of one engine; thread-safe."""

    def __init__(self, max_queue: int, budget_bytes: int):
        self.max_queue, self.budget_bytes = max_queue, budget_bytes
        self._lock = threading.Lock()
        self._queued = 0
        self._held = 0

    @property
    def queued(self) -> int:
        """Requests holding a queue slot."""
        return self._queued

    @property
    def held_bytes(self) -> int:
        """Host bytes counted for the requests admitted and not yet past their vision forward."""
        return self._held

    def take(self, needed_bytes: int) -> "Ticket":
        """A queue slot and `needed_bytes` of the budget, or BusyError (InputError when the request alone is more
        than the whole budget)."""
        if needed_bytes > self.budget_bytes:
            raise InputError(too_large_alone(needed_bytes, self.budget_bytes))
        with self._lock:
            if self._queued >= self.max_queue:
                raise BusyError(QUEUE_FULL)
            if self._held + needed_bytes > self.budget_bytes:
                raise BusyError(memory_full(needed_bytes))
            self._queued += 1
            self._held += needed_bytes
        return Ticket(self, needed_bytes)

    def _give_back(self, slots: int, nbytes: int) -> None:
        with self._lock:
            self._queued -= slots
            self._held -= nbytes


class Ticket:
    """One request's share of its engine's admission: a queue slot until `leave_queue`, and bytes until
    `release_bytes`. Each is given back once, however often it is called; `close` gives back both."""

    def __init__(self, admission: Admission, nbytes: int):
        self._admission = admission
        self._lock = threading.Lock()
        self._slot = 1
        self.nbytes = nbytes
        self._released = False

    def leave_queue(self) -> None:
        """The worker took the request (or it ended early): its queue slot goes back."""
        with self._lock:
            slot, self._slot = self._slot, 0
        self._admission._give_back(slot, 0)

    def settle(self, actual_bytes: int) -> None:
        """What the request holds once prepared, in place of the estimate: less (the processor's working copies
        are gone, and a short clip has fewer frames than its sampling allows), so that later requests may come in."""
        with self._lock:
            if self._released:
                return
            change, self.nbytes = actual_bytes - self.nbytes, actual_bytes
        self._admission._give_back(0, -change)

    def release_bytes(self) -> None:
        """The request's frames and pixels are dropped: its bytes go back."""
        with self._lock:
            nbytes, self.nbytes, self._released = self.nbytes, 0, True
        self._admission._give_back(0, nbytes)

    def close(self) -> None:
        self.leave_queue()
        self.release_bytes()
