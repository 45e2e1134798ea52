"""First thing to run on new hardware: the real model on the example clips at q = 0 and q = 0.7.

    python bench/gpu_check.py [--model Qwen/Qwen3-VL-4B-Instruct] [--device auto|cuda|cpu]
    python bench/gpu_check.py --model tiny-random --device cpu      # CPU smoke test

Prints the model setup (device, dtype, attention), then one row per (clip, q): tokens kept, TTFT,
total time, peak GPU memory and the answer; then the same requests submitted all at once, to exercise
the batched ViT forward and batched decode. Exits 1 on any error or failed check, 0 otherwise.
Caches are off so every request does its full work and the TTFTs compare.
"""

import argparse
import sys
import time
import traceback
from pathlib import Path

import torch

# Run as a script from anywhere: the repo root holds the `engine` and `evs` packages.
REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import evs  # noqa: E402
from engine import Answer, Engine, EngineConfig, GenerationParams  # noqa: E402
from engine.models import ModelUnavailable  # noqa: E402

CLIPS_DIR = REPO_ROOT / "assets" / "examples"
PRUNING_RATES = (0.0, 0.7)
QUESTION = "Describe what happens in this video in one or two sentences."
GIB = 1024**3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python bench/gpu_check.py", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Qwen/Qwen3-VL-4B-Instruct")
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    parser.add_argument("--clips", type=Path, default=CLIPS_DIR, help="folder of .mp4 clips")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per request")
    return parser.parse_args(argv)


def check_answer(answer: Answer) -> list[str]:
    """What is wrong with one finished request, as sentences; empty when it looks right."""
    stats, problems = answer.stats, []
    T, h, w = stats["grid_thw"]
    expected_kept = evs.retained_token_count(h * w, T, stats["pruning_rate"])
    if stats["video_tokens_kept"] != expected_kept:
        problems.append(f"kept {stats['video_tokens_kept']} video tokens, EVS says {expected_kept}")
    if sum(stats["tokens_kept_per_frame"]) != stats["video_tokens_kept"]:
        problems.append("tokens_kept_per_frame does not add up to video_tokens_kept")
    if stats["generated_tokens"] < 1:
        problems.append("no tokens were generated")
    return problems


def _peak_memory(device: str) -> str:
    return f"{torch.cuda.max_memory_allocated() / GIB:.2f} GiB" if device.startswith("cuda") else "n/a"


def _print_row(clip: str, answer: Answer, peak_memory: str) -> None:
    s = answer.stats
    text = " ".join(answer.text.split())
    print(f"{clip:<16} q={s['pruning_rate']:<4} tokens {s['video_tokens_kept']:>5}/{s['video_tokens_total']:<5} "
          f"ttft {s['ttft_s']:6.2f} s  total {s['total_s']:6.2f} s  gen {s['generated_tokens']:>3}  "
          f"vit batch {s['vit_batch_requests']}  decode batch {s['decode_batch_max']}  peak {peak_memory}")
    print(f"    {text[:300]!r}")


def run_checks(engine: Engine, clips: list[Path], args: argparse.Namespace) -> list[str]:
    """Sequential then concurrent requests; returns every problem found."""
    device = engine.model_info["device"]
    problems: list[str] = []
    params = [GenerationParams(pruning_rate=q, max_new_tokens=args.max_new_tokens) for q in PRUNING_RATES]

    # A first request pays for CUDA context, kernel selection and allocator growth; keep it out of the table.
    engine.submit(video=clips[0], question=QUESTION, params=params[0]).result(timeout_s=args.timeout_s)

    print("\n== one request at a time ==")
    for clip in clips:
        for p in params:
            if device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            answer = engine.submit(video=clip, question=QUESTION, params=p).result(timeout_s=args.timeout_s)
            _print_row(clip.stem, answer, _peak_memory(device))
            problems += [f"{clip.name} q={p.pruning_rate}: {msg}" for msg in check_answer(answer)]

    print(f"\n== {len(clips) * len(params)} requests at once ==")
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    streams = [(clip, engine.submit(video=clip, question=QUESTION, params=p)) for clip in clips for p in params]
    answers = [(clip, stream.result(timeout_s=args.timeout_s)) for clip, stream in streams]
    wall_s = time.perf_counter() - start
    for clip, answer in answers:
        _print_row(clip.stem, answer, _peak_memory(device))
        problems += [f"{clip.name} q={answer.stats['pruning_rate']} (batched): {msg}" for msg in check_answer(answer)]
    print(f"wall time {wall_s:.2f} s for {len(answers)} requests")
    return problems


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    clips = sorted(args.clips.glob("*.mp4"))
    if not clips:
        print(f"error: no .mp4 clips in {args.clips} (python -m assets.make_examples writes them)", file=sys.stderr)
        return 1
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return 1
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, GPU "
          f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'}")
    try:
        import flash_attn

        print(f"flash-attn {flash_attn.__version__}")
    except ImportError:
        print("flash-attn not installed: attention runs on sdpa")

    # Caches off: every request decodes, encodes and prefills for itself.
    config = EngineConfig(model=args.model, device=args.device, feature_cache_bytes=0, prefix_cache_bytes=0)
    try:
        start = time.perf_counter()
        engine = Engine(config)
    except ModelUnavailable as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except Exception:
        traceback.print_exc()
        return 1
    info = engine.model_info
    print(f"loaded {info['name']} ({info['family']}) in {time.perf_counter() - start:.1f} s on {info['device']}, "
          f"dtype {info['dtype']}, attention {info['attn']}" + (" [random weights]" if info["is_tiny"] else ""))
    if info["device"].startswith("cuda"):
        print(f"weights: {torch.cuda.memory_allocated() / GIB:.2f} GiB")
    try:
        problems = run_checks(engine, clips, args)
    except Exception:
        traceback.print_exc()
        return 1
    finally:
        engine.shutdown()
    for problem in problems:
        print(f"FAIL {problem}")
    print("gpu_check: " + ("FAILED" if problems else "all checks passed"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
