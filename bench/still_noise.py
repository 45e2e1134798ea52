"""The still-patch threshold, measured (pruning/still.py): what a still camera's sensor noise and an H.264 encoder's
noise make of a merge unit's change, against what a moving object makes of it, at the engine's frame sizes.

    python -m bench.still_noise            # about 3 minutes on 2 CPU cores; prints one table, writes JSON

A 640x480 scene at 8 fps, 8 s, sampled at 2 fps as the engine samples (16 frames, 8 temporal groups), through
Qwen3-VL's processor (tiny-random's: the same resize, patch 16, merge 2 and normalization as the checkpoints') at
the CPU's and the GPU's frame cap. Each clip twice: the still scene with sensor noise of sigma levels (Gaussian,
per pixel, channel and frame), and the same with a square moving over it; written losslessly (the noise as the
sensor gave it) or by x264 at CRF 23 and 28 (what a phone or screen recorder stores). For each: the unit changes
of the still scene's units (consecutive groups; the largest and the 99.9th percentile), the smallest change of a
unit the square entered or left (those whose noise-free pixels changed), and at each candidate threshold the
share of still units encoded after the first group and of the square's units missed (a unit the square
entered or left: its noise-free pixels changed by a level or more).
"""

import argparse
import json
import sys
import tempfile
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import torch

import pruning
from assets.clips import _landscape, _moving_object
from engine.config import FrameSampling
from engine.families.registry import family_for
from engine.loading.load import load_model
from engine.prompt.unpruned import unpruned_prompt
from engine.reading.video import read_video

from .markdown import cell, table

RESULTS = Path(__file__).resolve().parent / "results"
SIZE, FPS, SECONDS = (640, 480), 8, 8.0
SAMPLING_FPS = 2.0
SIGMAS = (0.0, 2.0, 4.0, 8.0)
CODECS = {
    "lossless": {"qp": "0", "preset": "ultrafast", "threads": "1"},
    "x264 crf 23": {"crf": "23", "preset": "medium", "threads": "1"},
    "x264 crf 28": {"crf": "28", "preset": "medium", "threads": "1"},
}
FRAME_CAPS = {"CPU 224x224": 224 * 224, "GPU 448x448": 448 * 448}
THRESHOLDS = (2.0, 4.0, 6.0, 8.0, 12.0)


def frames(moving: bool, sigma: float) -> np.ndarray:
    """(N, H, W, 3) uint8: the still scene (or the moving square over it), with sensor noise of sigma levels."""
    count, (width, height) = round(SECONDS * FPS), SIZE
    clean = [_moving_object(i, count, width, height) if moving else _landscape(width, height) for i in range(count)]
    rng = np.random.default_rng(7)
    return np.stack([(f + rng.normal(0.0, sigma, f.shape)).round().clip(0, 255).astype(np.uint8) for f in clean])


def write(path: Path, video: np.ndarray, options: dict) -> Path:
    with av.open(str(path), mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=Fraction(FPS))
        stream.width, stream.height, stream.pix_fmt = video.shape[2], video.shape[1], "yuv420p"
        stream.options = options
        for frame in video:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def unit_pixels(loaded, family, path: Path, pixels: int) -> torch.Tensor:
    """(T, U, S, C, F, P) the processor's pixels of the file, sampled as the engine samples."""
    sampling = FrameSampling(fps=SAMPLING_FPS, max_frames=32, max_pixels_per_frame=pixels)
    video = read_video(path, sampling, max_seconds=60, max_bytes=1 << 30, timeout_s=60, temporal_patch=2)
    medium = unpruned_prompt(loaded, family, video, "?", [], "", pixels).media[0]
    return family.unit_pixels(medium)


def consecutive_changes(units: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """(T-1, U): each unit's change since the group before."""
    return torch.stack([pruning.unit_change(units[t], units[t - 1], levels) for t in range(1, len(units))])


def measure(loaded, family, folder: Path) -> list[dict]:
    levels = family.pixel_levels(loaded.processor)
    rows = []
    for cap_name, pixels in FRAME_CAPS.items():
        # The square's units: those whose noise-free, losslessly written pixels change by a level or more between
        # groups (the resize spreads a trace of the square's edge into the next unit, far under a level).
        clean = unit_pixels(loaded, family, write(folder / "clean.mp4", frames(True, 0.0), CODECS["lossless"]), pixels)
        moved = consecutive_changes(clean, levels) >= 1.0
        for codec, options in CODECS.items():
            for sigma in SIGMAS:
                still = unit_pixels(loaded, family, write(folder / "still.mp4", frames(False, sigma), options), pixels)
                moving = unit_pixels(loaded, family, write(folder / "moving.mp4", frames(True, sigma), options), pixels)
                noise = consecutive_changes(still, levels).flatten()
                motion = consecutive_changes(moving, levels)[moved]
                row = {
                    "frame_cap": cap_name,
                    "codec": codec,
                    "sigma": sigma,
                    "still_max": float(noise.max()),
                    "still_p999": float(noise.quantile(0.999)),
                    "moving_min": float(motion.min()),
                    "moving_p01": float(motion.quantile(0.01)),
                    "still_encoded": {},
                    "moving_missed": {},
                }
                for threshold in THRESHOLDS:
                    encoded = pruning.still_units(still, levels, threshold)[1:]
                    row["still_encoded"][threshold] = float(encoded.float().mean())
                    caught = pruning.still_units(moving, levels, threshold)[1:]
                    row["moving_missed"][threshold] = float((~caught[moved]).float().mean())
                rows.append(row)
                print(markdown([row]).splitlines()[-1], flush=True)
    return rows


def markdown(rows: list[dict]) -> str:
    headers = ["frame cap", "codec", "noise σ", "still: max (p99.9)", "square: min (p1)"]
    headers += [f"τ = {t:g}: still encoded / square missed" for t in THRESHOLDS]
    body = [
        [
            row["frame_cap"],
            row["codec"],
            f"{row['sigma']:g}",
            f"{cell(row['still_max'], 2)} ({cell(row['still_p999'], 2)})",
            f"{cell(row['moving_min'], 1)} ({cell(row['moving_p01'], 1)})",
            *(f"{100 * row['still_encoded'][t]:.1f}% / {100 * row['moving_missed'][t]:.1f}%" for t in THRESHOLDS),
        ]
        for row in rows
    ]
    return table(headers, body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.still_noise", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "still_noise.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        loaded = load_model("tiny-random", "cpu", Path(folder) / "models")
        rows = measure(loaded, family_for(loaded.model), Path(folder))
    print("\n" + markdown(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": " ".join(["python -m bench.still_noise", *(argv or [])]), "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
