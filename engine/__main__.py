"""Command line: `python -m engine --video clip.mp4 --question "..." --pruning-rate 0.7 [--model tiny-random]`.

`--pruning-method vidcom2` (or uniform) prunes with another method than EVS. Prints the answer as it streams
(with --think, the model's thinking first, on stderr), then the stats as JSON. A model with an audio tower
hears the video's soundtrack unless --no-soundtrack. A user error prints its sentence and exits 2.

`python -m engine --describe --model random:Qwen/Qwen3-VL-4B-Instruct [--device cuda]` prints, as its last
line, one JSON object describing what loading that model would give (parameters, vision_parameters,
family, dtype, attention; for a checkpoint that also holds weights transformers does not build, such as
Qwen3.5's multi-token-prediction head, unbuilt_parameters and a note), built on the meta device: instant
on any machine, nothing downloaded or loaded.

`python -m engine --model random:Qwen/Qwen3.5-9B --plan-gib 40 130` prints the GPU memory plan
(engine/memory/plan.py) that model would get with 40 and with 130 GiB free after loading: bfloat16, the GPU's
default sampling, the default limits. It reads the config alone (random:<checkpoint>, a local folder, or a
Hub id already cached): no GPU needed, nothing built.
"""

import argparse
import json
import sys

from .checkpoints.random_weights import UnknownCheckpoint
from .config import GPU_FRAME_SAMPLING, EngineConfig, GenerationParams
from .engine import Engine
from .errors import InputError, one_line
from .front.door import request_params
from .loading.device import DeviceUnavailable
from .loading.load import ModelUnavailable, UnsupportedModel, describe_model, resolve_device
from .memory.dims import GIB
from .memory.plan import InsufficientMemory, checkpoint_config, checkpoint_plan


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m engine", description=__doc__.splitlines()[0])
    parser.add_argument("--describe", action="store_true",
                        help="print what loading --model on --device would give, as JSON, and exit")
    parser.add_argument("--plan-gib", type=float, nargs="+", metavar="GIB",
                        help="print the GPU memory plan --model would get with GIB free after loading, and exit")
    parser.add_argument("--video", help="path to a video file")
    parser.add_argument("--question")
    # Settings stay text here: the front door reads them, with the sentence every way in gives for a bad one.
    parser.add_argument("--pruning-rate",
                        help="EVS rate q in [0, 1) (default: the model's, Engine.model_info['default_pruning_rate'])")
    parser.add_argument("--pruning-method", help="which video tokens are pruned: evs (the default), vidcom2 or uniform")
    parser.add_argument("--think", action="store_true",
                        help="think before answering, for a model that can (the thinking goes to stderr)")
    parser.add_argument("--no-soundtrack", action="store_true",
                        help="answer from the frames alone: a model with an audio tower hears the soundtrack otherwise")
    parser.add_argument("--model", default="tiny-random",
                        help="a built-in model (tiny-random, tiny-random-qwen3.5, tiny-random-nemotron-omni, "
                             "tiny-trained, ...), a Hub id or folder, or random:<checkpoint>")
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    parser.add_argument("--max-new-tokens", help=f"default {GenerationParams.max_new_tokens}")
    parser.add_argument("--temperature", help=f"0 answers greedily (default {GenerationParams.temperature:g})")
    args = parser.parse_args(argv)
    if not (args.describe or args.plan_gib) and (args.video is None or args.question is None):
        parser.error("--video and --question are required (or --describe, or --plan-gib)")
    if args.plan_gib and min(args.plan_gib) <= 0:
        parser.error("--plan-gib takes sizes above 0")
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


def print_plans(model: str, free_gib: list[float]) -> int:
    try:
        config = checkpoint_config(model)
        plans = [checkpoint_plan(config, int(gib * GIB)) for gib in free_gib]
    except (UnknownCheckpoint, OSError, ValueError, AttributeError) as error:
        print(f"error: cannot plan {model!r}: {one_line(error)}", file=sys.stderr)
        return 2
    sampling = GPU_FRAME_SAMPLING
    print(f"{model} ({config.model_type}), bfloat16, the GPU's default sampling ({sampling.fps:g} fps, at most "
          f"{sampling.max_frames} frames of {sampling.max_pixels_per_frame:,} pixels)")
    for plan in plans:
        print(plan.summary())
        for reason in plan.reasons:
            print(f"  {reason}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.describe:
        return describe(args.model, args.device)
    if args.plan_gib:
        return print_plans(args.model, args.plan_gib)
    try:
        engine = Engine(EngineConfig(model=args.model, device=args.device))
    except CANNOT_SERVE as error:
        print(f"error: {one_line(error)}", file=sys.stderr)
        return 2
    try:
        params = request_params(engine, pruning_rate=args.pruning_rate, pruning_method=args.pruning_method,
                                max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                enable_thinking=args.think, hear_soundtrack=False if args.no_soundtrack else None)
        stream = engine.submit(video=args.video, question=args.question, params=params)
        for event in stream:
            if event.kind == "text":
                print(event.text, end="", flush=True)
            elif event.kind == "thinking":
                print(event.text, end="", file=sys.stderr, flush=True)
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
