"""Live streams made from the shapes family (assets/shapes.py): what a camera pointed at the shapes would film.

    stream = shape_stream(seed, now_s=312.5)    # ShapeStream: scenes up to the moment asked
    frame = stream.frame(t_s)                   # (64, 64, 3) uint8 RGB, as the camera gives it at t_s
    asked = live_asked(stream, "colour", now_s=312.5, seen_from_s=305.0)   # (question, answer) or None

A stream is still background with clips in it: a clip appears (cut in, at a random point of it), plays and holds
still at its end, then leaves (cut to the background) or another clip follows it. Its frames come at the clips'
8 fps from 0 s; a camera's sensor noise is drawn per frame from the seed. The events fall mostly in the last 20 s
before the moment asked, some long before it (a shape that has held still for minutes, an empty room).

Questions are about what is in view at the moment asked (the newest frame): the colour and kind of the shape in
view, or `none`; "Is there a red shape?" (`yes`/`no`); the way it moves, asked only when the shape in view made
its move within what the model sees (from seen_from_s on). Seeds below HELD_OUT_FROM train, as the clips'.
"""

import functools
import math
from dataclasses import dataclass

import numpy as np

from assets.shapes import BACKGROUND_RGB, COLOURS, FPS, HELD_OUT_FROM, QUESTIONS, SIZE_PX, ShapeClip, shape_clip

CLIP_FRAMES = 64  # frames of one clip (8 s at 8 fps); past its end a clip holds its last frame
NOISE_LEVELS = (0.0, 0.0, 1.0, 2.0, 4.0)  # a stream's sensor noise, standard deviation in 8-bit levels
YES_NO = "Is there a {colour} shape?"
NONE = "none"  # the answer about a shape when none is in view
LIVE_KINDS = ("colour", "shape", "direction", "yes/no")


@dataclass(frozen=True)
class Scene:
    """What the camera films from start_s on: clip_seed's clip from offset_s into it, or the background alone
    (clip_seed None)."""

    start_s: float
    clip_seed: int | None = None
    offset_s: float = 0.0


@dataclass(frozen=True)
class ShapeStream:
    """scenes: from 0 s on, in time order; noise: the sensor noise (8-bit levels, per pixel and frame)."""

    seed: int
    scenes: tuple[Scene, ...]
    noise: float

    def scene_at(self, t_s: float) -> Scene:
        return next(scene for scene in reversed(self.scenes) if scene.start_s <= t_s + 1e-9)

    def clip_at(self, t_s: float) -> ShapeClip | None:
        """The clip in view at t_s, None for the background."""
        scene = self.scene_at(t_s)
        return None if scene.clip_seed is None else _clip(scene.clip_seed)

    def frame(self, t_s: float) -> np.ndarray:
        """The camera's frame at t_s (any time; frames change at 8 fps)."""
        scene = self.scene_at(t_s)
        if scene.clip_seed is None:
            frame = np.empty((SIZE_PX, SIZE_PX, 3), np.uint8)
            frame[:] = BACKGROUND_RGB
        else:
            index = math.floor((t_s - scene.start_s + scene.offset_s) * FPS + 1e-6)
            frame = _clip(scene.clip_seed).frames[min(CLIP_FRAMES - 1, max(0, index))]
        if not self.noise:
            return frame
        rng = np.random.default_rng([self.seed, round(t_s * FPS)])
        return (frame + rng.normal(0.0, self.noise, frame.shape)).round().clip(0, 255).astype(np.uint8)

    def move_s(self, t_s: float) -> tuple[float, float] | None:
        """(start, end) stream seconds of the move of the clip in view at t_s, when its scene shows it (None for
        the background, or a scene that cut in after the move began)."""
        scene = self.scene_at(t_s)
        if scene.clip_seed is None:
            return None
        clip = _clip(scene.clip_seed)
        if scene.offset_s > clip.still_s:
            return None
        start = scene.start_s - scene.offset_s + clip.still_s
        return start, start + 1.0


@functools.lru_cache(maxsize=64)
def _clip(seed: int) -> ShapeClip:
    """A stream's clips are drawn once each (64 frames), not once per frame asked for."""
    return shape_clip(seed)


def shape_stream(seed: int, now_s: float) -> ShapeStream:
    """The stream of `seed` up to the moment now_s (seconds from its first frame)."""
    rng = np.random.default_rng([seed, 7])
    # Events, latest first: mostly within 20 s of now, sometimes long before (a scene unchanged for minutes).
    latest = now_s - (rng.uniform(0, 20) if rng.random() < 0.8 else rng.uniform(20, 240))
    times = [latest]
    while len(times) < 4 and times[-1] > 0:
        times.append(times[-1] - rng.uniform(2, 20))
    times = sorted(max(0.0, t) for t in times)
    times = sorted(set([0.0, *times]))
    scenes, showing = [], rng.random() < 0.5  # whether the stream opens on a clip
    for start in times:
        if showing:
            # A clip cuts in: usually from its start, sometimes part-way (the camera turned on mid-clip)
            offset = 0.0 if rng.random() < 0.7 else float(rng.integers(0, CLIP_FRAMES)) / FPS
            scenes.append(Scene(start, _clip_seed(seed, rng), offset))
        else:
            scenes.append(Scene(start))
        # after a clip: the shape leaves, or another clip follows at once; after the background: a clip
        showing = not showing or rng.random() < 0.3
    return ShapeStream(seed, tuple(scenes), float(NOISE_LEVELS[rng.integers(len(NOISE_LEVELS))]))


def _clip_seed(seed: int, rng: np.random.Generator) -> int:
    """A clip for a stream: a training clip for a training stream; for a held-out stream a held-out clip, far
    from the seeds bench/accuracy.py asks as uploads (HELD_OUT_FROM on)."""
    if seed < HELD_OUT_FROM:
        return int(rng.integers(0, HELD_OUT_FROM - 1000))
    return HELD_OUT_FROM + 10_000_000 + int(rng.integers(0, 10_000_000))


def live_asked(stream: ShapeStream, kind: str, now_s: float, seen_from_s: float) -> tuple[str, str] | None:
    """(question, answer) of a question type of LIVE_KINDS about what is in view at now_s, for a model that sees
    the stream from seen_from_s on; None where the type has no answer then (the way it moves, when the shape in
    view made no move since seen_from_s)."""
    clip = stream.clip_at(now_s)
    if kind == "yes/no":
        rng = np.random.default_rng([stream.seed, round(now_s * FPS), 3])
        asked = clip.colour if clip is not None and rng.random() < 0.5 else list(COLOURS)[rng.integers(len(COLOURS))]
        return YES_NO.format(colour=asked), "yes" if clip is not None and clip.colour == asked else "no"
    if clip is None:
        return QUESTIONS[kind], NONE
    if kind == "direction":
        move = stream.move_s(now_s)
        if move is None or move[0] < seen_from_s or move[0] > now_s:
            return None
    return QUESTIONS[kind], clip.answer(kind)
