"""Pictures with Pillow, run in a reader process (engine/reading/reader_process.py): whether an upload is a
picture at all, a still one's pixels, and an animated one's frames sampled by time as a video's are.

The kind of an upload is its content's, never its name's: a file Pillow reads with one frame is a still
picture; one with several (an animated GIF, WebP or PNG) is a video, read here because FFmpeg cannot decode
every one of them (animated WebP); anything Pillow does not recognise goes on to PyAV
(engine/reading/decoders/pyav_video.py). Nothing is decoded before the size as stored is checked against the limit,
so a decompression bomb (a small PNG that says 40,000 x 40,000) costs a header read.
"""

import warnings

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from engine.config import FrameSampling

from ..frame_sampling import fit_pixels, sample_by_time, sampled_frame_count

# The limit is the request's own (checked in `read_picture` before decoding), so Pillow's is turned off.
Image.MAX_IMAGE_PIXELS = None
# What a browser shows for a frame whose delay says 0 or 10 ms: 100 ms (animated GIFs rely on it).
SHORTEST_FRAME_MS = 20
DEFAULT_FRAME_MS = 100
# Modes of one channel with more than 8 bits a value: 16-bit grey (PNG, TIFF), 32-bit integers, 32-bit floats.
WIDE_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I", "F")
# Modes with an alpha channel, premultiplied ("La", "RGBa") or not.
ALPHA_MODES = ("RGBA", "LA", "PA", "La", "RGBa")
BACKGROUND = (255, 255, 255, 255)  # what a transparent picture is shown over: white, as a page shows it


def open_picture(path: str) -> Image.Image | None:
    """The upload opened by Pillow (its header read, nothing decoded), or None when it is not a picture."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return Image.open(path)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        return None


def read_picture(picture: Image.Image, request: dict) -> tuple[dict, np.ndarray | None]:
    """(header, frames) for a picture: a still one as "kind": "image" and its (1, H, W, 3) uint8 pixels scaled
    to fit max_pixels_per_frame; an animated one as "kind": "video", the answer a PyAV read gives (total_frames,
    duration_s, wanted, entries, shape). header["status"] "too_many_pixels" (with size and "kind": "picture") or
    "too_long" (with duration_s) refuses it before any pixel is decoded (max_picture_pixels: the most
    width*height as stored)."""
    width, height = picture.size
    if width <= 0 or height <= 0:
        return {"status": "unreadable"}, None
    if width * height > request["max_picture_pixels"]:
        return {"status": "too_many_pixels", "kind": "picture", "size": [width, height]}, None
    sampling = FrameSampling(**request["frame_sampling"])
    if getattr(picture, "n_frames", 1) > 1:
        return _animated(picture, sampling, request["max_seconds"], request["patch"])
    rgb = _upright_rgb(picture)
    fit_h, fit_w = fit_pixels(rgb.height, rgb.width, sampling.max_pixels_per_frame)
    pixels = np.asarray(_resized(rgb, fit_h, fit_w))[None]
    header = {
        "status": "ok",
        "kind": "image",
        "size": [width, height],
        "entries": [{"pts": 0, "ordinal": 0, "seconds": 0.0}],
        "shape": list(pixels.shape),
        "work": {},
    }
    return header, pixels


def _animated(
    picture: Image.Image, sampling: FrameSampling, max_seconds: float, patch: int
) -> tuple[dict, np.ndarray | None]:
    """An animated picture's frames sampled by time from their delays, as a video read answers them: each
    frame's "pts" is its ordinal."""
    count = picture.n_frames
    starts_s, elapsed = [], 0.0
    for ordinal in range(count):
        picture.seek(ordinal)
        if picture.format == "WEBP":  # Pillow reads a WebP frame's delay when it decodes the frame, not at seek
            picture.load()
        starts_s.append(elapsed)
        delay_ms = picture.info.get("duration") or DEFAULT_FRAME_MS
        elapsed += (delay_ms if delay_ms >= SHORTEST_FRAME_MS else DEFAULT_FRAME_MS) / 1000
    if elapsed > max_seconds:
        return {"status": "too_long", "duration_s": elapsed}, None
    wanted = sample_by_time(np.array(starts_s), sampled_frame_count(elapsed, count, sampling, patch))
    fit_h, fit_w = fit_pixels(picture.height, picture.width, sampling.max_pixels_per_frame)
    targets = sorted(set(wanted))
    frames = np.empty((len(targets), fit_h, fit_w, 3), np.uint8)
    for row, ordinal in enumerate(targets):
        picture.seek(ordinal)
        frames[row] = np.asarray(_resized(_rgb(picture), fit_h, fit_w))
    entries = [{"pts": ordinal, "ordinal": ordinal, "seconds": starts_s[ordinal]} for ordinal in targets]
    header = {
        "status": "ok",
        "kind": "video",
        "total_frames": count,
        "duration_s": elapsed,
        "wanted": wanted,
        "entries": entries,
        "shape": list(frames.shape),
        "work": {"frames_decoded": count},
    }
    return header, frames


