"""Answer accuracy against the EVS pruning rate, on held-out clips of the synthetic shapes family.

    python bench/accuracy.py [--model tiny-trained] [--seed 0] [--per-type 100] [--rates 0,0.5,0.7,0.9]
                             [--plot assets/accuracy.svg] [--json]
    (`python -m bench.accuracy ...` from the repository root is the same.)

Each held-out clip (assets/shapes.py, never trained on) is written as an H.264 MP4 and asked every
question type through the Engine, greedy, at each rate; an answer counts when it is exactly the expected
word. Prints one markdown table (question type x rate); --json also prints one JSON object as the last
line: {"0.0": {"colour": 1.0, "direction": 0.99, "shape": ...}, "0.5": {...}, ...}.
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from assets.shapes import QUESTIONS, held_out_seeds, shape_clip, write_shape_clip  # noqa: E402
from engine import Engine, EngineConfig, GenerationParams  # noqa: E402

MAX_NEW_TOKENS = 8  # the longest answer ("triangle") and <|im_end|> fit


def parse_rates(text: str) -> list[float]:
    return [float(rate) for rate in text.split(",") if rate.strip()]


def accuracy(engine: Engine, clips: dict[int, Path], rates: list[float]) -> dict[str, dict[str, float]]:
    """{str(rate): {question type: share of clips answered exactly}}; each rate's requests go in at once."""
    table: dict[str, dict[str, float]] = {}
    for rate in rates:
        params = GenerationParams(pruning_rate=rate, max_new_tokens=MAX_NEW_TOKENS)
        asked = [(kind, seed, engine.submit(path, QUESTIONS[kind], params))
                 for kind in QUESTIONS for seed, path in clips.items()]
        right = {kind: 0 for kind in QUESTIONS}
        for kind, seed, stream in asked:
            right[kind] += stream.result().text.strip() == shape_clip(seed).answer(kind)
        table[str(rate)] = {kind: right[kind] / len(clips) for kind in QUESTIONS}
    return table


def run(model: str, seed: int, per_type: int, rates: list[float], device: str = "cpu") -> dict:
    with tempfile.TemporaryDirectory() as folder:
        clips = {s: write_shape_clip(Path(folder) / f"{s}.mp4", s) for s in held_out_seeds(seed, per_type)}
        # Caches stay on: a clip's features are reused across rates, which changes no answer.
        with Engine(EngineConfig(model=model, device=device, max_queue=len(clips) * len(QUESTIONS))) as engine:
            return accuracy(engine, clips, rates)


PLOT_COLOURS = {"colour": "#0f766e", "direction": "#e11d48", "shape": "#6366f1"}


def svg_plot(table: dict[str, dict[str, float]], title: str) -> str:
    """Accuracy (0-1, y) against q (0-1, x), one line per question type, as a standalone SVG."""
    width, height, left, right, top, bottom = 480, 300, 50, 110, 30, 40
    plot_w, plot_h = width - left - right, height - top - bottom

    def point(q: float, accuracy: float) -> str:
        return f"{left + q * plot_w:.1f},{top + (1 - accuracy) * plot_h:.1f}"

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/>',
             f'<text x="{left}" y="18" font-size="13">{title}</text>']
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        x, y = left + tick * plot_w, top + (1 - tick) * plot_h
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="#e5e7eb"/>')
        parts.append(f'<text x="{left - 8}" y="{y + 4:.1f}" text-anchor="end">{tick:g}</text>')
        parts.append(f'<text x="{x:.1f}" y="{top + plot_h + 16}" text-anchor="middle">{tick:g}</text>')
    parts.append(f'<text x="{left + plot_w / 2}" y="{height - 6}" text-anchor="middle">pruning rate q</text>')
    for row, kind in enumerate(QUESTIONS):
        points = " ".join(point(float(rate), scores[kind]) for rate, scores in table.items())
        colour = PLOT_COLOURS.get(kind, "#111827")
        parts.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for rate, scores in table.items():
            x, y = point(float(rate), scores[kind]).split(",")
            parts.append(f'<circle cx="{x}" cy="{y}" r="3" fill="{colour}"/>')
        legend_y = top + 10 + 18 * row
        parts.append(f'<line x1="{width - right + 12}" y1="{legend_y}" x2="{width - right + 32}" y2="{legend_y}" '
                     f'stroke="{colour}" stroke-width="2"/>')
        parts.append(f'<text x="{width - right + 38}" y="{legend_y + 4}">{kind}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def markdown(table: dict[str, dict[str, float]]) -> str:
    rates = list(table)
    lines = ["| question | " + " | ".join(f"q = {rate}" for rate in rates) + " |",
             "|---|" + "---|" * len(rates)]
    for kind in QUESTIONS:
        lines.append(f"| {kind} | " + " | ".join(f"{table[rate][kind]:.2f}" for rate in rates) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/accuracy.py", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-trained")
    parser.add_argument("--device", default="cpu", choices=["auto", "cuda", "cpu"])
    parser.add_argument("--seed", type=int, default=0, help="first held-out clip")
    parser.add_argument("--per-type", type=int, default=100, help="held-out clips, each asked every question")
    parser.add_argument("--rates", type=parse_rates, default=[0.0, 0.5, 0.7, 0.9])
    parser.add_argument("--plot", type=Path, help="also draw the table as an SVG line chart to this file")
    parser.add_argument("--json", action="store_true", help="also print the table as one JSON line, last")
    args = parser.parse_args(argv)
    table = run(args.model, args.seed, args.per_type, args.rates, args.device)
    print(f"{args.model}: {args.per_type} held-out clips per question type from seed {args.seed}, greedy, exact match\n")
    print(markdown(table))
    if args.plot:
        args.plot.write_text(svg_plot(table, f"{args.model}: accuracy on {args.per_type} held-out clips per type"))
        print(f"saved {args.plot}")
    if args.json:
        print(json.dumps(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
