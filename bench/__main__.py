"""python -m bench: every serving scenario on one engine, printed as markdown tables, saved as one JSON
under bench/results/ with a PNG beside it. Exits 1 when a target is missed (each named on stderr) or a scenario
failed, after saving everything.

    python -m bench                        # random-qwen3-vl-50m, 16-frame 224x224 clips, 32 new tokens
    python -m bench --quick                # the same code paths on tiny-random: a few minutes on 2 cores
    python -m bench --keep /tmp/evs-bench  # make the long-GOP file there once (5 min on 2 cores), reuse it
    python -m bench --keep /tmp/evs-bench --docs   # and write docs/performance.md's tables, .json and .png
    python -m bench --plot bench/results/bench-full-20261201T120000Z.json    # redraw a saved run's PNG
    python -m bench --docs-from bench/results/bench-full-20261201T120000Z.json  # the docs from a saved run
"""

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from . import report, runner
from .decoding_hook import FAILED
from .plot import plot_file
from .targets import add_target_options, exit_status, parse_limits
from .workload import FULL, QUICK

RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny-random, fewer users and tokens: a smoke run")
    parser.add_argument("--model", help=f"the model to serve (default {FULL.model}, quick {QUICK.model})")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument(
        "--new-tokens", type=int, help=f"tokens per answer (default {FULL.new_tokens}, quick {QUICK.new_tokens})"
    )
    parser.add_argument("--out-dir", type=Path, default=RESULTS, help="where the JSON and PNG go")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="make (or reuse) the long-GOP file in this folder")
    parser.add_argument("--plot", type=Path, metavar="RESULT.json", help="only redraw this saved run's PNG")
    parser.add_argument(
        "--docs", action="store_true", help="also write the run's tables, JSON and PNG into docs/ (a full run)"
    )
    parser.add_argument("--docs-from", type=Path, metavar="RESULT.json", help="only write docs/ from this saved run")
    add_target_options(parser)
    args = parser.parse_args(argv)
    if args.docs and args.quick:
        parser.error("--docs takes a full run: the quick run's figures are not held to the targets.")
    try:
        args.limits = parse_limits(args.target)
    except ValueError as error:
        parser.error(str(error))
    return args


def write_docs(result: dict) -> int:
    """docs/ from a run (report.write_docs): 0, or 1 with its sentence on stderr."""
    try:
        written = report.write_docs(result)
    except ValueError as error:
        print(f"bench: {error}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.plot:
        print(f"saved {plot_file(args.plot)}")
        return 0
    if args.docs_from:
        return write_docs(json.loads(args.docs_from.read_text()))
    work = QUICK if args.quick else FULL
    work = dataclasses.replace(work, model=args.model or work.model, new_tokens=args.new_tokens or work.new_tokens)
    command = " ".join(["python -m bench", *(sys.argv[1:] if argv is None else argv)])
    result = runner.run(work, args.device, "quick" if args.quick else "full", command, args.keep, args.limits)
    print("\n" + report.markdown(result) + "\n")
    path = report.save(result, args.out_dir)
    print(f"saved {path}\nsaved {plot_file(path)}")
    status = exit_status(result["targets"], "bench", not args.no_fail_on_targets)
    if args.docs:
        status = write_docs(result) or status
    if FAILED in result["decoding"]:
        print(f"bench: the video reading scenario failed: {result['decoding'][FAILED]}", file=sys.stderr)
        return 1
    return status


if __name__ == "__main__":
    sys.exit(main())
