"""Video upload checks and frame sampling, on small clips made by assets.clips (real decodes)."""

import hashlib
import os
import shutil
import sys
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from assets.clips import write_clip
from engine.config import SamplingParams
from engine.errors import InputError
from engine.video import (
    MISSING,
    TOO_SLOW,
    UNREADABLE,
    _duration_pair,
    _size_pair,
    file_sha256,
    fit_pixels,
    load_video,
    sample_frame_indices,
)

LIMITS = dict(max_seconds=600.0, max_bytes=200 * 1024 * 1024, timeout_s=30.0)


def _load(path, sampling=SamplingParams(), **overrides):
    return load_video(path, sampling, **{**LIMITS, **overrides})


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
    sampling = SamplingParams(fps=fps, max_frames=max_frames)
    video = _load(path, sampling, temporal_patch=patch)
    total = round(seconds * clip_fps)
    assert video.frames.shape == (expected, 120, 160, 3)
    assert video.frames.dtype == np.uint8
    assert video.frame_indices == [int(i) for i in np.linspace(0, total - 1, expected).round()]
    assert video.total_frames == total
    assert video.native_fps == pytest.approx(clip_fps)
    assert video.duration_s == pytest.approx(seconds)


def test_single_frame_clip_repeats_its_frame(tmp_path):
    path = write_clip(tmp_path / "one.mp4", "static", seconds=0.125, fps=8)
    video = _load(path)
    assert video.total_frames == 1
    assert video.frame_indices == [0, 0]
    assert np.array_equal(video.frames[0], video.frames[1])


def test_frames_are_rgb_and_the_square_moves(clips):
    video = _load(clips["moving_object"], SamplingParams(fps=2.0))
    assert video.frame_indices == [0, 4, 9, 13, 18, 22, 27, 31]
    red = (video.frames[..., 0] > 170) & (video.frames[..., 1] < 80) & (video.frames[..., 2] < 80)
    assert red.any(axis=(1, 2)).all(), "every frame shows the red square (R first: RGB, not BGR)"
    # Sky at the top is blue: B > R there.
    assert (video.frames[:, :4, 40:, 2] > video.frames[:, :4, 40:, 0]).all()
    centre_x = [np.nonzero(mask.any(axis=0))[0].mean() for mask in red]
    assert all(b > a + 5 for a, b in zip(centre_x, centre_x[1:])), centre_x


def test_scene_cut_frames_differ_across_the_cut(clips):
    video = _load(clips["scene_cut"], SamplingParams(fps=2.0))
    frames = video.frames.astype(np.int16)
    cut = next(i for i, index in enumerate(video.frame_indices) if index >= video.total_frames // 2)
    same_scene = np.abs(frames[cut - 1] - frames[0]).mean()
    across_cut = np.abs(frames[cut] - frames[cut - 1]).mean()
    assert same_scene < 3 and across_cut > 40, (same_scene, across_cut)


@pytest.mark.parametrize("max_pixels", [4000, 160 * 120 - 1])
def test_frames_are_downscaled_to_the_pixel_cap(clips, max_pixels):
    video = _load(clips["moving_object"], SamplingParams(max_pixels_per_frame=max_pixels))
    _, height, width, _ = video.frames.shape
    assert height * width <= max_pixels
    assert abs(width / height - 160 / 120) < 0.05
    assert height * width > 0.9 * max_pixels


def test_frames_are_never_upscaled(clips):
    video = _load(clips["moving_object"], SamplingParams(max_pixels_per_frame=10**7))
    assert video.frames.shape[1:] == (120, 160, 3)


def test_content_hash_is_sha256_of_the_bytes(tmp_path, clips):
    copy = shutil.copy(clips["moving_object"], tmp_path / "copy.mp4")
    expected = hashlib.sha256(clips["moving_object"].read_bytes()).hexdigest()
    assert file_sha256(copy) == expected
    assert _load(copy).content_hash == expected == _load(clips["moving_object"]).content_hash
    assert _load(clips["scene_cut"]).content_hash != expected


@pytest.mark.parametrize("path", [None, "", "/nonexistent/clip.mp4"])
def test_missing_file(path):
    with pytest.raises(InputError, match=f"^{MISSING}$"):
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
    with pytest.raises(InputError, match=r"^The video is 3 MB; the limit is 2 MB\.$"):
        _load(path, max_bytes=2 * 1024 * 1024)


def test_too_long(clips):
    with pytest.raises(InputError, match=r"^The video is 4 seconds long; the limit is 1 second\.$"):
        _load(clips["moving_object"], max_seconds=1.0)


def test_size_and_duration_wording():
    assert _size_pair(int(312.4 * 2**20), 200 * 2**20) == ("312.4 MB", "200 MB")
    assert _size_pair(200 * 2**20 + 1, 200 * 2**20) == ("200.1 MB", "200 MB")
    assert _size_pair(3000, 2048) == ("3 KB", "2 KB")
    assert _duration_pair(750.0, 600.0) == ("12.5 minutes", "10 minutes")
    assert _duration_pair(600.5, 600.0) == ("10.1 minutes", "10 minutes")
    assert _duration_pair(90.0, 60.0) == ("1.5 minutes", "1 minute")
    assert _duration_pair(2.3, 2.0) == ("2.3 seconds", "2 seconds")


def test_timeout(clips):
    with pytest.raises(InputError, match=f"^{TOO_SLOW}$"):
        _load(clips["moving_object"], timeout_s=0.001)


def _fake_python(tmp_path, monkeypatch, body: str):
    """Make the decoder child a shell script: stands in for a file that hangs or crashes the decoder."""
    script = tmp_path / "fake_python.sh"
    script.write_text(f"#!/bin/sh\necho $$ > {tmp_path / 'child.pid'}\n{body}\n")
    script.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(script))
    return tmp_path / "child.pid"


