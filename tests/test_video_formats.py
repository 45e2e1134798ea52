"""What people upload: every common codec and container, variable frame rates, portrait phone clips.

Each file is made here with PyAV (the FFmpeg build the engine decodes with) from pictures whose content
says when they were shown: a red square that crosses the frame at constant speed over the clip's length.
So a decoded frame tells its own presentation time, and the test checks it against the time the engine
reports, and the engine's times against the ones written into the file.
"""

import re
from fractions import Fraction

import av
import numpy as np
import pytest

from engine.config import FrameSampling
from engine.prompt.unpruned import group_timestamps_s, processor_frame_positions, processor_inputs, unpruned_prompt
from engine.reading.video import read_video

SIZE = (160, 120)  # width, height
SIDE = SIZE[1] // 4  # the square's side
LIMITS = dict(max_seconds=600.0, max_bytes=200 * 1024 * 1024, timeout_s=60.0)
CONSTANT_8FPS = [Fraction(i, 8) for i in range(16)]  # 2 s: 16 frames at 8 fps
# 30 fps for 2 s, then 10 fps for 4 s: 100 frames, the last shown at 5.9 s.
VARIABLE = [Fraction(i, 30) for i in range(60)] + [Fraction(2) + Fraction(i, 10) for i in range(40)]


def picture(time_s: float, clip_s: float, size=SIZE) -> np.ndarray:
    """(H, W, 3) uint8: a blue-grey background with vertical bars, the red square's left edge at
    time_s / clip_s of the way across."""
    width, height = size
    frame = np.empty((height, width, 3), np.uint8)
    frame[:] = (40, 90, 160)
    frame[:, ::16] = (230, 230, 230)
    left = round(time_s / clip_s * (width - SIDE))
    top = (height - SIDE) // 2
    frame[top : top + SIDE, left : left + SIDE] = (220, 20, 30)
    return frame


