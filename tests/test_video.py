"""Video upload checks and frame sampling, on small clips made by assets.clips (real decodes).

Codecs, containers, variable frame rates and rotation: tests/test_video_formats.py. How the decoder seeks
and skips: tests/test_video_decoding.py.
"""

import hashlib
import math
import shutil
import time
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from assets.clips import write_clip
from engine.config import EngineConfig, FrameSampling
from engine.errors import NO_VIDEO, InputError
from engine.reading import pool as reader_pool
from engine.reading.frame_sampling import fit_pixels, sample_by_time, sample_frame_indices
from engine.reading.video import (
    OUT_OF_MEMORY,
    TOO_SLOW,
    UNREADABLE,
    duration_pair,
    file_sha256,
    read_video,
    size_pair,
)
from reader_processes import alive, faulty_program

LIMITS = dict(max_seconds=600.0, max_bytes=200 * 1024 * 1024, timeout_s=30.0)
DEFAULT_SAMPLING = FrameSampling()


def _load(path, sampling=DEFAULT_SAMPLING, **overrides):
    return read_video(path, sampling, **{**LIMITS, **overrides})


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clips")
    return {kind: write_clip(folder / f"{kind}.mp4", kind) for kind in ("moving_object", "scene_cut")}


# (clip seconds, clip fps, sampling fps, max_frames, temporal_patch) -> sampled frame count
@pytest.mark.parametrize(
    "seconds, clip_fps, fps, max_frames, patch, expected",
    [
        (4.0, 8, 2.0, 32, 2, 8),  # round(4 s * 2 fps)
        (4.0, 8, 2.0, 5, 2, 4),  # max_frames 5 rounds down to 4
        (3.0, 5, 3.0, 32, 2, 8),  # round(9) = 9 rounds down to 8
        (1.0, 3, 10.0, 32, 2, 2),  # only 3 source frames: 2
        (1.5, 2, 0.5, 32, 2, 2),  # round(0.75) = 1 is raised to the patch
        (4.0, 8, 2.0, 7, 4, 4),  # patch 4: max 7 rounds down to 4
    ],
)
def test_sampled_frame_count_and_metadata(tmp_path, seconds, clip_fps, fps, max_frames, patch, expected):
    path = write_clip(tmp_path / "clip.mp4", "moving_object", seconds=seconds, fps=clip_fps)
    sampling = FrameSampling(fps=fps, max_frames=max_frames)
    video = _load(path, sampling, temporal_patch=patch)
    total = round(seconds * clip_fps)
    assert video.frames.shape == (expected, 120, 160, 3)
    assert video.frames.dtype == np.uint8
    assert video.frame_indices == [int(i) for i in np.linspace(0, total - 1, expected).round()]
    assert video.total_frames == total
    assert video.native_fps == pytest.approx(clip_fps)
    assert video.duration_s == pytest.approx(seconds)
    # A constant-rate file: each frame's container time is its index / fps.
    assert video.timestamps_s == pytest.approx([i / clip_fps for i in video.frame_indices], abs=1e-9)
    assert video.sampled_fps == pytest.approx(expected / seconds)


def test_single_frame_clip_repeats_its_frame(tmp_path):
    path = write_clip(tmp_path / "one.mp4", "static", seconds=0.125, fps=8)
    video = _load(path)
    assert video.total_frames == 1
    assert video.frame_indices == [0, 0]
    assert np.array_equal(video.frames[0], video.frames[1])


def test_frames_are_rgb_and_the_square_moves(clips):
    video = _load(clips["moving_object"], FrameSampling(fps=2.0))
    assert video.frame_indices == [0, 4, 9, 13, 18, 22, 27, 31]
    red = (video.frames[..., 0] > 170) & (video.frames[..., 1] < 80) & (video.frames[..., 2] < 80)
    assert red.any(axis=(1, 2)).all(), "every frame shows the red square (R first: RGB, not BGR)"
    # Sky at the top is blue: B > R there.
    assert (video.frames[:, :4, 40:, 2] > video.frames[:, :4, 40:, 0]).all()
    centre_x = [np.nonzero(mask.any(axis=0))[0].mean() for mask in red]
    assert all(b > a + 5 for a, b in zip(centre_x, centre_x[1:])), centre_x


