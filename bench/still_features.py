"""What skipping still patches costs the features (pruning/still.py): on held-out clips of the shapes family, as
users upload them (H.264), the trained offline model's vision features with the option against the whole groups'.

    python -m bench.still_features [--model tiny-trained] [--clips 100]

For each clip, the units the still rule encodes go through the tower as the shorter sequence the engine runs;
the same clip is encoded whole. Two errors, as 1 - cosine and as relative L2 (|a - b| / |b|) per token: an encoded
unit's features against its features in the whole group (the context it lost: the units left out), and a
skipped unit's carried features (the last encoded at its place) against what the tower gives it now (what it
missed by not being looked at). Prints the share of units encoded and the mean, 95th percentile and largest
error of each kind.
"""

import argparse
import sys
import tempfile
from pathlib import Path

import torch

import pruning
from assets.shapes import held_out_seeds, write_shape_clip
from engine.config import FrameSampling
from engine.families.registry import family_for
from engine.loading.load import load_model
from engine.prompt.units import encode_plan
from engine.prompt.unpruned import unpruned_prompt
from engine.reading.video import read_video

from .markdown import cell, table

SAMPLING = FrameSampling()  # the CPU's: 2 fps, 32 frames, 224x224 (the shapes clips are 64x64)


def errors(ours: torch.Tensor, whole: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(1 - cosine, relative L2) of each row of ours (n, D) against the same row of whole."""
    cosine = torch.nn.functional.cosine_similarity(ours.float(), whole.float(), dim=-1)
    return 1 - cosine, (ours.float() - whole.float()).norm(dim=-1) / whole.float().norm(dim=-1)


def measure(model: str, clips: int, folder: Path) -> dict:
    loaded = load_model(model, "cpu", Path(folder) / "models")
    family = family_for(loaded.model)
    levels = family.pixel_levels(loaded.processor)
    encoded_errors, skipped_errors, units, kept = [[], []], [[], []], 0, 0
    for seed in held_out_seeds(0, clips):
        path = write_shape_clip(folder / f"{seed}.mp4", seed)
        video = read_video(path, SAMPLING, max_seconds=60, max_bytes=1 << 30, timeout_s=60, temporal_patch=2)
        medium = unpruned_prompt(loaded, family, video, "?", [], "", SAMPLING.max_pixels_per_frame).media[0]
        plan = encode_plan(family, medium, levels, True, True, pruning.STILL_THRESHOLD_LEVELS)
        with torch.inference_mode():
            whole = family.encode_media(loaded.model, [medium])[0].embeds
            rows = family.encode_planned(loaded.model, [medium], [plan.encoded])[0]
            ours = rows.carried(plan.encoded).embeds
        mask = plan.encoded.reshape(-1)
        for target, picked in ((encoded_errors, mask), (skipped_errors, ~mask)):
            if bool(picked.any()):
                for kind, values in zip(target, errors(ours[picked], whole[picked])):
                    kind.append(values)
        units += mask.numel()
        kept += int(mask.sum())
    summary = {"model": model, "clips": clips, "threshold_levels": pruning.STILL_THRESHOLD_LEVELS}
    summary["encoded_share"] = kept / units
    for name, pair in (("encoded", encoded_errors), ("skipped", skipped_errors)):
        for measure_name, values in zip(("1-cos", "rel_l2"), pair):
            values = torch.cat(values) if values else torch.zeros(1)
            summary[f"{name} {measure_name}"] = {
                "mean": float(values.mean()),
                "p95": float(values.quantile(0.95)),
                "max": float(values.max()),
            }
    return summary


def markdown(summary: dict) -> str:
    rows = [
        [key, cell(value["mean"], 4), cell(value["p95"], 4), cell(value["max"], 4)]
        for key, value in summary.items()
        if isinstance(value, dict)
    ]
    return (
        f"{summary['model']}, {summary['clips']} held-out clips, threshold {summary['threshold_levels']:g} levels: "
        f"{100 * summary['encoded_share']:.1f}% of units encoded\n\n"
        + table(["units, error against the whole groups", "mean", "p95", "max"], rows)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.still_features", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-trained")
    parser.add_argument("--clips", type=int, default=100)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        print(markdown(measure(args.model, args.clips, Path(folder))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
