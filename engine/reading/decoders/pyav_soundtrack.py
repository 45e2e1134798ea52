"""Reading an upload's soundtrack with PyAV, in a reader process: its first audio stream, downmixed to one
channel of float32 samples at the rate the model's feature extractor takes (16,000 Hz for Nemotron-H Omni),
from the stream's start and for a bounded length.

It runs under the same per-file timeout and memory cap as the frames (engine/reading/reader_process.py), which is why it
imports numpy and PyAV only: the reader loads a bare `engine` package, without torch or transformers
(engine/reading/pool.py, READER_PROGRAM).

Samples are placed one after another as the decoder gives them: a gap in the stream's timestamps is not filled
with silence. The soundtrack is heard as one block beside the frames, not interleaved with them, so its length
and content matter, not each sample's time.
"""

import av
import numpy as np

from ..soundtrack import Soundtrack
from .pyav_video import open_without_video_probe

_PACKED_FLOAT32 = "flt"  # FFmpeg's name for packed float32 samples: one plane, read as SAMPLE_DTYPE


def read_soundtrack(path, rate_hz: int, max_seconds: float) -> Soundtrack | None:
    """The first audio stream of the file at `path`, mono float32 at `rate_hz` Hz, at most `max_seconds`
    seconds (int(max_seconds * rate_hz) samples) from its start; decoding stops once past that bound.

    None when the file has no audio stream, or its stream decodes to no sample (a track with no packets).
    A stream that does not decode raises PyAV's error (av.FFmpegError), as the frames' reading does.
    """
    if rate_hz <= 0 or max_seconds <= 0:
        raise ValueError("a soundtrack needs a rate and a length above 0")
    max_samples = int(max_seconds * rate_hz)
    with open_without_video_probe(str(path)) as container:  # the soundtrack needs no video frame
        if not container.streams.audio:
            return None
        pieces, count = [], 0
        mono = MonoResampler(rate_hz)
        for frame in container.decode(container.streams.audio[0]):
            for piece in mono.convert(frame):
                pieces.append(piece)
                count += len(piece)
            if count > max_samples:
                break
        else:  # the stream ended within the bound: what the resampler still holds belongs to it
            for piece in mono.flush():
                pieces.append(piece)
                count += len(piece)
    if count == 0:
        return None
    samples = np.concatenate(pieces)
    return Soundtrack(samples[:max_samples], rate_hz, cut=count > max_samples)


class MonoResampler:
    """Decoded audio frames -> mono float32 pieces at one rate, through PyAV's AudioResampler (FFmpeg's
    libswresample: downmix, resampling with its anti-aliasing filter, sample format).

    An AudioResampler is set up from its first frame and refuses a frame of another rate, layout or sample
    format; a stream may switch mid-way (a broadcast's 2.0 to 5.1, clips joined without re-encoding), so a
    switch flushes the resampler in use and starts another."""

    def __init__(self, rate_hz: int):
        self.rate_hz = rate_hz
        self._resampler = None
        self._source = None  # (sample format, layout, rate in Hz) of the frames the resampler was set up for

    def convert(self, frame: av.AudioFrame) -> list[np.ndarray]:
        source = (frame.format.name, frame.layout.name, frame.sample_rate)
        pieces = []
        if source != self._source:
            pieces = self.flush()
            # One-second output frames: the same samples, but not one array per decoded frame (25,840 of them
            # for 600 s of 44.1 kHz AAC, whose conversion took a sixth of the read).
            self._resampler = av.AudioResampler(
                format=_PACKED_FLOAT32, layout="mono", rate=self.rate_hz, frame_size=self.rate_hz
            )
            self._source = source
        return pieces + [_samples(out) for out in self._resampler.resample(frame)]

    def flush(self) -> list[np.ndarray]:
        if self._resampler is None:
            return []
        return [_samples(out) for out in self._resampler.resample(None)]


def _samples(frame: av.AudioFrame) -> np.ndarray:
    # A packed mono frame has one plane; to_ndarray copies it out of FFmpeg's buffer, shape (1, n).
    return frame.to_ndarray().reshape(-1)