def test_scene_cut_frames_differ_across_the_cut(clips):
    video = _load(clips["scene_cut"], FrameSampling(fps=2.0))
    frames = video.frames.astype(np.int16)
    cut = next(i for i, index in enumerate(video.frame_indices) if index >= video.total_frames // 2)
    same_scene = np.abs(frames[cut - 1] - frames[0]).mean()
    across_cut = np.abs(frames[cut] - frames[cut - 1]).mean()
    assert same_scene < 3 and across_cut > 40, (same_scene, across_cut)


@pytest.mark.parametrize("max_pixels", [4000, 160 * 120 - 1])
def test_frames_are_downscaled_to_the_pixel_cap(clips, max_pixels):
    video = _load(clips["moving_object"], FrameSampling(max_pixels_per_frame=max_pixels))
    _, height, width, _ = video.frames.shape
    assert height * width <= max_pixels
    assert abs(width / height - 160 / 120) < 0.05
    assert height * width > 0.9 * max_pixels


def test_frames_are_never_upscaled(clips):
    video = _load(clips["moving_object"], FrameSampling(max_pixels_per_frame=10**7))
    assert video.frames.shape[1:] == (120, 160, 3)


def test_content_hash_is_sha256_of_the_bytes(tmp_path, clips):
    copy = shutil.copy(clips["moving_object"], tmp_path / "copy.mp4")
    expected = hashlib.sha256(clips["moving_object"].read_bytes()).hexdigest()
    assert file_sha256(copy) == expected
    assert _load(copy).content_hash == expected == _load(clips["moving_object"]).content_hash
    assert _load(clips["scene_cut"]).content_hash != expected


@pytest.mark.parametrize("path", [None, "", "/nonexistent/clip.mp4"])
def test_missing_file(path):
    with pytest.raises(InputError, match=f"^{NO_VIDEO}$"):
        _load(path)


def _garbage(path):
    path.write_bytes(bytes(range(256)) * 40)


def _png(path):
    Image.fromarray(np.full((64, 64, 3), 128, np.uint8)).save(path, format="PNG")


def _text(path):
    path.write_text("This is a text file, not a video.\n" * 20)


def _truncated(path):
    write_clip(path.with_suffix(".full.mp4"), "pan")
    path.write_bytes(path.with_suffix(".full.mp4").read_bytes()[:15000])


@pytest.mark.parametrize("make", [_garbage, _png, _text, _truncated])
def test_unreadable_files(tmp_path, make):
    path = tmp_path / "upload.mp4"
    make(path)
    with pytest.raises(InputError, match=f"^{UNREADABLE}$"):
        _load(path)


def test_too_large_is_checked_before_decoding(tmp_path):
    path = tmp_path / "big.mp4"
    with open(path, "wb") as f:
        f.truncate(3 * 1024 * 1024)  # sparse: costs no disk
    with pytest.raises(InputError, match=r"^The file is 3 MB; the limit is 2 MB\.$"):
        _load(path, max_bytes=2 * 1024 * 1024)


def test_too_long(clips):
    with pytest.raises(InputError, match=r"^The video is 4 seconds long; the limit is 1 second\.$"):
        _load(clips["moving_object"], max_seconds=1.0)


def _slow_clip(path, hours: float, seconds_per_frame: int = 30):
    """A `hours`-long 64x48 H.264 clip with one frame every `seconds_per_frame` s: long, yet quick to make.
    Frame k is grey level k % 256, so a decoded frame tells which one it is."""
    count = round(hours * 3600 / seconds_per_frame)
    with av.open(str(path), mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=Fraction(1, seconds_per_frame))
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        stream.options = {"preset": "ultrafast", "qp": "0"}
        for k in range(count):
            grey = np.full((48, 64, 3), k % 256, np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(grey, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def test_long_video_is_sampled_over_its_whole_length(tmp_path):
    """2.5 hours, under the default 3-hour limit: 32 frames spread from the first second to the last,
    at the rate they actually cover (32 / 9,000 s), each the frame shown at its time."""
    path = _slow_clip(tmp_path / "lecture.mp4", hours=2.5)
    video = _load(path, FrameSampling(fps=2.0, max_frames=32), max_seconds=EngineConfig().max_video_seconds)
    assert video.duration_s == pytest.approx(9000.0) and video.total_frames == 300
    assert video.sampled_fps == pytest.approx(32 / 9000.0)
    assert video.frame_indices == [int(i) for i in np.linspace(0, 299, 32).round()]
    assert video.timestamps_s == pytest.approx([30.0 * i for i in video.frame_indices])
    assert video.timestamps_s[-1] == pytest.approx(8970.0)
    # qp 0 keeps each picture's grey level, its frame number, to the RGB <-> YUV rounding.
    greys = np.array([int(frame[24, 32, 0]) for frame in video.frames])
    assert np.abs(greys - np.array(video.frame_indices) % 256).max() <= 2, greys


def test_longer_than_the_default_limit(tmp_path):
    path = _slow_clip(tmp_path / "marathon.mp4", hours=3.5, seconds_per_frame=60)
    assert EngineConfig().max_video_seconds == 3 * 3600
    with pytest.raises(InputError, match=r"^The video is 3\.5 hours long; the limit is 3 hours\.$"):
        _load(path, max_seconds=EngineConfig().max_video_seconds)


def test_frames_too_large_before_resizing(tmp_path, clips):
    """Checked on the stored frame size before decoding: 160x120 passes a 160*120 limit, not one below."""
    assert _load(clips["moving_object"], max_source_pixels=160 * 120).frames.shape[0] == 8
    sentence = r"^The video's frames are 160x120 \(0\.1 megapixels\); the limit is 0 megapixels\.$"
    with pytest.raises(InputError, match=sentence):
        _load(clips["moving_object"], max_source_pixels=160 * 120 - 1)


def test_8k_is_refused_by_default(tmp_path):
    path = tmp_path / "8k.mp4"
    with av.open(str(path), mode="w", format="mp4") as container:  # one flat grey frame: quick to make
        stream = container.add_stream("libx264", rate=Fraction(4))
        stream.width, stream.height, stream.pix_fmt = 7680, 4320, "yuv420p"
        stream.options = {"preset": "ultrafast", "threads": "1"}
        grey = av.VideoFrame.from_ndarray(np.full((4320 * 3 // 2, 7680), 128, np.uint8), format="yuv420p")
        for packet in [*stream.encode(grey), *stream.encode()]:
            container.mux(packet)
    assert EngineConfig().max_video_source_pixels == 4096 * 2160
    sentence = r"^The video's frames are 7680x4320 \(33\.2 megapixels\); the limit is 8\.8 megapixels\.$"
    with pytest.raises(InputError, match=sentence):
        _load(path)


def test_reader_memory_is_capped(tmp_path):
    """32 frames of 1280x720 kept whole need 88 MB on top of the ~100 MB a reader process starts with:
    a 200 MB cap is a sentence, not a crash; the default cap reads the same request."""
    path = write_clip(
        tmp_path / "hd.mp4",
        "pan",
        seconds=4.0,
        fps=8,
        size=(1280, 720),
        options={"preset": "ultrafast", "threads": "1"},
    )
    sampling = FrameSampling(fps=8.0, max_frames=32, max_pixels_per_frame=1280 * 720)
    with pytest.raises(InputError, match=f"^{OUT_OF_MEMORY}$"):
        _load(path, sampling, memory_bytes=200 << 20)
    assert _load(path, sampling).frames.shape == (32, 720, 1280, 3)


def test_size_and_duration_wording():
    assert size_pair(int(312.4 * 2**20), 200 * 2**20) == ("312.4 MB", "200 MB")
    assert size_pair(200 * 2**20 + 1, 200 * 2**20) == ("200.1 MB", "200 MB")
    assert size_pair(3000, 2048) == ("3 KB", "2 KB")
    assert duration_pair(750.0, 600.0) == ("12.5 minutes", "10 minutes")
    assert duration_pair(600.5, 600.0) == ("10.1 minutes", "10 minutes")
    assert duration_pair(90.0, 60.0) == ("1.5 minutes", "1 minute")
    assert duration_pair(2.3, 2.0) == ("2.3 seconds", "2 seconds")
    assert duration_pair(12600.0, 10800.0) == ("3.5 hours", "3 hours")
    assert duration_pair(3601.0, 3600.0) == ("1.1 hours", "1 hour")


def test_timeout(clips):
    with pytest.raises(InputError, match=f"^{TOO_SLOW}$"):
        _load(clips["moving_object"], timeout_s=0.001)


def _faulty_copy(clip, folder, prefix: str):
    """A valid clip under a name that makes tests/reader_processes.py's faulty reader misbehave."""
    path = folder / f"{prefix}{clip.name}"
    shutil.copyfile(clip, path)
    return path


@pytest.fixture
def faulty_readers(monkeypatch):
    monkeypatch.setattr(reader_pool, "READER_PROGRAM", faulty_program())


def test_hung_reader_is_killed_and_server_survives(tmp_path, faulty_readers, clips):
    path = _faulty_copy(clips["moving_object"], tmp_path, "hang_")
    start = time.monotonic()
    with pytest.raises(InputError, match=f"^{TOO_SLOW}$"):
        _load(path, timeout_s=3.0)
    assert time.monotonic() - start < 60  # a hang, not a speed: TOO_SLOW says the 3 s timeout fired
    assert not alive(int(Path(f"{path}.child").read_text()))  # killed and reaped
    assert _load(clips["moving_object"]).frames.shape[0] == 8


def test_crashed_reader_is_unreadable_and_server_survives(tmp_path, faulty_readers, clips):
    path = _faulty_copy(clips["moving_object"], tmp_path, "crash_")
    with pytest.raises(InputError, match=f"^{UNREADABLE}$"):
        _load(path)
    assert Path(f"{path}.child").exists()
    assert _load(clips["moving_object"]).frames.shape[0] == 8


def test_garbled_answer_is_unreadable(tmp_path, faulty_readers, clips):
    path = _faulty_copy(clips["moving_object"], tmp_path, "garbled_")
    with pytest.raises(InputError, match=f"^{UNREADABLE}$"):
        _load(path)
    assert Path(f"{path}.child").exists()


@given(
    duration_s=st.floats(0.01, 3600.0),
    fps=st.floats(0.1, 30.0),
    total_frames=st.integers(1, 100_000),
    max_frames=st.integers(1, 200),
    patch=st.integers(1, 4),
)
def test_sampling_rule(duration_s, fps, total_frames, max_frames, patch):
    sampling = FrameSampling(fps=fps, max_frames=max_frames)
    indices = sample_frame_indices(duration_s, total_frames, sampling, patch)
    wanted = min(max(round(duration_s * fps), patch), max_frames) // patch * patch
    available = total_frames // patch * patch
    assert len(indices) == max(patch, min(wanted, available))
    assert all(0 <= i < total_frames for i in indices)
    assert indices == sorted(indices)
    assert indices[0] == 0
    if len(indices) > 1:
        assert indices[-1] == total_frames - 1
    if len(indices) <= total_frames:
        assert len(set(indices)) == len(indices)


@given(
    total_frames=st.integers(1, 5000),
    count=st.integers(1, 64),
    step=st.integers(1, 3000),
    start=st.integers(-(10**6), 10**9),
)
def test_sampling_by_time_at_a_constant_rate_is_sampling_by_index(total_frames, count, step, start):
    """Frames every `step` ticks from any start (an MPEG-TS clock, an edit list): the same frames as
    spacing the indices evenly."""
    times = start + step * np.arange(total_frames, dtype=np.int64)
    picked = sample_by_time(times, count)
    if count > total_frames:
        assert picked == list(range(total_frames)) + [total_frames - 1] * (count - total_frames)
        return
    positions = np.linspace(0, total_frames - 1, count)
    by_index = sample_frame_indices(total_frames, total_frames, FrameSampling(fps=1.0, max_frames=count), 1)
    assert len(by_index) == count
    for ordinal, index, position in zip(picked, by_index, positions):
        halfway = abs(position % 1 - 0.5) < 1e-6
        # Halfway between two frames both are nearest: by time the earlier, by index numpy's even one.
        assert ordinal == (math.floor(position) if halfway else index), (ordinal, index, position)


@given(gaps=st.lists(st.integers(1, 1000), min_size=1, max_size=300), count=st.integers(2, 64))
def test_sampling_by_time_picks_the_frame_nearest_each_time(gaps, count):
    times = np.concatenate([[0], np.cumsum(gaps)])
    if count > len(times):
        return
    picked = sample_by_time(times, count)
    targets = np.linspace(0, times[-1], count)
    assert picked == sorted(picked) and picked[0] == 0 and picked[-1] == len(times) - 1
    for ordinal, target in zip(picked, targets):
        nearest = np.abs(times - target).min()
        assert abs(times[ordinal] - target) <= nearest + 1e-6 * max(1.0, target)


@given(height=st.integers(1, 4000), width=st.integers(1, 4000), max_pixels=st.integers(1, 10**7))
def test_fit_pixels(height, width, max_pixels):
    fit_h, fit_w = fit_pixels(height, width, max_pixels)
    if height * width <= max_pixels:
        assert (fit_h, fit_w) == (height, width)
    else:
        assert 1 <= fit_h <= height and 1 <= fit_w <= width
        assert fit_h * fit_w <= max_pixels


# --- against decord, the decoder the engine used before PyAV --------------------------------------


def test_av1_which_decord_cannot_read_is_decoded(tmp_path):
    path = write_clip(
        tmp_path / "av1.mp4",
        "moving_object",
        seconds=2.0,
        fps=8,
        size=(160, 120),
        codec="libsvtav1",
        options={"preset": "12"},
    )
    decord = pytest.importorskip("decord")
    with pytest.raises(decord.DECORDError):
        decord.VideoReader(str(path)).get_batch([0]).asnumpy()  # decord 0.6 has no AV1 decoder
    video = _load(path, FrameSampling(fps=2.0, max_frames=32))
    assert video.frames.shape == (4, 120, 160, 3)
    assert video.frame_indices == [0, 5, 10, 15] and video.total_frames == 16 and video.native_fps == 8.0


@pytest.mark.parametrize("max_pixels", [224 * 224, 64 * 48])
def test_decord_reads_the_same_pictures_at_the_sampled_frames(clips, max_pixels):
    """An independent reader (decord, by frame index) agrees with the engine's frames and sizes."""
    decord = pytest.importorskip("decord")
    sampling = FrameSampling(fps=2.0, max_frames=32, max_pixels_per_frame=max_pixels)
    video = _load(clips["moving_object"], sampling)
    _, height, width, _ = video.frames.shape
    reader = decord.VideoReader(str(clips["moving_object"]), width=width, height=height)
    assert len(reader) == video.total_frames and reader.get_avg_fps() == pytest.approx(video.native_fps)
    reference = reader.get_batch(video.frame_indices).asnumpy()
    # Two decoders, two RGB conversions and scalers: the same pictures within a few grey levels.
    difference = np.abs(video.frames.astype(np.int16) - reference.astype(np.int16))
    assert difference.mean() < 4.0, difference.mean()
