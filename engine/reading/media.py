"""An upload of any kind: a video, or a still image (a picture with one frame), decided by its content in the
reader (engine/reading/decoders/pillow_picture.py), never by its name. A request carries several, its media."""

from dataclasses import dataclass

import numpy as np

from engine.config import FrameSampling
from engine.errors import InputError

from .video import SampledVideo, file_sha256, read_upload, sampled_video

# The Qwen processors refuse a picture whose sides differ more than this (smart_resize).
MAX_ASPECT = 200


def too_small(what: str, width: int, height: int, side: int) -> str | None:
    """The sentence for a picture or live frame (`what`: "The picture", "The frame") with a side under `side`
    pixels (Family.token_side: one token); None when it is large enough. Below one token the processor can only
    blow a few pixels up (and a 1- or 3-pixel-high one it takes for channels first): the answer is noise."""
    if min(width, height) >= side:
        return None
    return (
        f"{what} is {width}x{height} pixels; this model reads pictures with each side at least {side} pixels "
        "(one token); send a larger one."
    )


@dataclass(frozen=True)
class StillImage:
    """A still picture as the model is given it.

    pixels: (H, W, 3) uint8 RGB, upright, scaled to fit the request's max_pixels_per_frame (never up).
    stored_size: (width, height) as stored. content_hash: sha256 hex of the file bytes. read_wait_s, read_s: as
    SampledVideo's.
    """

    pixels: np.ndarray
    stored_size: tuple[int, int]
    content_hash: str
    read_wait_s: float = 0.0
    read_s: float = 0.0

    @property
    def nbytes(self) -> int:
        return self.pixels.nbytes


Medium = SampledVideo | StillImage


def is_video(medium: Medium) -> bool:
    return isinstance(medium, SampledVideo)


def read_medium(path, sampling: FrameSampling, *, content_hash: str | None = None, **options) -> Medium:
    """An upload read by a reader: a still picture as a StillImage (scaled like one sampled frame), anything
    else as read_video reads it (an animated picture is a video). content_hash: as read_video's; options and
    InputErrors: read_upload's, and a still picture whose sides differ more than MAX_ASPECT times is refused."""
    read = read_upload(path, sampling, **options)
    digest = content_hash or file_sha256(path)
    if read.header.get("kind") != "image":
        return sampled_video(read, digest)
    width, height = read.header["size"]
    if max(width, height) > MAX_ASPECT * min(width, height):
        raise InputError(
            f"The picture is {width}x{height} pixels; its longer side may be at most {MAX_ASPECT} "
            "times its shorter one."
        )
    pixels = read.parts[0][1][0]
    return StillImage(
        pixels if pixels.flags.writeable else pixels.copy(), (width, height), digest, read.wait_s, read.read_s
    )