def _upright_rgb(picture: Image.Image) -> Image.Image:
    """The picture turned as its EXIF orientation says (a phone photo stored sideways), in RGB."""
    return _rgb(ImageOps.exif_transpose(picture))


def _rgb(picture: Image.Image) -> Image.Image:
    """RGB pixels: more than 8 bits a value scaled to 8 by their range (`_eight_bits`), never clipped; transparency
    over white (BACKGROUND), as a page shows a transparent picture: an alpha channel, or a colour the file names
    transparent (a tRNS chunk of a palette, grey or RGB PNG, a GIF's transparent index)."""
    if picture.mode in WIDE_MODES:
        picture = _eight_bits(picture)
    if picture.mode in ALPHA_MODES or "transparency" in picture.info:
        over = Image.new("RGBA", picture.size, BACKGROUND)
        over.alpha_composite(picture.convert("RGBA"))
        return over.convert("RGB")
    return picture.convert("RGB")


def _eight_bits(picture: Image.Image) -> Image.Image:
    """A one-channel picture of 16-bit, 32-bit or float values as 8-bit grey ("L", or "LA" where the file names a
    value transparent), scaled by the range its values are stored in rather than clipped at 255 (which reads a
    16-bit picture almost all white): 16-bit by 0-65535; 32-bit integers by the smallest of 0-255, 0-65535 and
    0-(2^31-1) that holds them (Pillow opens some 16-bit PNGs as 32-bit), or their whole signed range when one is
    negative; floats by 0-1 when they lie in it (the usual range of float pictures), else by their own lowest and
    highest values. Values that are not numbers read as black."""
    values = np.asarray(picture)
    if picture.mode.startswith("I;16"):
        low, high = 0.0, 65535.0
    elif picture.mode == "I":
        low = 0.0 if values.min(initial=0) >= 0 else -(2.0**31)
        top = values.max(initial=0)
        high = next(limit for limit in (255.0, 65535.0, 2.0**31 - 1) if top <= limit) if low == 0 else 2.0**31 - 1
    else:  # "F"
        finite = values[np.isfinite(values)]
        low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        if low >= 0 and high <= 1:
            low, high = 0.0, 1.0
    scaled = (values.astype(np.float32) - low) * (255 / max(high - low, 1e-12))
    grey = Image.fromarray(np.nan_to_num(scaled, nan=0.0).clip(0, 255).round().astype(np.uint8), "L")
    if "transparency" not in picture.info:
        return grey
    alpha = np.where(values == picture.info["transparency"], 0, 255).astype(np.uint8)
    return Image.merge("LA", (grey, Image.fromarray(alpha, "L")))


def _resized(picture: Image.Image, height: int, width: int) -> Image.Image:
    if picture.size == (width, height):
        return picture
    return picture.resize((width, height), Image.Resampling.BICUBIC, reducing_gap=3.0)
