"""python -m bench: every serving scenario on one engine, printed as markdown tables, saved as one JSON
under bench/results/ with a PNG beside it.

    python -m bench                        # random-qwen3-vl-50m, 16-frame 224x224 clips, 32 new tokens
    python -m bench --quick                # the same code paths on tiny-random: about a minute on 2 cores
    python -m bench --keep /tmp/evs-bench  # make the long-GOP file there once (5 min on 2 cores), reuse it
    python -m bench --plot bench/results/bench-full-20261201T120000Z.json    # redraw a saved run's PNG
"""

import argparse
import dataclasses
import sys
from pathlib import Path

from . import report, runner
from .decoding_hook import FAILED
from .plot import plot_file
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
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.plot:
        print(f"saved {plot_file(args.plot)}")
        return 0
    work = QUICK if args.quick else FULL
    work = dataclasses.replace(work, model=args.model or work.model, new_tokens=args.new_tokens or work.new_tokens)
    command = " ".join(["python -m bench", *(sys.argv[1:] if argv is None else argv)])
    result = runner.run(work, args.device, "quick" if args.quick else "full", command, args.keep)
    print("\n" + report.markdown(result) + "\n")
    path = report.save(result, args.out_dir)
    print(f"saved {path}\nsaved {plot_file(path)}")
    if FAILED in result["decoding"]:
        print(f"bench: the video reading scenario failed: {result['decoding'][FAILED]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
