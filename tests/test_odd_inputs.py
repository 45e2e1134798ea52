"""Inputs that were misread, each read right or refused with a sentence, through Engine.submit and through the OpenAI
endpoint of a launched app (issue 39): seeds past what the generator takes, 16-bit, 32-bit and float pictures, the
delays of an animated WebP, an mp3's or m4a's cover art, and a PNG whose tRNS chunk names a colour transparent.

A picture read right gives the model exactly the pixels of the same picture written the plain 8-bit way, so its
answer's logits equal that picture's (greedy, tiny-random on the CPU), up to float noise: a later request on the
same prompt reuses its state (the prefix cache), which moves logits by 1e-6, where another picture moves them by
1e-2 and more."""

import base64
import io
from fractions import Fraction
from pathlib import Path

import av
import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from engine import GenerationParams, InputError
from engine.front.checks import BAD_SEED
from engine.reading.video import UNREADABLE

QUESTION = "What is in the picture?"
SIDE = 96


def gradient_levels() -> np.ndarray:
    """(SIDE, SIDE) 8-bit levels: a horizontal ramp with a bright square, so the pictures differ from a flat one."""
    levels = np.tile(np.linspace(0, 255, SIDE).round().astype(np.int64), (SIDE, 1))
    levels[20:50, 30:70] = 255 - levels[20:50, 30:70]
    return levels


def write(path: Path, array: np.ndarray, mode: str | None = None, **options) -> Path:
    Image.fromarray(array, mode).save(path, **options) if mode else Image.fromarray(array).save(path, **options)
    return path


@pytest.fixture(scope="module")
def pictures(tmp_path_factory) -> dict[str, Path]:
    """Each odd picture, and "reference": the same levels as a plain 8-bit grey PNG."""
    folder = tmp_path_factory.mktemp("odd-pictures")
    levels = gradient_levels()
    return {
        "reference": write(folder / "grey8.png", levels.astype(np.uint8)),
        # 0-65535: each level k as k * 257, the value a 16-bit writer gives 8-bit level k
        "grey16.png": write(folder / "grey16.png", (levels * 257).astype(np.uint16)),
        "grey16.tif": write(folder / "grey16.tif", (levels * 257).astype(np.uint16)),
        "int32.tif": write(folder / "int32.tif", (levels * 257).astype(np.int32), "I"),
        "float.tif": write(folder / "float.tif", (levels / 255).astype(np.float32), "F"),
    }


@pytest.fixture(scope="module")
def transparent(tmp_path_factory) -> tuple[Path, Path]:
    """(an RGB PNG whose tRNS chunk makes one colour transparent, the same picture with white there)."""
    folder = tmp_path_factory.mktemp("trns")
    rgb = np.stack([gradient_levels().astype(np.uint8)] * 3, axis=-1)
    rgb[10:60, 10:60] = (10, 200, 30)
    keyed = write(folder / "keyed.png", rgb, transparency=(10, 200, 30))
    rgb[10:60, 10:60] = 255
    return keyed, write(folder / "white.png", rgb)


def animated_webp(path: Path, frames: int, delay_ms: int) -> Path:
    pictures = [Image.fromarray(np.full((SIDE, SIDE, 3), 10 * i, np.uint8)) for i in range(frames)]
    pictures[0].save(path, save_all=True, append_images=pictures[1:], duration=delay_ms, loop=0)
    return path


