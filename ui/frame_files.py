"""The frame pictures as files written once, so a stream's later updates point at the same files.

Given arrays, Gradio re-encodes and rewrites a gallery's image files in place on every update that
carries them; a browser downloading a picture meanwhile can read a short file (seen under load). Here
each picture is written once, atomically, under a name from its content, inside Gradio's upload folder
(which Gradio serves without copying again).
"""

import hashlib
import io
import os
import tempfile
from pathlib import Path

import numpy as np
from gradio.utils import get_upload_folder
from PIL import Image


def saved(gallery: list[tuple[np.ndarray, str]]) -> list[tuple[str, str]]:
    """(image (H, W, 3) uint8, caption) pairs -> (path of a WebP file, caption) pairs."""
    return [(_write_once(image), caption) for image, caption in gallery]


def _write_once(image: np.ndarray) -> str:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="webp")
    data = buffer.getvalue()
    folder = Path(get_upload_folder()) / hashlib.sha256(data).hexdigest()[:40]
    path = folder / "frame.webp"
    if not path.is_file():  # same bytes, same name: an existing file is already this picture
        folder.mkdir(parents=True, exist_ok=True)
        handle, partial = tempfile.mkstemp(dir=folder, suffix=".part")
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.replace(partial, path)  # readers see the old file or the whole new one, never a part
    return str(path)
