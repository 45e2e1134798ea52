"""A synthetic video-QA family: one coloured shape moving over a plain background, with short answers.

    clip = shape_clip(seed)                 # ShapeClip: frames (N, H, W, 3) uint8 + what is in them
    for question, answer in clip.questions(): ...
    write_shape_clip(path, seed)            # the same clip as an H.264 MP4, as a user would upload it
    pair = clip_pair(seed)                  # two clips of different colours: "Which clip has the red shape?"

Everything follows from the seed, so training (train/tiny_trained.py), the held-out accuracy benchmark
(bench/accuracy.py) and the app's example clips draw from one family. Seeds below HELD_OUT_FROM train;
seeds from it on are never trained on. One question is about two clips at once (clip_pair): which of them
has a given colour, the first or the second, which only the order of the clips in the prompt tells apart.

Why these choices: a plain background and a shape 35-45 % of the frame side are what a 2 M-parameter
model learns from scratch in minutes on a CPU (a textured background with a small shape did not train).
8 s at 8 fps, sampled at 2 fps, gives 16 frames = 8 temporal groups of 2x2 tokens at 64x64 pixels, so
EVS has a real choice to make and a direction question needs more than the first group. The shape holds
still for the first 1-5 whole seconds: each temporal group spans one second, so the first group that moves
is the "start" answer, and the still groups before it are exactly what EVS drops (they equal group 0),
leaving only the kept tokens' positions and the `<t seconds>` text to say when. The shape crosses in one
second and then holds still again: spread over the rest of the clip, the first moving group moved 2-5 px
(its second frame only) and at q = 0.7 kept no token in half the clips, so "when" was lost before the
model saw it; crossing in one second, that group keeps tokens in every clip at q = 0.7.
"""

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

COLOURS = {"red": (220, 40, 40), "green": (40, 190, 60), "blue": (50, 80, 230), "yellow": (235, 215, 40)}
SHAPES = ("circle", "square", "triangle")
DIRECTIONS = ("left", "right", "up", "down")
BACKGROUND_RGB = (70, 70, 70)
SIZE_PX = 64
SECONDS = 8.0
FPS = 8
HELD_OUT_FROM = 1_000_000  # seeds from here on are held out

QUESTIONS = {
    "colour": "What colour is the shape?",
    "direction": "Which way does the shape move?",
    "shape": "What shape is it?",
    "start": "When does the shape start moving?",
}
STILL_SECONDS = (1, 2, 3, 4, 5)  # how long a clip holds the shape still before it moves
MOVE_SECONDS = 1  # how long the move takes; the shape holds still again after it


@dataclass(frozen=True)
class ShapeClip:
    """frames: (N, H, W, 3) uint8 RGB at FPS; the answers to each question type.

    still_s: whole seconds the shape holds still before it moves; the "start" answer is it as digits.
    """

    frames: np.ndarray
    colour: str
    shape: str
    direction: str
    still_s: int

    def answer(self, kind: str) -> str:
        return {"colour": self.colour, "direction": self.direction, "shape": self.shape, "start": str(self.still_s)}[
            kind
        ]

    def questions(self) -> list[tuple[str, str]]:
        """(question, answer) for every question type, in QUESTIONS order."""
        return [(text, self.answer(kind)) for kind, text in QUESTIONS.items()]


def _mask(shape: str, side_px: int) -> np.ndarray:
    """(side, side) bool footprint of `shape`."""
    y, x = np.mgrid[0:side_px, 0:side_px] + 0.5
    if shape == "circle":
        centre = side_px / 2
        return (x - centre) ** 2 + (y - centre) ** 2 <= centre**2
    if shape == "square":
        return np.ones((side_px, side_px), bool)
    # triangle, point up: inside while the row's half-width covers x
    return np.abs(x - side_px / 2) <= y / 2