def test_hung_decoder_is_killed_and_server_survives(tmp_path, monkeypatch, clips):
    pid_file = _fake_python(tmp_path, monkeypatch, "exec sleep 60")
    start = time.monotonic()
    with pytest.raises(InputError, match=f"^{TOO_SLOW}$"):
        _load(clips["moving_object"], timeout_s=1.0)
    assert time.monotonic() - start < 5
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(int(pid_file.read_text()), 0)
    monkeypatch.undo()
    assert _load(clips["moving_object"]).frames.shape[0] == 8


def test_crashed_decoder_is_unreadable_and_server_survives(tmp_path, monkeypatch, clips):
    _fake_python(tmp_path, monkeypatch, "kill -SEGV $$")
    with pytest.raises(InputError, match=f"^{UNREADABLE}$"):
        _load(clips["moving_object"])
    monkeypatch.undo()
    assert _load(clips["moving_object"]).frames.shape[0] == 8


def test_garbled_answer_is_unreadable(tmp_path, monkeypatch, clips):
    _fake_python(tmp_path, monkeypatch, """printf '{"status": "ok", "shape": [2, 4, 4, 3]}\\nshort'""")
    with pytest.raises(InputError, match=f"^{UNREADABLE}$"):
        _load(clips["moving_object"])


@given(
    duration_s=st.floats(0.01, 3600.0),
    fps=st.floats(0.1, 30.0),
    total_frames=st.integers(1, 100_000),
    max_frames=st.integers(1, 200),
    patch=st.integers(1, 4),
)
def test_sampling_rule(duration_s, fps, total_frames, max_frames, patch):
    sampling = SamplingParams(fps=fps, max_frames=max_frames)
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


@given(height=st.integers(1, 4000), width=st.integers(1, 4000), max_pixels=st.integers(1, 10**7))
def test_fit_pixels(height, width, max_pixels):
    fit_h, fit_w = fit_pixels(height, width, max_pixels)
    if height * width <= max_pixels:
        assert (fit_h, fit_w) == (height, width)
    else:
        assert 1 <= fit_h <= height and 1 <= fit_w <= width
        assert fit_h * fit_w <= max_pixels


# --- the PyAV decoder, for what decord refuses ----------------------------------------------------

def test_av1_which_decord_cannot_read_is_decoded_by_pyav(tmp_path):
    path = write_clip(tmp_path / "av1.mp4", "moving_object", seconds=2.0, fps=8, size=(160, 120),
                      codec="libsvtav1", options={"preset": "12"})
    from decord import VideoReader

    with pytest.raises(Exception):
        VideoReader(str(path)).get_batch([0]).asnumpy()  # decord 0.6 has no AV1 decoder
    video = _load(path, SamplingParams(fps=2.0, max_frames=32))
    assert video.frames.shape == (4, 120, 160, 3)
    assert video.frame_indices == [0, 5, 10, 15] and video.total_frames == 16 and video.native_fps == 8.0


@pytest.mark.parametrize("max_pixels", [224 * 224, 64 * 48])
def test_pyav_and_decord_sample_the_same_frames(clips, max_pixels):
    from engine.video import _decode_with_decord, _decode_with_pyav

    sampling = SamplingParams(fps=2.0, max_frames=32, max_pixels_per_frame=max_pixels)
    decord_header, decord_frames = _decode_with_decord(str(clips["moving_object"]), sampling, 600.0, 2)
    pyav_header, pyav_frames = _decode_with_pyav(str(clips["moving_object"]), sampling, 600.0, 2)
    assert pyav_header == decord_header
    # Two decoders, two RGB conversions and scalers: the same pictures within a few grey levels.
    difference = np.abs(pyav_frames.astype(np.int16) - decord_frames.astype(np.int16))
    assert difference.mean() < 4.0, difference.mean()
