"""Answer accuracy against the EVS pruning rate, on held-out clips of the synthetic shapes family.

    python bench/accuracy.py [--model tiny-trained [--model tiny-trained-plain ...]] [--seed 0]
                             [--per-type 100] [--rates 0,0.3,0.5,0.7,0.9] [--plot assets/accuracy.svg] [--json]
                             [--live]
    (`python -m bench.accuracy ...` from the repository root is the same.)

Each held-out clip (assets/shapes.py, never trained on) is written as an H.264 MP4 and asked every
question type through the Engine, greedy, at each rate; an answer counts when it is exactly the expected
answer ("blue", "left", "3"). With --live, each clip is also played into a live session (docs/live.md), its
frames pushed at their 8 fps capture times, and asked every question type at the end: a second table per model.
Prints one markdown table (question type x rate) per model;
--plot draws every model in one chart; --json also prints one JSON object as the last line:
{"tiny-trained": {"0.0": {"colour": 1.0, "direction": 0.99, ...}, "0.3": {...}, ...}, ...}.
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from assets.shapes import FPS, QUESTIONS, held_out_seeds, shape_clip, write_shape_clip  # noqa: E402
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


def live_accuracy(engine: Engine, seeds: list[int], rates: list[float]) -> dict[str, dict[str, float]]:
    """The same table through live sessions: each clip's frames pushed at their capture times (waiting for the
    session rather than dropping a frame), then every question type asked of the stream at once."""
    table: dict[str, dict[str, float]] = {}
    for rate in rates:
        params = GenerationParams(pruning_rate=rate, max_new_tokens=MAX_NEW_TOKENS)
        right = {kind: 0 for kind in QUESTIONS}
        for seed in seeds:
            clip = shape_clip(seed)
            with engine.open_live(params) as live:
                for index, frame in enumerate(clip.frames):
                    live.push(frame, index / FPS)
                    live.wait(60)
                asked = {kind: live.ask(QUESTIONS[kind]) for kind in QUESTIONS}
                for kind, stream in asked.items():
                    right[kind] += stream.result().text.strip() == clip.answer(kind)
        table[str(rate)] = {kind: right[kind] / len(seeds) for kind in QUESTIONS}
    return table


def run(models: list[str], seed: int, per_type: int, rates: list[float], device: str = "cpu",
        live: bool = False) -> dict:
    """{model: accuracy table} on the same held-out clips; with live, also {model + " live": the live table}."""
    with tempfile.TemporaryDirectory() as folder:
        clips = {s: write_shape_clip(Path(folder) / f"{s}.mp4", s) for s in held_out_seeds(seed, per_type)}
        tables = {}
        for model in models:
            # Caches stay on: a clip's features are reused across rates, which changes no answer.
            with Engine(EngineConfig(model=model, device=device, max_queue=len(clips) * len(QUESTIONS))) as engine:
                tables[model] = accuracy(engine, clips, rates)
                if live:
                    tables[f"{model} live"] = live_accuracy(engine, list(clips), rates)
        return tables


PLOT_COLOURS = {"colour": "#0f766e", "direction": "#e11d48", "shape": "#6366f1", "start": "#d97706"}
DASHES = ("", "6 4", "2 3")  # one per model: the first solid


def svg_plot(tables: dict[str, dict[str, dict[str, float]]], title: str) -> str:
    """Accuracy (0-1, y) against q (0-1, x) as a standalone SVG: one colour per question type, one dash
    pattern per model (tables: {model: {rate: {question type: accuracy}}}, at most len(DASHES) models)."""
    width, height, left, right, top, bottom = 560, 320, 50, 190, 30, 40
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
    legend_x = width - right + 12
    for model, dash in zip(tables, DASHES):
        for kind in QUESTIONS:
            table, colour = tables[model], PLOT_COLOURS[kind]
            points = " ".join(point(float(rate), scores[kind]) for rate, scores in table.items())
            parts.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2" '
                         f'stroke-dasharray="{dash}"/>')
            for rate, scores in table.items():
                x, y = point(float(rate), scores[kind]).split(",")
                parts.append(f'<circle cx="{x}" cy="{y}" r="3" fill="{colour}"/>')
    for row, kind in enumerate(QUESTIONS):
        legend_y = top + 10 + 18 * row
        parts.append(f'<line x1="{legend_x}" y1="{legend_y}" x2="{legend_x + 20}" y2="{legend_y}" '
                     f'stroke="{PLOT_COLOURS[kind]}" stroke-width="2"/>')
        parts.append(f'<text x="{legend_x + 26}" y="{legend_y + 4}">{kind}</text>')
    for row, (model, dash) in enumerate(zip(tables, DASHES)):
        legend_y = top + 10 + 18 * (len(QUESTIONS) + 1 + row)
        parts.append(f'<line x1="{legend_x}" y1="{legend_y}" x2="{legend_x + 20}" y2="{legend_y}" '
                     f'stroke="#111827" stroke-width="2" stroke-dasharray="{dash}"/>')
        parts.append(f'<text x="{legend_x + 26}" y="{legend_y + 4}">{model}</text>')
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
    parser.add_argument("--model", action="append", help="a model to measure (repeat for several); "
                        "default tiny-trained")
    parser.add_argument("--device", default="cpu", choices=["auto", "cuda", "cpu"])
    parser.add_argument("--seed", type=int, default=0, help="first held-out clip")
    parser.add_argument("--per-type", type=int, default=100, help="held-out clips, each asked every question")
    parser.add_argument("--rates", type=parse_rates, default=[0.0, 0.3, 0.5, 0.7, 0.9])
    parser.add_argument("--plot", type=Path, help="also draw the table as an SVG line chart to this file")
    parser.add_argument("--json", action="store_true", help="also print the table as one JSON line, last")
    parser.add_argument("--live", action="store_true", help="also ask every clip through a live session")
    args = parser.parse_args(argv)
    models = args.model or ["tiny-trained"]
    if len(models) * (2 if args.live else 1) > len(DASHES):
        parser.error(f"at most {len(DASHES)} tables (models, and their live twins with --live)")
    tables = run(models, args.seed, args.per_type, args.rates, args.device, args.live)
    for model, table in tables.items():
        print(f"{model}: {args.per_type} held-out clips per question type from seed {args.seed}, greedy, exact match\n")
        print(markdown(table) + "\n")
    if args.plot:
        args.plot.write_text(svg_plot(tables, f"Accuracy on {args.per_type} held-out clips per question type"))
        print(f"saved {args.plot}")
    if args.json:
        print(json.dumps(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
