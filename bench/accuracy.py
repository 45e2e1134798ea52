"""Answer accuracy against the pruning rate, for each pruning method, on held-out clips of the synthetic shapes
family.

    python bench/accuracy.py [--model tiny-trained [--model tiny-trained-plain ...]] [--method evs,vidcom2,uniform]
                             [--seed 0] [--per-type 100] [--rates 0,0.3,0.5,0.7,0.9] [--plot assets/accuracy.svg]
                             [--json] [--live] [--skip-still-patches]
    (`python -m bench.accuracy ...` from the repository root is the same.)

Each held-out clip (assets/shapes.py, never trained on) is written as an H.264 MP4 and asked every
question type through the Engine, greedy, at each rate with each method (default evs alone); an answer counts
when it is exactly the expected answer ("blue", "left", "3"). The "pair" type asks about two clips at once: each
held-out clip and the next one of another colour (clip_pair), "Which clip has the blue shape, first or
second?", each clip pruned on its own. With --live (EVS alone: the one method with a causal form), each clip is
also played into a live session (docs/live.md), its frames pushed at their 8 fps capture times, and asked every
single-clip question type at the end: a second table per model, "<model> live". Prints one markdown table per
model: question type x rate for one method; for several, a row per question type and method, the mean of the
four single-clip types, and the video tokens each method kept of one clip's (of how many). --plot draws every
model in one chart (one method), or a panel per model and question type with a line per method (several);
--json also prints one JSON object as the last line: {"tiny-trained": {"evs": {"0.0": {"accuracy": {"colour":
1.0, ...}, "video_tokens_kept": 32.0, "video_tokens_total": 32.0}, ...}, ...}, ...} (a live table has
"accuracy" alone). --skip-still-patches asks every question with GenerationParams.skip_still_patches (the units
that did not change since they were last encoded skip the vision tower and the prompt; docs/performance.md).
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from assets.shapes import FPS, PAIR, QUESTIONS, asked, clip_pair, held_out_seeds, shape_clip, write_shape_clip  # noqa: E402
from bench.accuracy_plot import DASHES, KINDS, kinds_of, svg_methods_plot, svg_plot  # noqa: E402
from bench.admitted import submit_admitted  # noqa: E402
from engine import Engine, EngineConfig, GenerationParams  # noqa: E402
from pruning import PRUNING_METHODS  # noqa: E402

MAX_NEW_TOKENS = 8  # the longest answer ("triangle") and <|im_end|> fit


def parse_rates(text: str) -> list[float]:
    return [float(rate) for rate in text.split(",") if rate.strip()]


def parse_methods(text: str) -> list[str]:
    methods = [method.strip() for method in text.split(",") if method.strip()]
    unknown = [method for method in methods if method not in PRUNING_METHODS]
    if unknown or not methods:
        raise argparse.ArgumentTypeError(f"methods are {', '.join(PRUNING_METHODS)}; got {text!r}")
    return methods


def clip_files(folder: Path, seeds: list[int]) -> dict[int, Path]:
    """{seed: its clip's MP4 in folder} for the seeds and, for the pair question, each one's pair's second clip."""
    needed = dict.fromkeys([*seeds, *(clip_pair(s).seeds[1] for s in seeds)])
    return {s: write_shape_clip(folder / f"{s}.mp4", s) for s in needed}


def measured(
    engine: Engine,
    clips: dict[int, Path],
    rates: list[float],
    method: str,
    seeds: list[int],
    kinds: tuple[str, ...] = KINDS,
    skip: bool = False,
) -> dict[str, dict]:
    """{str(rate): {"accuracy": {question type: share of seeds answered exactly}, "video_tokens_kept": mean,
    "video_tokens_total": mean}} with one pruning method; the token means are one clip's (the single-clip
    questions'). clips: clip_files' for the seeds. Each rate's requests go in at once, as many as the engine takes;
    skip: every request skips still patches."""
    table: dict[str, dict] = {}
    for rate in rates:
        params = GenerationParams(
            pruning_rate=rate, pruning_method=method, max_new_tokens=MAX_NEW_TOKENS, skip_still_patches=skip
        )
        streams, submitted = [], []
        for kind in kinds:
            for seed in seeds:
                shown, text, expected = asked(seed, kind)
                media = [clips[s] for s in shown]
                submitted.append(submit_admitted(engine, submitted, media=media, question=text, params=params))
                streams.append((kind, expected, submitted[-1]))
        right = dict.fromkeys(kinds, 0)
        kept, total = [], []
        for kind, expected, stream in streams:
            answer = stream.result()
            right[kind] += answer.text.strip() == expected
            if kind != PAIR:
                kept.append(answer.stats["video_tokens_kept"])
                total.append(answer.stats["video_tokens_total"])
        table[str(rate)] = {
            "accuracy": {kind: right[kind] / len(seeds) for kind in kinds},
            "video_tokens_kept": sum(kept) / len(kept),
            "video_tokens_total": sum(total) / len(total),
        }
    return table


def live_accuracy(
    engine: Engine, seeds: list[int], rates: list[float], skip: bool = False
) -> dict[str, dict[str, float]]:
    """The single-clip table through live sessions: each clip's frames pushed at their capture times (waiting for
    the session rather than dropping a frame), then every single-clip question type asked of the stream at once."""
    table: dict[str, dict[str, float]] = {}
    for rate in rates:
        params = GenerationParams(pruning_rate=rate, max_new_tokens=MAX_NEW_TOKENS, skip_still_patches=skip)
        right = {kind: 0 for kind in QUESTIONS}
        for seed in seeds:
            clip = shape_clip(seed)
            with engine.open_live(params) as live:
                for index, frame in enumerate(clip.frames):
                    live.push(frame, index / FPS)
                    live.wait(60)
                streams = {kind: live.ask(QUESTIONS[kind]) for kind in QUESTIONS}
                for kind, stream in streams.items():
                    right[kind] += stream.result().text.strip() == clip.answer(kind)
        table[str(rate)] = {kind: right[kind] / len(seeds) for kind in QUESTIONS}
    return table


def accuracy(
    engine: Engine,
    clips: dict[int, Path],
    rates: list[float],
    seeds: list[int],
    method: str = GenerationParams.pruning_method,
    kinds: tuple[str, ...] = KINDS,
) -> dict[str, dict[str, float]]:
    """{str(rate): {question type: share of seeds answered exactly}} with one pruning method."""
    return accuracy_of(measured(engine, clips, rates, method, seeds, kinds))


def accuracy_of(table: dict[str, dict]) -> dict[str, dict[str, float]]:
    """The accuracy part of a `measured` table: {str(rate): {question type: share}}."""
    return {rate: row["accuracy"] for rate, row in table.items()}


def run(
    models: list[str],
    seed: int,
    per_type: int,
    rates: list[float],
    device: str = "cpu",
    methods: tuple[str, ...] = (GenerationParams.pruning_method,),
    live: bool = False,
    skip: bool = False,
) -> dict:
    """{model: {method: measured(...)}} on the same held-out clips; with live, also {model + " live": {"evs":
    {rate: {"accuracy": the live table's row}}}} (a live session prunes with causal EVS)."""
    with tempfile.TemporaryDirectory() as folder:
        seeds = held_out_seeds(seed, per_type)
        clips = clip_files(Path(folder), seeds)
        results = {}
        for model in models:
            # Caches stay on: a clip's features are reused across rates and methods, which changes no answer
            # (the conversation state is kept per method and rate).
            with Engine(EngineConfig(model=model, device=device, max_queue=len(seeds) * len(KINDS))) as engine:
                results[model] = {
                    method: measured(engine, clips, rates, method, seeds, skip=skip) for method in methods
                }
                if live:
                    results[f"{model} live"] = {
                        "evs": {
                            rate: {"accuracy": row} for rate, row in live_accuracy(engine, seeds, rates, skip).items()
                        }
                    }
        return results


def kind_label(kind: str) -> str:
    return "pair (two clips)" if kind == PAIR else kind


def markdown(table: dict[str, dict[str, float]]) -> str:
    """Question type x rate, for one method: table is {rate: {question type: share}}."""
    rates = list(table)
    lines = ["| question | " + " | ".join(f"q = {rate}" for rate in rates) + " |", "|---|" + "---|" * len(rates)]
    for kind in kinds_of(table):
        lines.append(f"| {kind_label(kind)} | " + " | ".join(f"{table[rate][kind]:.2f}" for rate in rates) + " |")
    return "\n".join(lines)


def methods_markdown(by_method: dict[str, dict[str, dict]]) -> str:
    """One model's methods side by side: a row per question type and method, the mean of the four single-clip
    question types, and the video tokens each method kept of one clip's at each rate (of how many). by_method:
    {method: measured(...)}."""
    methods = list(by_method)
    rates = list(by_method[methods[0]])
    total = by_method[methods[0]][rates[0]]["video_tokens_total"]
    lines = [
        "| question | method | " + " | ".join(f"q = {rate}" for rate in rates) + " |",
        "|---|---|" + "---|" * len(rates),
    ]

    def row(label: str, method: str, values) -> str:
        return f"| {label} | {method} | " + " | ".join(values) + " |"

    for kind in kinds_of({rate: row["accuracy"] for rate, row in by_method[methods[0]].items()}):
        lines += [
            row(kind_label(kind), method, (f"{by_method[method][rate]['accuracy'][kind]:.2f}" for rate in rates))
            for method in methods
        ]
    lines += [
        row(
            "mean of the four single-clip",
            method,
            (
                f"**{sum(by_method[method][rate]['accuracy'][kind] for kind in QUESTIONS) / len(QUESTIONS):.2f}**"
                for rate in rates
            ),
        )
        for method in methods
    ]
    lines += [
        row(
            f"video tokens kept (of {total:g})",
            method,
            (f"{by_method[method][rate]['video_tokens_kept']:g}" for rate in rates),
        )
        for method in methods
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/accuracy.py", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", action="append", help="a model to measure (repeat for several); default tiny-trained"
    )
    parser.add_argument("--device", default="cpu", choices=["auto", "cuda", "cpu"])
    parser.add_argument("--seed", type=int, default=0, help="first held-out clip")
    parser.add_argument("--per-type", type=int, default=100, help="held-out clips, each asked every question")
    parser.add_argument("--rates", type=parse_rates, default=[0.0, 0.3, 0.5, 0.7, 0.9])
    parser.add_argument(
        "--method",
        type=parse_methods,
        default=[GenerationParams.pruning_method],
        help=f"pruning methods, comma-separated: {', '.join(PRUNING_METHODS)} (default evs)",
    )
    parser.add_argument("--plot", type=Path, help="also draw the table as an SVG line chart to this file")
    parser.add_argument("--json", action="store_true", help="also print the table as one JSON line, last")
    parser.add_argument("--live", action="store_true", help="also ask every clip through a live session")
    parser.add_argument(
        "--skip-still-patches", action="store_true", help="skip still patches before the vision tower in every request"
    )
    args = parser.parse_args(argv)
    models = args.model or ["tiny-trained"]
    if args.live and args.method != ["evs"]:
        parser.error("--live measures causal EVS, the one method a live session prunes with: use --method evs")
    if len(models) * (2 if args.live else 1) > len(DASHES) and len(args.method) == 1:
        parser.error(f"at most {len(DASHES)} tables (models, and their live twins with --live)")
    results = run(
        models,
        args.seed,
        args.per_type,
        args.rates,
        args.device,
        tuple(args.method),
        args.live,
        args.skip_still_patches,
    )
    for model, by_method in results.items():
        print(f"{model}: {args.per_type} held-out clips per question type from seed {args.seed}, greedy, exact match\n")
        if len(args.method) == 1:
            print(markdown(accuracy_of(by_method[args.method[0]])) + "\n")
        else:
            print(methods_markdown(by_method) + "\n")
    if args.plot:
        title = f"Accuracy on {args.per_type} held-out clips per question type"
        if len(args.method) == 1:
            args.plot.write_text(
                svg_plot({model: accuracy_of(by_method[args.method[0]]) for model, by_method in results.items()}, title)
            )
        else:
            args.plot.write_text(svg_methods_plot(results, f"{title}, by pruning method"))
        print(f"saved {args.plot}")
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
