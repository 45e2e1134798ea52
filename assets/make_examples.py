"""Write the example clips the app offers: `python -m assets.make_examples` (run from the repo root).

They are held-out clips of the shapes family (assets/shapes.py), one per question type, at 64x64 like
every clip tiny-trained learned from, so clicking an example on the offline model gives a right answer
(tests/test_tiny_trained.py checks each at its rate).
"""

from pathlib import Path

from assets.shapes import QUESTIONS, held_out_seeds, write_shape_clip

EXAMPLES_DIR = Path(__file__).resolve().parent / "examples"
# (file, held-out seed, question type, pruning rate)
EXAMPLES = (
    ("shape_moving.mp4", held_out_seeds(5003, 1)[0], "direction", 0.5),
    ("shape_colour.mp4", held_out_seeds(5004, 1)[0], "colour", 0.7),
    ("shape_kind.mp4", held_out_seeds(5006, 1)[0], "shape", 0.3),
)


def example_questions() -> list[tuple[str, str, float]]:
    """(file name, question, pruning rate) of each example, as the app offers them."""
    return [(name, QUESTIONS[kind], rate) for name, _, kind, rate in EXAMPLES]


def main() -> None:
    EXAMPLES_DIR.mkdir(exist_ok=True)
    for name, seed, _, _ in EXAMPLES:
        path = write_shape_clip(EXAMPLES_DIR / name, seed)
        print(f"{path} {path.stat().st_size // 1024} KB")


if __name__ == "__main__":
    main()
