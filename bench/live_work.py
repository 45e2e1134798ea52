"""What the live scenario (bench/live.py) plays: its sizes, the recording, its frames, and the quartiles its
figures are printed with."""

import statistics
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av

from assets.clips import write_clip
from engine import FrameSampling, GenerationParams

LIVE_FPS = 2.0  # the sessions' sampling, and the recording's rate: every frame is sampled
PACE_S = 1 / LIVE_FPS  # a pusher that pushes a frame later than this after its capture time has not kept pace
X264_FAST = {"preset": "ultrafast", "crf": "23", "threads": "0"}  # the recordings are input, not the subject


@dataclass(frozen=True)
class LiveWork:
    """moments_s: seconds into the stream a question is asked at. tail_s: seconds the recording runs past the last
    moment, played while that moment's questions are answered. size: (width, height) of the recording's frames.
    max_pixels_per_frame: the sessions' and the uploads' cap. session_s: seconds each real-time trial runs.
    max_sessions: the most sessions tried. new_tokens: per answer. questions: asked at each moment; uploads: of the
    recording cut at each moment (the medians of each are compared)."""

    moments_s: tuple[float, ...]
    size: tuple[int, int]
    max_pixels_per_frame: int
    session_s: float
    max_sessions: int
    new_tokens: int
    questions: int = 9
    uploads: int = 5
    tail_s: float = 60.0

    @property
    def sampling(self) -> FrameSampling:
        return FrameSampling(fps=LIVE_FPS, max_pixels_per_frame=self.max_pixels_per_frame)

    def params(self, q: float, skip: bool = False) -> GenerationParams:
        """A session's settings (and its questions'): rate q, the live sampling, new_tokens with EOS ignored, and
        skip: whether it skips still patches before the vision tower."""
        return GenerationParams(
            pruning_rate=q,
            max_new_tokens=self.new_tokens,
            ignore_eos=True,
            frame_sampling=self.sampling,
            skip_still_patches=skip,
        )


def recording(folder: Path, seconds: float, size: tuple[int, int], name: str = "recording") -> Path:
    """A `seconds`-long 2 fps H.264 recording of a moving object."""
    return write_clip(
        folder / f"{name}.mp4", "moving_object", seconds=seconds, fps=int(LIVE_FPS), size=size, options=X264_FAST
    )


def frames_of(path: Path):
    """(frame, capture time in seconds) of every frame of a file, decoded as they are needed."""
    with av.open(str(path)) as container:
        for frame in container.decode(video=0):
            yield frame.to_ndarray(format="rgb24"), float(frame.time)


def cut(path: Path, seconds: float, out: Path) -> Path:
    """The frames of `path` captured in its first `seconds`, encoded again as a file of their own: the recording a
    stream showed up to that moment, as an upload."""
    with av.open(str(out), mode="w", format="mp4") as container:
        stream = None
        for frame, time_s in frames_of(path):
            if time_s >= seconds - 1e-6:
                break
            if stream is None:
                stream = container.add_stream("libx264", rate=Fraction(int(LIVE_FPS)))
                stream.width, stream.height, stream.pix_fmt = frame.shape[1], frame.shape[0], "yuv420p"
                stream.options = X264_FAST
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile) of values (one value: itself three times)."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    low, middle, high = statistics.quantiles(values, n=4, method="inclusive")
    return low, middle, high
