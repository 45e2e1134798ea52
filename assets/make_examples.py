"""Write the example clips the app offers: `python -m assets.make_examples` (run from the repo root).

One held-out clip of the shapes family (assets/shapes.py) per question type, asked at the app's default
rate, and one two-clip question. Nobody picked them: they are the first held-out seeds bench/accuracy.py
draws, in question order (the first clip for the first type, and so on), and the pair is the benchmark's
first pair (clip_pair of the first held-out seed), so they show what the benchmark measures, not a lucky
case. tests/test_tiny_trained.py checks that the offline model answers each one right.
"""

from pathlib import Path

from assets.shapes import PAIR, QUESTIONS, clip_pair, held_out_seeds, write_shape_clip
from engine.config import DEFAULT_PRUNING_RATE

EXAMPLES_DIR = Path(__file__).resolve().parent / "examples"
FILE_NAMES = {
    "colour": "shape_colour.mp4",
    "direction": "shape_moving.mp4",
    "shape": "shape_kind.mp4",
    "start": "shape_start.mp4",
}
# (files, held-out seeds, question type, pruning rate); bench/accuracy.py's clips start at held-out seed 0
_SINGLE = tuple(
    ((FILE_NAMES[kind],), (seed,), kind, DEFAULT_PRUNING_RATE)
    for kind, seed in zip(QUESTIONS, held_out_seeds(0, len(QUESTIONS)))
)
FIRST_PAIR = clip_pair(held_out_seeds(0, 1)[0])
# The pair's clips are single-question examples' clips when their seeds are (the first two held-out seeds are).
_NAMED = {seeds[0]: names[0] for names, seeds, _, _ in _SINGLE}
EXAMPLES = (
    *_SINGLE,
    (
        tuple(_NAMED.get(seed, f"shape_{seed}.mp4") for seed in FIRST_PAIR.seeds),
        FIRST_PAIR.seeds,
        PAIR,
        DEFAULT_PRUNING_RATE,
    ),
)


def question(kind: str) -> str:
    """An example's question: its type's, or the first pair's."""
    return FIRST_PAIR.question if kind == PAIR else QUESTIONS[kind]


def example_questions() -> list[tuple[tuple[str, ...], str, float]]:
    """(file names, question, pruning rate) of each example, as the app offers them."""
    return [(names, question(kind), rate) for names, _, kind, rate in EXAMPLES]


def main() -> None:
    EXAMPLES_DIR.mkdir(exist_ok=True)
    written = {}
    for names, seeds, _, _ in EXAMPLES:
        written.update(zip(names, seeds))
    for name, seed in written.items():
        path = write_shape_clip(EXAMPLES_DIR / name, seed)
        print(f"{path} {path.stat().st_size // 1024} KB")


if __name__ == "__main__":
    main()
