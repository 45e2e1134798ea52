"""The vision tower's share of prefill, and what exact reuse and skipping still patches save (docs/performance.md,
"The vision encoder sees only what changed"); shared by `python -m bench` and bench/gpu_check.py.

    python -m bench.vision_skip [--quick] [--part kinds|share|all] [--device cpu]

- Three kinds of clip (`kind_rows`), each x264 at CRF 23 as a phone or screen recorder stores it: a screen
  recording (four slides over the clip), a still camera (sensor noise, one moving object) and a handheld pan. Each
  answered alone at q = 0.7 three ways: without (EngineConfig.vision_reuse off, nothing skipped), with exact reuse
  (the default: an exact repeat of the group before is not encoded) and with reuse and skip_still_patches; the
  vision patches encoded of the total, the ViT's seconds and TTFT, and each over the first way's.
- The ViT's share of prefill time (`share_rows`) on real checkpoints' shapes with random weights, at a reduced
  frame size, on the still camera clip at q = 0, 0.7 and 0.9, without and with skipping (exact reuse is on in
  both and finds no exact repeat on a noisy camera). On a CPU the towers are cut to a few layers each (the widths,
  heads, vocabulary and, but for the expert count, the MoE are the checkpoint's) and the ViT's and the language
  model's seconds are scaled back by their layer ratios; what the cut leaves out (patch embedding, merger,
  embeddings, the head over one position) is counted once, so the shares are slightly off the full model's.
"""

import argparse
import contextlib
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from assets.clips import write_clip
from engine import Engine, EngineConfig, FrameSampling, GenerationParams
from engine.checkpoints.random_weights import checkpoint_spec

from .markdown import cell, table
from .targets import markdown as targets_markdown
from .targets import met_cell, vision_target_rows
from .workload import QUESTION, params

KINDS = {"screen recording": "slides", "still camera": "still_camera", "handheld pan": "handheld"}
# (name, EngineConfig.vision_reuse, GenerationParams.skip_still_patches)
WAYS = (("without", False, False), ("exact reuse", True, False), ("reuse + skip", True, True))
KIND_RATE = 0.7
SHARE_RATES = (0.0, 0.7, 0.9)
RECORDER = {"crf": "23", "preset": "medium", "threads": "1"}  # x264 as a recorder stores it
NO_CACHES = dict(feature_cache_bytes=0, prefix_cache_bytes=0, frame_cache_bytes=0)


@dataclass(frozen=True)
class Shape:
    """A checkpoint's shape cut to vision_depth ViT blocks and text_layers language-model layers (experts: the
    MoE's expert count, None: the checkpoint's)."""

    checkpoint: str
    vision_depth: int
    text_layers: int
    experts: int | None = None


SHAPES = (
    Shape("Qwen/Qwen3-VL-2B-Instruct", 6, 7),  # 24 and 28: a quarter of each
    Shape("Qwen/Qwen3-VL-4B-Instruct", 4, 6),  # 24 and 36: a sixth
    Shape("Qwen/Qwen3.5-35B-A3B", 3, 4, experts=32),  # 27 and 40 (3 linear-attention layers and 1 full a block)
)


@dataclass(frozen=True)
class SkipWork:
    """model: the clip kinds' engine model. sampling: both parts' frame sampling. size and seconds: the clips'.
    new_tokens: per answer; repeats: runs per clip kind measurement (median TTFT kept); shapes: the share's
    checkpoints, each measurement run share_repeats times (the real shapes take tens of seconds a run on a CPU)."""

    model: str
    sampling: FrameSampling
    size: tuple[int, int]
    seconds: float
    new_tokens: int
    repeats: int
    shapes: tuple[Shape, ...] = SHAPES
    share_repeats: int = 1


FULL = SkipWork(
    "random-qwen3-vl-50m", FrameSampling(fps=2.0, max_frames=24, max_pixels_per_frame=224 * 224), (640, 480), 12.0, 8, 3
)
QUICK = SkipWork(
    "tiny-random", FrameSampling(fps=2.0, max_frames=8, max_pixels_per_frame=112 * 112), (160, 120), 4.0, 2, 1
)


def clip(folder: Path, kind: str, work: SkipWork) -> Path:
    return write_clip(folder / f"{kind}.mp4", kind, seconds=work.seconds, fps=8, size=work.size, options=RECORDER)


