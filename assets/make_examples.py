"""Write the example clips the app offers: `python -m assets.make_examples` (run from the repo root)."""

from pathlib import Path

from assets.clips import write_clip

EXAMPLES_DIR = Path(__file__).resolve().parent / "examples"
EXAMPLE_KINDS = ("moving_object", "pan", "scene_cut")


def main() -> None:
    EXAMPLES_DIR.mkdir(exist_ok=True)
    for kind in EXAMPLE_KINDS:
        path = write_clip(EXAMPLES_DIR / f"{kind}.mp4", kind, seconds=5.0, fps=10, size=(320, 240))
        print(f"{path} {path.stat().st_size // 1024} KB")


if __name__ == "__main__":
    main()