def square_left(frame: np.ndarray) -> int:
    """Column of the red square's left edge in an upright (H, W, 3) frame."""
    red = (frame[..., 0] > 150) & (frame[..., 1] < 90) & (frame[..., 2] < 90)
    columns = np.nonzero(red.sum(axis=0) >= SIDE // 2)[0]
    assert len(columns), "no red square in the frame"
    return int(columns.min())


def write_video(
    path,
    container_format: str,
    codec: str,
    times_s: list[Fraction],
    *,
    size=SIZE,
    pix_fmt="yuv420p",
    options=None,
    codec_tag=None,
    rotation=None,
    audio=False,
    container_options=None,
):
    """Encode pictures shown at `times_s` (exact, as pts in a time base that holds them all)."""
    time_base = Fraction(1, int(np.lcm.reduce([t.denominator for t in times_s])))
    clip_s = float(times_s[-1])
    with av.open(str(path), mode="w", format=container_format, options=container_options or {}) as container:
        stream = container.add_stream(codec, rate=1 / time_base)
        stream.width, stream.height, stream.pix_fmt = *size, pix_fmt
        stream.codec_context.time_base = time_base
        stream.options = options or {}
        if codec_tag:
            stream.codec_tag = codec_tag
        if rotation is not None:
            stream.set_display_rotation(rotation)
        sound = container.add_stream("aac", rate=48000, layout="mono") if audio else None
        for time_s in times_s:
            frame = av.VideoFrame.from_ndarray(picture(float(time_s), clip_s, size), format="rgb24")
            frame.pts, frame.time_base = int(time_s / time_base), time_base
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
        if sound is not None:  # silence over the clip's length, interleaved by the muxer
            for start in range(0, round(clip_s * 48000), 1024):
                samples = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
                samples.sample_rate, samples.pts = 48000, start
                for packet in sound.encode(samples):
                    container.mux(packet)
            for packet in sound.encode():
                container.mux(packet)
    return path


def assert_frames_show_their_times(video, clip_s: float, width: int = SIZE[0]):
    """Each decoded picture's square sits where the reported time puts it (to 3 pixels: a frame at 8 fps
    moves it 8.7 pixels, at 30 fps 3.3 over 6 s)."""
    seen = [square_left(frame) for frame in video.frames]
    expected = [round(t / clip_s * (width - SIDE)) for t in video.timestamps_s]
    assert np.abs(np.array(seen) - np.array(expected)).max() <= 3, (seen, expected)


# (name, container, codec, extra write_video arguments)
CORPUS = [
    ("h264.mp4", "mp4", "libx264", {}),
    ("hevc_hvc1.mov", "mov", "libx265", {"codec_tag": "hvc1", "options": {"x265-params": "log-level=none"}}),
    (
        "hevc_10bit_hvc1.mov",
        "mov",
        "libx265",
        {"codec_tag": "hvc1", "pix_fmt": "yuv420p10le", "options": {"x265-params": "log-level=none"}},
    ),
    ("vp8.webm", "webm", "libvpx", {}),
    ("vp9.webm", "webm", "libvpx-vp9", {}),
    ("mpeg4.avi", "avi", "mpeg4", {}),
    ("av1.mp4", "mp4", "libsvtav1", {"options": {"preset": "10", "crf": "20"}}),  # 12 drops frames
    ("h264_with_audio.mkv", "matroska", "libx264", {"audio": True}),
    ("mjpeg.avi", "avi", "mjpeg", {"pix_fmt": "yuvj420p"}),
    ("h264_bframes.avi", "avi", "libx264", {"options": {"bf": "3"}}),  # AVI keeps no presentation times
    ("mpeg2.mpg", "mpeg", "mpeg2video", {"options": {"bf": "2"}}),  # DVD and camcorder program streams
    ("h264.flv", "flv", "libx264", {}),
    # What a browser's MediaRecorder writes: no duration, no cues to seek by.
    ("vp9_recorded.webm", "webm", "libvpx-vp9", {"container_options": {"live": "1"}}),
    # Fragmented MP4 (Safari's MediaRecorder, live streams): the index arrives fragment by fragment.
    ("h264_fragmented.mp4", "mp4", "libx264", {"container_options": {"movflags": "frag_keyframe+empty_moov"}}),
]


@pytest.mark.parametrize("name, container_format, codec, extra", CORPUS, ids=[row[0] for row in CORPUS])
def test_every_common_codec_is_answered(tmp_path, name, container_format, codec, extra):
    path = write_video(tmp_path / name, container_format, codec, CONSTANT_8FPS, **extra)
    video = read_video(path, FrameSampling(fps=4.0, max_frames=32), **LIMITS)
    assert video.frames.shape == (8, 120, 160, 3)  # 2 s at 4 fps
    assert video.total_frames == 16 and video.duration_s == pytest.approx(2.0)
    assert video.timestamps_s == pytest.approx([i / 8 for i in video.frame_indices], abs=1e-3)
    assert_frames_show_their_times(video, clip_s=15 / 8)


@pytest.mark.parametrize("container_format, suffix", [("mp4", "mp4"), ("matroska", "mkv")])
def test_variable_frame_rate_is_sampled_by_time(tmp_path, container_format, suffix):
    """30 fps, then 10 fps: frames evenly spaced in seconds (not in frame numbers, which would put 7 of
    12 samples in the first third), each with the time it is shown in the file."""
    path = write_video(tmp_path / f"vfr.{suffix}", container_format, "libx264", VARIABLE)
    video = read_video(path, FrameSampling(fps=2.0, max_frames=32), **LIMITS)
    assert video.total_frames == 100
    assert video.duration_s == pytest.approx(6.0, abs=0.07)  # the last frame lasts 1/30 or 1/10 s
    assert video.native_fps == pytest.approx(100 / video.duration_s)
    count = len(video.frames)
    assert count == 12 and video.sampled_fps == pytest.approx(count / video.duration_s)
    # Each frame's time is the one written for it (Matroska keeps milliseconds).
    written = [float(VARIABLE[i]) for i in video.frame_indices]
    assert video.timestamps_s == pytest.approx(written, abs=1e-3)
    # Evenly spaced from the first frame to the last, each within half a frame interval (at most 0.05 s).
    assert np.abs(np.array(video.timestamps_s) - np.linspace(0, 5.9, count)).max() <= 0.05 + 1e-3
    assert_frames_show_their_times(video, clip_s=5.9)


@pytest.mark.parametrize("rotation, quarter_turns", [(90, 1), (-90, 3), (180, 2)])
def test_phone_clips_are_upright(tmp_path, rotation, quarter_turns):
    """A portrait phone clip is stored landscape with a display matrix: frames come out as shown."""
    path = write_video(tmp_path / "portrait.mp4", "mp4", "libx264", CONSTANT_8FPS, rotation=rotation)
    video = read_video(path, FrameSampling(fps=4.0, max_frames=32), **LIMITS)
    upright = (160, 120) if quarter_turns % 2 else (120, 160)
    assert video.frames.shape[1:] == (*upright, 3)
    for frame, time_s in zip(video.frames, video.timestamps_s):
        shown = np.rot90(picture(time_s, 15 / 8), quarter_turns).astype(np.int16)
        assert np.abs(frame.astype(np.int16) - shown).mean() < 6


def test_variable_frame_rate_timestamps_reach_the_prompt(tmp_path, tiny_models):
    """Qwen3-VL's `<t seconds>` text shows each group's true time, and Qwen2.5-VL's seconds per temporal
    group follow the rate actually sampled."""
    path = write_video(tmp_path / "vfr.mp4", "mp4", "libx264", VARIABLE)
    video = read_video(path, FrameSampling(fps=2.0, max_frames=32, max_pixels_per_frame=64 * 64), **LIMITS)
    true_groups_s = [(a + b) / 2 for a, b in zip(video.timestamps_s[::2], video.timestamps_s[1::2])]
    # By frame number / average fps instead, the group at 2.4 s would read 3.8 s.
    by_index_s = [(a + b) / 2 / video.native_fps for a, b in zip(video.frame_indices[::2], video.frame_indices[1::2])]
    assert max(abs(a - b) for a, b in zip(true_groups_s, by_index_s)) > 0.5

    loaded, family = tiny_models("tiny-random")
    prompt = unpruned_prompt(loaded, family, video, "What moves?", [], "", 64 * 64)
    assert prompt.media[0].timestamps_s == pytest.approx(true_groups_s, abs=1e-9)
    text = loaded.processor.tokenizer.decode(prompt.input_ids)
    shown = [float(t) for t in re.findall(r"<([\d.]+) seconds>", text)]
    assert shown == [float(f"{t:.1f}") for t in true_groups_s]

    loaded25, family25 = tiny_models("tiny-random-qwen2.5-vl")
    inputs = processor_inputs(loaded25, video, family25.video_placeholder(), 64 * 64)
    assert float(inputs["second_per_grid_ts"][0]) == pytest.approx(2 / video.sampled_fps)


def test_constant_rate_prompts_keep_integer_frame_positions(tmp_path):
    """At a constant rate the processor gets the frame indices themselves, as before timestamps came from
    the container: prompts of such files are unchanged to the bit."""
    path = write_video(tmp_path / "cfr.mp4", "mp4", "libx264", [Fraction(i, 30) for i in range(90)])
    video = read_video(path, FrameSampling(fps=2.0, max_frames=32), **LIMITS)
    positions = processor_frame_positions(video)
    assert positions == video.frame_indices and all(isinstance(p, int) for p in positions)
    assert group_timestamps_s(positions, video.native_fps, 2) == [
        (a / 30 + b / 30) / 2 for a, b in zip(video.frame_indices[::2], video.frame_indices[1::2])
    ]