def shape_clip(seed: int, size_px: int = SIZE_PX, seconds: float = SECONDS, fps: int = FPS) -> ShapeClip:
    """The clip of `seed`: a shape of random colour and kind that holds still for a whole number of seconds,
    crosses the frame in one direction in MOVE_SECONDS, and holds still at the far side to the end."""
    rng = np.random.default_rng(seed)
    colour = list(COLOURS)[rng.integers(len(COLOURS))]
    shape = SHAPES[rng.integers(len(SHAPES))]
    direction = DIRECTIONS[rng.integers(len(DIRECTIONS))]
    side = int(round(size_px * rng.uniform(0.35, 0.45)))
    travel = size_px - side
    # start near one edge, end near the other; the cross-axis position is random
    start, end = rng.uniform(0, 0.15) * travel, rng.uniform(0.85, 1.0) * travel
    across = rng.uniform(0, travel)
    # Drawn last, so a seed's colour, shape, direction and path are what they were before clips held still.
    still_s = int(STILL_SECONDS[rng.integers(len(STILL_SECONDS))])
    still_frames = still_s * fps
    footprint = _mask(shape, side)
    num_frames = max(1, round(seconds * fps))
    frames = np.empty((num_frames, size_px, size_px, 3), np.uint8)
    frames[:] = BACKGROUND_RGB
    for index in range(num_frames):
        moved = min(1.0, max(0, index - still_frames) / (MOVE_SECONDS * fps))
        along = start + (end - start) * moved
        if direction in ("left", "up"):
            along = travel - along
        x, y = (along, across) if direction in ("left", "right") else (across, along)
        top, left = int(round(y)), int(round(x))
        frames[index, top : top + side, left : left + side][footprint] = COLOURS[colour]
    return ShapeClip(frames=frames, colour=colour, shape=shape, direction=direction, still_s=still_s)


def write_shape_clip(path, seed: int, size_px: int = SIZE_PX) -> Path:
    """The clip of `seed` as an H.264 MP4 (x264 single-threaded, so the file depends only on the seed)."""
    clip = shape_clip(seed, size_px)
    path = Path(path)
    with av.open(str(path), mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=Fraction(FPS))
        stream.width = stream.height = size_px
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": "18", "preset": "medium", "threads": "1"}
        for frame in clip.frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


# The two-clip question: two clips of different colours, asked which one shows a colour; "pair" beside the
# single-clip question types.
PAIR = "pair"
PAIR_QUESTION = "Which clip has the {colour} shape, first or second?"
PAIR_ANSWERS = ("first", "second")


@dataclass(frozen=True)
class ClipPair:
    """Two clips asked about together: seeds (first, second) in the order the prompt shows them, the colour
    asked about (exactly one of the two has it) and the answer, "first" or "second"."""

    seeds: tuple[int, int]
    colour: str
    answer: str

    @property
    def question(self) -> str:
        return PAIR_QUESTION.format(colour=self.colour)


def clip_pair(seed: int) -> ClipPair:
    """The pair of `seed`: its clip first, then the next seed's whose colour differs; which of the two the
    question asks about follows from the seed too (either, as often). Seeds of a held-out first clip give
    held-out pairs."""
    first = shape_clip(seed).colour
    second = next(s for s in range(seed + 1, seed + 1000) if shape_clip(s).colour != first)
    asked = int(np.random.default_rng([seed, 2]).integers(2))
    colour = first if asked == 0 else shape_clip(second).colour
    return ClipPair((seed, second), colour, PAIR_ANSWERS[asked])


def asked(seed: int, kind: str) -> tuple[list[int], str, str]:
    """(the clips' seeds in order, question, expected answer) of a question type about `seed`: its clip, or for
    PAIR its pair's two."""
    if kind == PAIR:
        pair = clip_pair(seed)
        return list(pair.seeds), pair.question, pair.answer
    return [seed], QUESTIONS[kind], shape_clip(seed).answer(kind)


def held_out_seeds(first: int, count: int) -> list[int]:
    """`count` seeds never trained on, starting `first` places into the held-out range."""
    return [HELD_OUT_FROM + first + i for i in range(count)]
