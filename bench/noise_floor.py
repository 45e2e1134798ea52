"""The live noise floor: how much a still camera's sensor and codec noise moves the dissimilarity EVS ranks by, against
how much a real change moves it (docs/live.md, "The noise floor").

    python -m bench.noise_floor [--model tiny-trained]

A still scene (three held-out shapes clips' first frames at 64x64 and scaled to 640x480, and a 640x480 landscape)
is repeated for 4 s at 8 fps, with Gaussian sensor noise of sigma 0-8 levels, raw or through H.264 at 250 kbps-4
Mbps, sampled at 2 fps into 2-frame groups as a live session samples it; each line is the largest dissimilarity of
any token between consecutive groups. Then the real changes: the smallest over 20 held-out clips of their most
changed token per moving group, and a shape appearing on a grey background. A floor between the two keeps a still
camera's tokens out of causal EVS and its watches unasked, and every real change in.
"""

import argparse
import io
from fractions import Fraction

import av
import numpy as np
import torch

from assets.clips import _landscape
from assets.shapes import held_out_seeds, shape_clip
from engine.config import FrameSampling
from engine.families.base import VideoInputs
from engine.families.registry import family_for
from engine.live.group import group_of
from engine.loading.load import load_model
from pruning.evs import frame_dissimilarity

SOURCE_FPS = 8  # the still scenes' frame rate; a live session samples every 4th frame (2 fps)
STILL_FRAMES = 32  # 4 s: 8 frames at 2 fps, 4 groups
SIGMAS = (0, 1, 2, 4, 8)  # sensor noise, levels of 255
BITRATES = (None, 250_000, 1_000_000, 4_000_000)  # None: no codec


def group_dissimilarity(loaded, family, frames: np.ndarray) -> torch.Tensor:
    """(T - 1, h*w): each token's dissimilarity to the group before, frames (N, H, W, 3) sampled at 2 fps into
    T = N // 2 groups as a live session forms them."""
    sampling = FrameSampling()
    groups = [
        group_of(loaded, family, sampling, i, [(frames[2 * i], float(i)), (frames[2 * i + 1], i + 0.5)])
        for i in range(len(frames) // 2)
    ]
    inputs = [VideoInputs(g.pixel_values, g.grid_thw_patches, (1, *g.grid_hw), 0.0) for g in groups]
    with torch.inference_mode():
        embeds = torch.cat([f.embeds for f in family.encode_media(loaded.model, inputs)])
    h, w = groups[0].grid_hw
    return frame_dissimilarity(embeds, (len(groups), h, w))[1:].reshape(len(groups) - 1, -1)


def through_h264(frames: np.ndarray, bitrate: int) -> np.ndarray:
    """frames encoded with libx264 at bitrate (veryfast) and decoded back."""
    data = io.BytesIO()
    with av.open(data, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=Fraction(SOURCE_FPS))
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        stream.bit_rate, stream.options = bitrate, {"preset": "veryfast", "threads": "1"}
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    data.seek(0)
    with av.open(data) as container:
        return np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])


def noisy(frame: np.ndarray, count: int, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """(count, H, W, 3): frame repeated with Gaussian noise of sigma levels."""
    frames = np.repeat(frame[None], count, 0).astype(np.float32) + rng.normal(0, sigma, (count, *frame.shape))
    return frames.round().clip(0, 255).astype(np.uint8)


def scaled(frame: np.ndarray, width: int, height: int) -> np.ndarray:
    return av.VideoFrame.from_ndarray(frame, format="rgb24").to_ndarray(format="rgb24", width=width, height=height)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.noise_floor", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-trained")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    loaded = load_model(args.model, device="cpu")
    family, rng = family_for(loaded.model), np.random.default_rng(0)
    scenes = {}
    for seed in held_out_seeds(500, 3):
        first = shape_clip(seed).frames[0]
        scenes[f"shapes {seed} 64x64"], scenes[f"shapes {seed} 640x480"] = first, scaled(first, 640, 480)
    scenes["landscape 640x480"] = np.ascontiguousarray(_landscape(640, 480))
    print(
        "| still scene | " + " | ".join(f"σ {s}" for s in SIGMAS) + " |  (the largest over raw and H.264 0.25-4 Mbps)"
    )
    print("|---|" + "---|" * len(SIGMAS))
    still_max = 0.0
    for name, frame in scenes.items():
        cells = []
        for sigma in SIGMAS:
            frames = noisy(frame, STILL_FRAMES, sigma, rng)
            worst = max(
                float(group_dissimilarity(loaded, family, (f if b is None else through_h264(f, b))[::4]).max())
                for f, b in ((frames, bitrate) for bitrate in BITRATES)
            )
            still_max = max(still_max, worst)
            cells.append(f"{worst:.1e}")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    moving, appearing = [], []
    for seed in held_out_seeds(600, 20):
        clip = shape_clip(seed)
        moving.append(float(group_dissimilarity(loaded, family, clip.frames[::4][:16]).max(dim=1).values.min()))
        grey = np.full_like(clip.frames[0], 70)
        appearing.append(float(group_dissimilarity(loaded, family, np.stack([grey, grey, *clip.frames[:2]])).max()))
    print(f"still cameras: at most {still_max:.1e}")
    print(f"a moving shape's group: its most changed token at least {min(moving):.2f} (20 held-out clips)")
    print(f"a shape appearing: its most changed token at least {min(appearing):.2f}, median {np.median(appearing):.2f}")


if __name__ == "__main__":
    main()
