"""Live frames as they arrive from outside, checked before anything holds them: an array from the page's
streaming input, or a WebSocket frame message (docs/live.md, "WebSocket /v1/live"), whose JPEG or PNG is
decoded only once its header says it is small enough. Each refusal is an InputError with one sentence.

A frame message is one binary WebSocket message: the frame's capture time in seconds as an 8-byte
big-endian IEEE 754 double, then the image's bytes.
"""

import io
import math
import struct

import numpy as np
from PIL import JpegImagePlugin, PngImagePlugin

from engine.config import MAX_VIDEO_SOURCE_PIXELS
from engine.errors import InputError
from engine.reading.video import size_pair, too_many_pixels

# What a frame may be, by the bytes it starts with, and the reader of each.
OPENERS = ((b"\xff\xd8\xff", JpegImagePlugin.JpegImageFile), (b"\x89PNG\r\n\x1a\n", PngImagePlugin.PngImageFile))
# A frame message's image, compressed: a 4K JPEG at high quality is about 3 MB, a 4K PNG of a screen 5 MB.
MAX_FRAME_BYTES = 16 << 20
TIME_HEADER = struct.Struct(">d")

NOT_A_FRAME = "A frame must be an (H, W, 3) uint8 RGB image."
NOT_AN_IMAGE = "The frame is not a JPEG or PNG image."
BROKEN_IMAGE = "The frame's image data is damaged or cut short."
NO_TIME = "A frame message starts with its capture time: 8 bytes, a big-endian double, in seconds."
BAD_TIME = "A frame's capture time must be a finite number of seconds, 0 or more."


def check_frame(frame, max_pixels: int = MAX_VIDEO_SOURCE_PIXELS) -> np.ndarray:
    """`frame` when it is an (H, W, 3) uint8 array of at most max_pixels pixels; InputError otherwise."""
    if (
        not isinstance(frame, np.ndarray)
        or frame.dtype != np.uint8
        or frame.ndim != 3
        or frame.shape[2] != 3
        or 0 in frame.shape
    ):
        raise InputError(NOT_A_FRAME)
    height, width = frame.shape[:2]
    if height * width > max_pixels:
        raise InputError(too_many_pixels("The frame is", width, height, max_pixels))
    return frame


def check_time(t_s) -> float:
    """A capture time in seconds as a float: a finite real number, 0 or more (not a bool); InputError
    otherwise. That times increase is the live session's to check: it knows the last one."""
    if isinstance(t_s, bool) or not isinstance(t_s, (int, float)) or not math.isfinite(t_s) or t_s < 0:
        raise InputError(BAD_TIME)
    return float(t_s)


def decode_image(
    data: bytes, max_pixels: int = MAX_VIDEO_SOURCE_PIXELS, max_bytes: int = MAX_FRAME_BYTES
) -> np.ndarray:
    """JPEG or PNG bytes -> (H, W, 3) uint8 RGB. The size is read from the header first, so a small file
    that would decode to a huge image (a pixel bomb) is refused before any pixel is decoded; an alpha
    channel is dropped, grey and palette images become RGB."""
    if len(data) > max_bytes:
        size_text, limit_text = size_pair(len(data), max_bytes)
        raise InputError(f"The frame's image is {size_text}; the limit is {limit_text}.")
    opener = next((opener for magic, opener in OPENERS if data.startswith(magic)), None)
    if opener is None:
        raise InputError(NOT_AN_IMAGE)
    try:
        # The format's own reader reads the header only, without Image.open's bomb check, whose limit (89
        # megapixels, an error past twice that) is far above ours and would hide the frame's size.
        image = opener(io.BytesIO(data))
    except (OSError, ValueError, SyntaxError, struct.error):
        raise InputError(BROKEN_IMAGE) from None
    with image:
        width, height = image.size
        if width * height > max_pixels:
            raise InputError(too_many_pixels("The frame is", width, height, max_pixels))
        try:
            rgb = np.asarray(image.convert("RGB"))
        except (OSError, ValueError, SyntaxError):  # truncated or corrupt data, found while decoding
            raise InputError(BROKEN_IMAGE) from None
    return check_frame(rgb, max_pixels)


def frame_message(
    message: bytes, max_pixels: int = MAX_VIDEO_SOURCE_PIXELS, max_bytes: int = MAX_FRAME_BYTES
) -> tuple[np.ndarray, float]:
    """One binary frame message -> ((H, W, 3) uint8 RGB frame, capture time in seconds)."""
    if len(message) <= TIME_HEADER.size:
        raise InputError(NO_TIME)
    (t_s,) = TIME_HEADER.unpack_from(message)
    return decode_image(message[TIME_HEADER.size :], max_pixels, max_bytes), check_time(t_s)
