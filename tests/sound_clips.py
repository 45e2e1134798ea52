"""Clips with a soundtrack, muxed with PyAV (there may be no ffmpeg binary): H.264 video and an audio stream
from a numpy waveform, for the soundtrack's tests (tests/test_soundtrack.py, test_soundtrack_engine.py,
test_soundtrack_app.py, test_reader_pool.py, test_decoder_faults.py)."""

from fractions import Fraction
from pathlib import Path

import av
import numpy as np

SECONDS, FPS = 2.0, 10  # a clip's defaults: 20 frames of video, one every 0.1 s


def tone(hz: float, seconds: float, rate_hz: int, amplitude: float = 0.5) -> np.ndarray:
    return amplitude * np.sin(2 * np.pi * hz * np.arange(round(seconds * rate_hz)) / rate_hz)


def write_clip_with_sound(
    path: Path,
    waveform: np.ndarray | None,
    rate_hz: int = 0,
    *,
    container: str = "mp4",
    codec: str = "aac",
    seconds: float = SECONDS,
    keyframe_every: int | None = None,
) -> Path:
    """A `seconds`-long 64x48 H.264 clip at FPS, with waveform ((channels, n) float in [-1, 1], at rate_hz;
    one channel is mono, two stereo) encoded by `codec` as its audio stream, or none when waveform is None.
    keyframe_every: frames between keyframes (x264's own choice when None), so a reader pool can split it."""
    with av.open(str(path), mode="w", format=container) as output:
        video = output.add_stream("libx264", rate=Fraction(FPS))
        video.width, video.height, video.pix_fmt = 64, 48, "yuv420p"
        video.options = {
            "preset": "ultrafast",
            "threads": "1",
            **({"g": str(keyframe_every), "keyint_min": str(keyframe_every)} if keyframe_every else {}),
        }
        audio = None
        if waveform is not None:
            layout = "mono" if len(waveform) == 1 else "stereo"
            audio = output.add_stream(codec, rate=rate_hz, layout=layout)
        for index in range(round(seconds * FPS)):
            picture = np.full((48, 64, 3), index * 12 % 256, np.uint8)
            output.mux(video.encode(av.VideoFrame.from_ndarray(picture, format="rgb24")))
        output.mux(video.encode())
        if audio is not None:
            planar = np.ascontiguousarray(waveform, dtype=np.float32)
            frame = av.AudioFrame.from_ndarray(planar, format="fltp", layout=audio.layout.name)
            frame.sample_rate, frame.pts, frame.time_base = rate_hz, 0, Fraction(1, rate_hz)
            output.mux(audio.encode(frame))  # PyAV cuts it into the encoder's frame size and sample format
            output.mux(audio.encode())
    return path
