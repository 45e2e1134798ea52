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
    """RGB pixels; transparency over white, as a page shows a transparent picture."""
    if picture.mode in ("RGBA", "LA", "PA") or (picture.mode == "P" and "transparency" in picture.info):
        over = Image.new("RGBA", picture.size, (255, 255, 255, 255))
        over.alpha_composite(picture.convert("RGBA"))
        return over.convert("RGB")
    return picture.convert("RGB")


def _resized(picture: Image.Image, height: int, width: int) -> Image.Image:
    if picture.size == (width, height):
        return picture
    return picture.resize((width, height), Image.Resampling.BICUBIC, reducing_gap=3.0)