def audio_with_cover(path: Path, container: str) -> Path:
    """Two seconds of a tone with cover art: an attached picture (PNG in an mp3, JPEG in an m4a)."""
    codec, audio_codec, picture_format = {"mp3": ("png", "libmp3lame", "PNG"), "mp4": ("mjpeg", "aac", "JPEG")}[
        container
    ]
    cover = io.BytesIO()
    Image.fromarray(np.full((32, 32, 3), (200, 10, 10), np.uint8)).save(cover, picture_format)
    with av.open(str(path), "w", format=container) as output:
        audio = output.add_stream(audio_codec, rate=44100, layout="mono")
        art = output.add_stream(codec)
        art.width = art.height = 32
        art.pix_fmt = "rgb24" if codec == "png" else "yuvj420p"
        art.disposition = av.stream.Disposition.attached_pic
        wave = (0.3 * np.sin(np.arange(2 * 44100) / 10)).astype(np.float32)[None]
        frame = av.AudioFrame.from_ndarray(wave, format="fltp", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = 44100, 0, Fraction(1, 44100)
        for packet in [*audio.encode(frame), *audio.encode()]:
            output.mux(packet)
        packet = av.Packet(cover.getvalue())
        packet.stream, packet.pts, packet.dts, packet.time_base = art, 0, 0, Fraction(1, 90000)
        output.mux(packet)
    return path


@pytest.fixture(scope="module")
def engine(app):
    return app.spy.engine


def logits(engine, path: Path, **settings) -> np.ndarray:
    params = GenerationParams(max_new_tokens=3, return_logits=True, **settings)
    return engine.submit(media=[path], question=QUESTION, params=params).result(timeout_s=120).logits


def close(got: np.ndarray, want: np.ndarray) -> None:
    torch.testing.assert_close(torch.from_numpy(got), torch.from_numpy(want), atol=2e-5, rtol=0)


def chat(app, path: Path, media_type: str, **fields) -> httpx.Response:
    url = f"data:{media_type};base64,{base64.b64encode(path.read_bytes()).decode()}"
    kind = "image_url" if media_type.startswith("image/") else "video_url"
    body = {
        "model": app.spy.model_info["name"],
        "messages": [
            {"role": "user", "content": [{"type": kind, kind: {"url": url}}, {"type": "text", "text": QUESTION}]}
        ],
        "max_tokens": 3,
        "temperature": 0,
        **fields,
    }
    return httpx.post(f"{app.url}v1/chat/completions", json=body, timeout=120)


@pytest.mark.parametrize("name", ["grey16.png", "grey16.tif", "int32.tif", "float.tif"])
def test_wide_pictures_are_scaled_by_their_range(app, engine, pictures, name):
    """16-bit grey (PNG and TIFF), 32-bit integers holding 16-bit values, floats in 0-1: the model is given the
    8-bit picture's pixels (its logits, to the bit); clipped at 255 they read white, floats black."""
    close(logits(engine, pictures[name]), logits(engine, pictures["reference"]))
    answers = [
        chat(app, pictures[key], "image/png" if key.endswith("png") else "image/tiff") for key in ("reference", name)
    ]
    assert [response.status_code for response in answers] == [200, 200], answers[1].text
    texts = [response.json()["choices"][0]["message"]["content"] for response in answers]
    assert texts[0] == texts[1]


def test_a_colour_named_transparent_shows_the_background(app, engine, transparent):
    """An RGB PNG with a tRNS colour reads as the same picture with white where that colour was, as a page shows it."""
    keyed, white = transparent
    close(logits(engine, keyed), logits(engine, white))


def test_an_animated_webp_lasts_as_its_delays_say(app, engine, tmp_path):
    """24 frames of 200 ms are 4.8 s, past the app's 4 s limit (read as 100 ms each they were 2.4 s and passed);
    12 of them, 2.4 s, are answered with frames sampled over 2.4 s."""
    long = animated_webp(tmp_path / "long.webp", 24, 200)
    with pytest.raises(InputError, match="The video is 4.8 seconds long; the limit is 4 seconds"):
        engine.submit(media=[long], question=QUESTION).result(timeout_s=120)
    refused = chat(app, long, "image/webp")
    assert refused.status_code == 400 and "4.8 seconds" in refused.json()["error"]["message"]
    short = animated_webp(tmp_path / "short.webp", 12, 200)
    stats = engine.submit(media=[short], question=QUESTION, params=GenerationParams(max_new_tokens=2)).result(60).stats
    assert stats["media"][0]["kind"] == "video"
    assert stats["media"][0]["timestamps_s"][-1] > 1.6  # the last group's centre: 2.0-2.2 s, not 0.9-1.1


@pytest.mark.parametrize("container, suffix, media_type", [("mp3", "mp3", "audio/mpeg"), ("mp4", "m4a", "audio/mp4")])
def test_cover_art_is_not_a_video(app, engine, tmp_path, container, suffix, media_type):
    """An mp3 or m4a with cover art is refused as a plain audio file is, not answered as 11 microseconds of video."""
    path = audio_with_cover(tmp_path / f"song.{suffix}", container)
    with av.open(str(path)) as opened:  # the file does hold what a tagged song holds
        assert [stream.type for stream in opened.streams] == ["audio", "video"]
    with pytest.raises(InputError, match=UNREADABLE):
        engine.submit(media=[path], question=QUESTION).result(timeout_s=120)
    refused = chat(app, path, "video/mp4")
    assert refused.status_code == 400 and refused.json()["error"]["message"] == UNREADABLE


@pytest.mark.parametrize("seed", [1 << 64, -(1 << 63) - 1, 1 << 200])
def test_a_seed_past_the_generators_range_gets_a_sentence(app, engine, pictures, seed):
    with pytest.raises(InputError, match=BAD_SEED):
        engine.submit(media=[pictures["reference"]], question=QUESTION, params=GenerationParams(seed=seed))
    refused = chat(app, pictures["reference"], "image/png", seed=seed, temperature=0.7)
    assert refused.status_code == 400 and refused.json()["error"]["message"] == BAD_SEED


@pytest.mark.parametrize("seed", [(1 << 64) - 1, -(1 << 63)])
def test_a_seed_at_the_ends_of_the_range_is_answered(app, pictures, seed):
    """Sampling with the largest and smallest seeds the generator takes; the OpenAI endpoint keeps all 64 bits."""
    answered = chat(app, pictures["reference"], "image/png", seed=seed, temperature=0.7)
    assert answered.status_code == 200, answered.text
