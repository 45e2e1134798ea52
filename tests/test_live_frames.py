"""Live frames from outside (ui/live_frames.py): WebSocket frame messages decoded only when their header says
they are small enough, the page's arrays checked, each refusal one sentence; and the Live tab's feed
(ui/live_tab.py) timing what arrives."""

import io
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from engine.errors import InputError
from ui.live_feeds import LiveFeed
from ui.live_frames import (
    BAD_TIME,
    BROKEN_IMAGE,
    NO_TIME,
    NOT_A_FRAME,
    NOT_AN_IMAGE,
    check_frame,
    decode_image,
    frame_message,
)

ROOT = Path(__file__).resolve().parent.parent

# Smooth, so that a JPEG of it stays close: gradients and a square.
_Y, _X = np.mgrid[0:48, 0:64]
FRAME = np.dstack([_X * 4, _Y * 5, np.where((abs(_X - 32) < 10) & (abs(_Y - 24) < 10), 220, 40)]).astype(np.uint8)


def encoded(array: np.ndarray, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, fmt, **options)
    return out.getvalue()


def message(t_s: float, data: bytes) -> bytes:
    return struct.pack(">d", t_s) + data


def test_a_png_frame_message_gives_its_pixels_and_time():
    frame, t_s = frame_message(message(12.25, encoded(FRAME, "PNG")))
    assert t_s == 12.25 and frame.dtype == np.uint8 and np.array_equal(frame, FRAME)


def test_a_jpeg_frame_is_rgb_and_close_to_what_was_sent():
    frame = decode_image(encoded(FRAME, "JPEG", quality=95))
    assert frame.shape == (48, 64, 3) and np.abs(frame.astype(int) - FRAME).mean() < 3


def test_grey_and_transparent_images_become_rgb():
    grey = decode_image(encoded(FRAME[..., 0], "PNG"))
    assert grey.shape == (48, 64, 3) and np.array_equal(grey[..., 1], FRAME[..., 0])
    rgba = np.dstack([FRAME, np.full(FRAME.shape[:2], 7, np.uint8)])
    assert np.array_equal(decode_image(encoded(rgba, "PNG")), FRAME)


def jpeg_bomb(width: int, height: int) -> bytes:
    """A small baseline JPEG whose header says width x height: its SOF0 size fields rewritten, as a pixel
    bomb is made (the scan data that follows would never fill it)."""
    data = bytearray(encoded(FRAME, "JPEG"))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


# Run apart, its heap capped (RLIMIT_DATA) at what it holds once its modules are loaded plus 256 MB; under bare
# `engine` and `ui` packages, as the readers run, so that neither package's __init__ (torch, Gradio) loads.
BOMB_UNDER_A_CAP = """
import resource, struct, sys, types
for name in ("engine", "ui"):
    sys.modules[name] = types.ModuleType(name)
    sys.modules[name].__path__ = [name]
from engine.errors import InputError
from ui.live_frames import frame_message
bomb = sys.stdin.buffer.read()
held = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmData:"))
resource.setrlimit(resource.RLIMIT_DATA, (held + (256 << 20), resource.RLIM_INFINITY))
try:
    frame_message(struct.pack(">d", 1.0) + bomb)
except InputError as error:
    print(error)
"""


def test_a_20000_pixel_jpeg_bomb_is_refused_before_decoding():
    """Decoded, the bomb would take 1.2 GB; refused from its header, it fits under a cap of 256 MB more than
    the process holds once its modules are loaded."""
    bomb = jpeg_bomb(20_000, 20_000)
    assert len(bomb) < 10_000
    with pytest.raises(InputError) as refused:
        frame_message(message(1.0, bomb))
    assert str(refused.value) == "The frame is 20000x20000 (400 megapixels); the limit is 8.8 megapixels."
    capped = subprocess.run(
        [sys.executable, "-c", BOMB_UNDER_A_CAP], input=bomb, capture_output=True, cwd=ROOT, timeout=120
    )
    assert capped.stdout.decode().strip() == str(refused.value), capped.stderr.decode()[-2000:]


@pytest.mark.parametrize(
    "data, sentence",
    [
        (b"not an image at all", NOT_AN_IMAGE),
        (b"GIF89a" + bytes(64), NOT_AN_IMAGE),  # a real format, but not one a frame may be
        (encoded(FRAME, "PNG")[: len(encoded(FRAME, "PNG")) // 2], BROKEN_IMAGE),
        (encoded(FRAME, "JPEG")[: len(encoded(FRAME, "JPEG")) // 2], BROKEN_IMAGE),
    ],
)
def test_what_is_not_a_whole_jpeg_or_png_is_one_sentence(data, sentence):
    with pytest.raises(InputError) as refused:
        decode_image(data)
    assert str(refused.value) == sentence


def test_an_image_over_the_byte_limit_is_refused_unread():
    with pytest.raises(InputError) as refused:
        decode_image(b"\x89PNG" + bytes((2 << 20) - 4), max_bytes=1 << 20)
    assert str(refused.value) == "The frame's image is 2 MB; the limit is 1 MB."


@pytest.mark.parametrize("t_s", [float("nan"), float("inf"), -0.5])
def test_a_wrong_time_is_one_sentence(t_s):
    with pytest.raises(InputError) as refused:
        frame_message(message(t_s, encoded(FRAME, "PNG")))
    assert str(refused.value) == BAD_TIME


@pytest.mark.parametrize("data", [b"", b"\x00" * 8, b"\x01\x02"])
def test_a_message_without_its_time_and_image_is_one_sentence(data):
    with pytest.raises(InputError) as refused:
        frame_message(data)
    assert str(refused.value) == NO_TIME


@pytest.mark.parametrize(
    "frame", [FRAME.astype(np.float32), FRAME[..., 0], FRAME[..., :2], np.zeros((0, 4, 3), np.uint8), [[1, 2, 3]], None]
)
def test_an_array_that_is_not_an_rgb_frame_is_one_sentence(frame):
    with pytest.raises(InputError) as refused:
        check_frame(frame)
    assert str(refused.value) == NOT_A_FRAME


def test_the_feed_times_frames_from_the_first_and_counts_what_it_refuses():
    feed = LiveFeed(max_pixels=64 * 48)
    assert [feed.arrive(FRAME, now) for now in (100.0, 100.1, 100.25)] == pytest.approx([0.0, 0.1, 0.25])
    assert feed.arrive(np.zeros((100, 100, 3), np.uint8), 100.3) is None
    assert feed.frames == 3 and feed.refused == 1 and feed.size == (64, 48)
    assert feed.frames_per_s() == pytest.approx(2 / 0.25)
    assert "3 frames" in feed.status() and "1 refused: The frame is 100x100" in feed.status()
