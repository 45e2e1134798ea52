"""An upload's soundtrack as the model hears it, and how it crosses the reader's pipe.

A reader process (engine/reading/reader_process.py) reads it with engine/reading/decoders/pyav_soundtrack.py; the
engine's process gets it back through engine/reading/pool.py and hands it to the processor (engine/prompt/audio.py).
This module is numpy only, so the engine's process, which never imports PyAV, can hold it.
"""

from dataclasses import dataclass

import numpy as np

# The samples' type on the pipe: float32, little-endian whatever the machine (the readers' and the engine's are one).
SAMPLE_DTYPE = np.dtype("<f4")


@dataclass(frozen=True)
class Soundtrack:
    """One upload's soundtrack: its first audio stream, from the stream's start, one channel.

    samples: (n,) float32 mono at rate_hz; not clipped to [-1, 1]: FFmpeg's downmix adds the channels (each
    front one times 1/sqrt(2)), and the feature extractor normalises every mel bin, so the scale never reaches
    the model. cut: True when the stream went on past the bound the read was given, so that only its first n
    samples are here.
    """

    samples: np.ndarray
    rate_hz: int
    cut: bool

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.rate_hz


def soundtrack_message(soundtrack: Soundtrack) -> tuple[dict, np.ndarray]:
    """(header fields, payload) for the reader's pipe: the fields describe the samples, which travel as raw
    little-endian float32 bytes (4 a sample) after the frames' bytes."""
    samples = np.ascontiguousarray(soundtrack.samples, dtype=SAMPLE_DTYPE)
    return {"samples": len(samples), "rate_hz": soundtrack.rate_hz, "cut": soundtrack.cut}, samples


def soundtrack_from_message(fields: dict, payload) -> Soundtrack:
    """The Soundtrack that soundtrack_message described, from its fields and its payload (a buffer of exactly
    fields["samples"] float32 samples; read, not copied, unless it starts at an address a float32 may not be
    read from: the samples follow the frames on the pipe, whose bytes may be any number); ValueError when they
    disagree."""
    samples = np.frombuffer(payload, dtype=SAMPLE_DTYPE)
    if len(samples) != fields["samples"] or fields["rate_hz"] <= 0:
        raise ValueError("the soundtrack's bytes do not match its header")
    return Soundtrack(np.require(samples, requirements=["ALIGNED"]), int(fields["rate_hz"]), bool(fields["cut"]))
