"""What choosing the kept tokens costs, per pruning method, against the vision forward that made the features.

    python bench/pruning_time.py [--model random:Qwen/Qwen3.5-0.8B] [--device cpu] [--q 0.7] [--repeats 20]
    (`python -m bench.pruning_time ...` from the repository root is the same; bench/gpu_check.py reports the
    same table on a GPU.)

One clip (a 2-minute 720p H.264 clip, read at the engine's default sampling for its device) is read and run
through the HF processor as the engine does, and through the model's vision tower once per repeat. On its
features each method's retention mask is timed alone, and so is the whole pruning step the engine runs
(`prune_prompt`: EVS's dissimilarity for the picture, the mask, the pruned layout and its positions: the
`evs_s` stat), each the median of its repeats after one warm-up call, against the vision forward's median of
three (a selection takes a millisecond or so, which any other process on a shared CPU can stretch tenfold: on a
CPU the figures are an upper bound). Both wait for the GPU where there is one. Each share is the pruning step's
seconds over the vision forward's, in the same run. The target, under 2 %, is checked by bench/gpu_check.py at
the GPU's defaults; on a CPU one vision forward of a released architecture takes seconds, which no selection
approaches, so it could not fail here and this command prints no verdict.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

# Run as a script from anywhere: the repo root holds the `engine`, `pruning`, `assets` and `bench` packages.
REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import pruning  # noqa: E402
from assets.clips import write_clip  # noqa: E402
from bench.targets import TARGETS, met_cell  # noqa: E402
from bench.vit_timing import prepared_prompts, vit_forward_s  # noqa: E402
from bench.workload import QUESTION  # noqa: E402
from engine import Engine, EngineConfig, FrameSampling  # noqa: E402
from engine.prompt.pruned import prune_prompt  # noqa: E402


def _median_s(work, repeats: int, device: torch.device) -> float:
    """The median of `repeats` calls of work() after one warm-up, in seconds, waiting for the GPU each time."""
    work()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        work()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def pruning_times(
    engine: Engine, clip: Path, sampling: FrameSampling, q: float, repeats: int, vit_repeats: int = 3
) -> dict:
    """{"grid_thw", "feature_dim", "vit_forward_s", "methods": {method: {"kept", "mask_s", "prune_s", "share"}}}
    for one clip at rate q: share = prune_s / vit_forward_s."""
    prompt = prepared_prompts(engine, [clip], sampling, QUESTION)[0]
    loaded, device = engine.loaded, engine.loaded.model.device
    vit_forward_s(engine, [prompt])  # warm-up: kernel selection, allocator growth
    vit_s = statistics.median(vit_forward_s(engine, [prompt]) for _ in range(vit_repeats))
    with torch.inference_mode():
        features = engine.family.encode_media(loaded.model, prompt.media)
        embeds, grid_thw = features[0].embeds, prompt.media[0].grid_thw
        methods = {}
        for method in pruning.PRUNING_METHODS:
            mask = pruning.retention_mask(embeds, grid_thw, q, method)
            mask_s = _median_s(lambda m=method: pruning.retention_mask(embeds, grid_thw, q, m), repeats, device)
            prune_s = _median_s(lambda m=method: prune_prompt(prompt, features, q, m), repeats, device)
            methods[method] = {"kept": int(mask.sum()), "mask_s": mask_s, "prune_s": prune_s, "share": prune_s / vit_s}
    return {
        "grid_thw": list(grid_thw),
        "feature_dim": int(embeds.shape[-1]),
        "dtype": str(embeds.dtype).removeprefix("torch."),
        "vit_forward_s": vit_s,
        "vit_repeats": vit_repeats,
        "repeats": repeats,
        "methods": methods,
    }


def markdown(result: dict, q: float, targets: list[dict] | None = None) -> str:
    """The table; with targets (the GPU check's target rows) a met column holds the share target's verdicts."""
    T, h, w = result["grid_thw"]
    lines = [
        f"{T} groups of {h}×{w} tokens ({T * h * w:,} video tokens, {result['feature_dim']} wide, "
        f"{result['dtype']}), q = {q:g}; one vision forward: {result['vit_forward_s'] * 1000:.1f} ms (median of "
        f"{result['vit_repeats']}); mask and pruning step: medians of {result['repeats']} calls\n",
        "| method | kept | mask ms | pruning step ms | share of the vision forward |" + (" met |" if targets else ""),
        "|---|---|---|---|---|" + ("---|" if targets else ""),
    ]
    for method, row in result["methods"].items():
        lines.append(
            f"| {method} | {row['kept']:,} | {row['mask_s'] * 1000:.2f} | {row['prune_s'] * 1000:.2f} | "
            f"{100 * row['share']:.2f} % |"
            + (f" {met_cell(targets, 'pruning_methods', {'method': method})} |" if targets else "")
        )
    if targets is None:
        lines.append(
            f"\nNo verdict on the {100 * TARGETS['pruning_share'].limit:g} % target here: bench/gpu_check.py checks it "
            "at the GPU's defaults."
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/pruning_time.py", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        default="random:Qwen/Qwen3.5-0.8B",
        help="random:<checkpoint> (no download), a checkpoint, or a tiny model",
    )
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    parser.add_argument("--q", type=float, default=0.7, help="the pruning rate (default 0.7)")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per method (default 20)")
    parser.add_argument("--json", action="store_true", help="also print the result as one JSON line, last")
    args = parser.parse_args(argv)
    with (
        Engine(EngineConfig(model=args.model, device=args.device, video_readers=1)) as engine,
        tempfile.TemporaryDirectory() as folder,
    ):
        clip = write_clip(
            Path(folder) / "clip.mp4",
            "moving_object",
            seconds=120.0,
            fps=24,
            size=(1280, 720),
            options={"preset": "ultrafast", "crf": "23", "threads": "0"},
        )
        result = pruning_times(engine, clip, engine.default_frame_sampling, args.q, args.repeats)
        print(f"{engine.model_info['name']} on {engine.loaded.model.device}\n")
    print(markdown(result, args.q))
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