def _median_run(engine: Engine, path: Path, params: GenerationParams, repeats: int) -> dict:
    runs = sorted((engine.submit(path, QUESTION, params).result().stats for _ in range(repeats)), key=_ttft)
    return runs[(len(runs) - 1) // 2]


def _ttft(stats: dict) -> float:
    return stats["ttft_s"]


def _params(q: float, skip: bool, work: SkipWork) -> GenerationParams:
    return params(q, work.new_tokens, work.sampling, skip)


def kind_rows(device: str, folder: Path, work: SkipWork) -> list[dict]:
    """One row per clip kind and way: its stats' vision and time figures, and its ratios to the first way's."""
    rows = []
    with contextlib.ExitStack() as stack:
        engines = {
            reuse: stack.enter_context(
                Engine(EngineConfig(model=work.model, device=device, vision_reuse=reuse, **NO_CACHES))
            )
            for reuse in (False, True)
        }
        for label, kind in KINDS.items():
            path = clip(folder, kind, work)
            for engine in engines.values():  # first-request costs, untimed
                _median_run(engine, path, _params(KIND_RATE, False, work), 1)
            for way, reuse, skip in WAYS:
                stats = _median_run(engines[reuse], path, _params(KIND_RATE, skip, work), work.repeats)
                rows.append(_kind_row(label, way, stats, work.repeats))
    for row in rows:
        first = next(other for other in rows if other["kind"] == row["kind"] and other["way"] == WAYS[0][0])
        row["ttft_ratio"] = row["ttft_s"] / first["ttft_s"]
        row["vit_ratio"] = row["vit_s"] / first["vit_s"] if first["vit_s"] else None
    return rows


def _kind_row(label: str, way: str, stats: dict, runs: int) -> dict:
    return {
        "kind": label,
        "way": way,
        "runs": runs,
        "pruning_rate": KIND_RATE,
        "vision_patches_encoded": stats["vision_patches_encoded"],
        "vision_patches_total": stats["vision_patches_total"],
        "encoded_share": stats["vision_patches_encoded"] / stats["vision_patches_total"],
        "video_tokens_kept": stats["video_tokens_kept"],
        "video_tokens_total": stats["video_tokens_total"],
        "vit_s": stats["vit_s"],
        "prefill_s": stats["prefill_s"],
        "ttft_s": stats["ttft_s"],
    }


def reduced_spec(shape: Shape, folder: Path) -> Path:
    """A spec file of the checkpoint cut to the shape's layers, for `random:<path>`."""
    spec = checkpoint_spec(shape.checkpoint)
    config = json.loads(json.dumps(spec["config"]))
    vision, text = config["vision_config"], config["text_config"]
    vision["depth"] = shape.vision_depth
    if vision.get("deepstack_visual_indexes"):  # the same number of DeepStack levels, spread over the cut
        levels = len(vision["deepstack_visual_indexes"])
        vision["deepstack_visual_indexes"] = [
            round((i + 1) * shape.vision_depth / (levels + 1)) - 1 for i in range(levels)
        ]
    text["num_hidden_layers"] = shape.text_layers
    if "layer_types" in text:
        text["layer_types"] = text["layer_types"][: shape.text_layers]
    if shape.experts is not None:
        text["num_experts"] = shape.experts
    spec = {**spec, "config": config}
    path = folder / f"{shape.checkpoint.replace('/', '--')}-cut.json"
    path.write_text(json.dumps(spec))
    return path


def share_rows(device: str, folder: Path, work: SkipWork, shapes: tuple[Shape, ...] | None = None) -> list[dict]:
    """One row per shape, q and way (without skipping, with): the ViT's and the prefill's seconds (scaled to the
    checkpoint's layers on a CPU), the ViT's share of the two, and TTFT with the scaled stages."""
    path = clip(folder, "still_camera", work)
    rows = []
    for shape in shapes or work.shapes:
        spec = checkpoint_spec(shape.checkpoint)["config"]
        cut = device != "cuda"
        depth, layers = spec["vision_config"]["depth"], spec["text_config"]["num_hidden_layers"]
        vit_scale = depth / shape.vision_depth if cut else 1.0
        text_scale = layers / shape.text_layers if cut else 1.0
        model = f"random:{reduced_spec(shape, folder)}" if cut else f"random:{shape.checkpoint}"
        with Engine(EngineConfig(model=model, device=device, **NO_CACHES)) as engine:
            _median_run(engine, path, _params(0.0, False, work), 1)  # first-request costs, untimed
            for q in SHARE_RATES:
                for skip in (False, True):
                    stats = _median_run(engine, path, _params(q, skip, work), work.share_repeats)
                    vit, prefill = stats["vit_s"] * vit_scale, stats["prefill_s"] * text_scale
                    rows.append(
                        {
                            "checkpoint": shape.checkpoint,
                            "layers_run": f"{shape.vision_depth}/{depth} ViT, {shape.text_layers}/{layers} LM"
                            if cut
                            else "all",
                            "pruning_rate": q,
                            "skip_still_patches": skip,
                            "vision_patches_encoded": stats["vision_patches_encoded"],
                            "vision_patches_total": stats["vision_patches_total"],
                            "video_tokens_kept": stats["video_tokens_kept"],
                            "vit_s": vit,
                            "prefill_s": prefill,
                            "vit_share": vit / (vit + prefill),
                            "ttft_s": stats["read_video_s"] + vit + stats["evs_s"] + prefill,
                        }
                    )
    for row in rows:
        plain = next(
            r
            for r in rows
            if r["checkpoint"] == row["checkpoint"] and r["pruning_rate"] == 0.0 and not r["skip_still_patches"]
        )
        row["ttft_over_q0"] = row["ttft_s"] / plain["ttft_s"]
    return rows


def kinds_markdown(rows: list[dict], targets: list[dict] = ()) -> str:
    """The clip kinds' table, with its targets' verdicts (targets: the run's target rows)."""
    return table(
        [
            "clip",
            "way",
            "patches encoded / total",
            "video tokens kept",
            "ViT s",
            "prefill s",
            "TTFT s",
            "ViT ×",
            "TTFT ×",
            "met",
        ],
        [
            [
                row["kind"],
                row["way"],
                f"{row['vision_patches_encoded']:,} / {row['vision_patches_total']:,} ({row['encoded_share']:.2f})",
                f"{row['video_tokens_kept']} / {row['video_tokens_total']}",
                cell(row["vit_s"]),
                cell(row["prefill_s"]),
                cell(row["ttft_s"]),
                cell(row["vit_ratio"], 2),
                cell(row["ttft_ratio"], 2),
                met_cell(targets, "vision_skip", row),
            ]
            for row in rows
        ],
    )


def share_markdown(rows: list[dict]) -> str:
    return table(
        [
            "checkpoint (layers run)",
            "q",
            "skip",
            "patches encoded",
            "ViT s",
            "prefill s",
            "ViT share",
            "TTFT s",
            "TTFT / q=0",
        ],
        [
            [
                f"{row['checkpoint']} ({row['layers_run']})",
                row["pruning_rate"],
                "yes" if row["skip_still_patches"] else "no",
                f"{row['vision_patches_encoded']:,} / {row['vision_patches_total']:,}",
                cell(row["vit_s"], 2),
                cell(row["prefill_s"], 2),
                cell(row["vit_share"], 2),
                cell(row["ttft_s"], 2),
                cell(row["ttft_over_q0"], 2),
            ]
            for row in rows
        ],
    )


def markdown(result: dict, targets: list[dict] = ()) -> str:
    """`python -m bench`'s section: the clip kinds (at q = 0.7, with their targets' verdicts) and, in full mode, the
    ViT's share."""
    parts = [f"At q = {KIND_RATE}:\n\n" + kinds_markdown(result["kinds"], targets)]
    if result["share"]:
        parts.append("The ViT's share of prefill, still camera clip:\n\n" + share_markdown(result["share"]))
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.vision_skip", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny-random, small clips, one run each")
    parser.add_argument("--part", choices=["kinds", "share", "all"], default="all")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--out", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    work = QUICK if args.quick else FULL
    result = {"command": " ".join(["python -m bench.vision_skip", *(sys.argv[1:] if argv is None else argv)])}
    with tempfile.TemporaryDirectory() as folder:
        if args.part in ("kinds", "all"):
            result["kinds"] = kind_rows(args.device, Path(folder), work)
            result["targets"] = vision_target_rows(result["kinds"], {})
            print(kinds_markdown(result["kinds"], result["targets"]) + "\n", flush=True)
            print(targets_markdown(result["targets"]), flush=True)
        if args.part in ("share", "all"):
            shapes = (Shape("Qwen/Qwen3-VL-2B-Instruct", 1, 1),) if args.quick else None
            result["share"] = share_rows(args.device, Path(folder), work, shapes)
            print("\n" + share_markdown(result["share"]))
    if args.out:
        args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
