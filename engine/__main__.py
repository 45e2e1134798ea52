"""Command line: `python -m engine --video clip.mp4 --question "..." --pruning-rate 0.7 [--model tiny-random]`.

Prints the answer as it streams, then the stats as JSON. A user error prints its sentence and exits 2.

`python -m engine --describe --model random:Qwen/Qwen3-VL-4B-Instruct [--device cuda]` prints, as its last
line, one JSON object describing what loading that model would give (parameters, vision_parameters,
family, dtype, attention), built on the meta device: instant on any machine, nothing downloaded or loaded.
"""

import argparse
import json
import sys

from .config import EngineConfig, GenerationParams
from .engine import Engine
from .errors import InputError, one_line
from .memory_plan import InsufficientMemory
from .hardware import DeviceUnavailable
from .models import ModelUnavailable, UnsupportedModel, describe_model, resolve_device


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m engine", description=__doc__.splitlines()[0])
    parser.add_argument("--describe", action="store_true",
                        help="print what loading --model on --device would give, as JSON, and exit")
    parser.add_argument("--video", help="path to a video file")
    parser.add_argument("--question")
    parser.add_argument("--pruning-rate", type=float, default=0.7, help="EVS rate q in [0, 1)")
    parser.add_argument("--model", default="tiny-random",
                        help="tiny-random, tiny-random-qwen2.5-vl, a checkpoint, or random:<checkpoint>")
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args(argv)
    if not args.describe and (args.video is None or args.question is None):
        parser.error("--video and --question are required (or --describe)")
    return args


# What keeps a model from loading or being served here: each says why in its message.
CANNOT_SERVE = (ModelUnavailable, UnsupportedModel, DeviceUnavailable, InsufficientMemory)


def describe(model: str, device: str) -> int:
    try:
        summary = describe_model(model, device=resolve_device(device))
    except CANNOT_SERVE as error:
        print(f"error: {one_line(error)}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.describe:
        return describe(args.model, args.device)
    params = GenerationParams(
        pruning_rate=args.pruning_rate, max_new_tokens=args.max_new_tokens, temperature=args.temperature
    )
    try:
        engine = Engine(EngineConfig(model=args.model, device=args.device))
    except CANNOT_SERVE as error:
        print(f"error: {one_line(error)}", file=sys.stderr)
        return 2
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
