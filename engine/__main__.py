"""Command line: `python -m engine --video clip.mp4 --question "..." --pruning-rate 0.7 [--model tiny-random]`.

Prints the answer as it streams, then the stats as JSON. A user error prints its sentence and exits 2.
"""

import argparse
import json
import sys

from .config import EngineConfig, GenerationParams
from .engine import Engine
from .errors import InputError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m engine", description=__doc__.splitlines()[0])
    parser.add_argument("--video", required=True, help="path to a video file")
    parser.add_argument("--question", required=True)
    parser.add_argument("--pruning-rate", type=float, default=0.7, help="EVS rate q in [0, 1)")
    parser.add_argument("--model", default="tiny-random", help="tiny-random, tiny-random-qwen2.5-vl or a checkpoint")
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    params = GenerationParams(
        pruning_rate=args.pruning_rate, max_new_tokens=args.max_new_tokens, temperature=args.temperature
    )
    engine = Engine(EngineConfig(model=args.model, device=args.device))
    try:
        stream = engine.submit(video=args.video, question=args.question, params=params)
        for event in stream:
            if event.kind == "text":
                print(event.text, end="", flush=True)
            elif event.kind == "status":
                print(f"[{event.text}]", file=sys.stderr, flush=True)
            elif event.kind == "done":
                print()
                print(json.dumps(event.stats, indent=2))
        return 0
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    finally:
        engine.shutdown()


if __name__ == "__main__":
    sys.exit(main())
