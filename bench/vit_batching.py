"""One ViT forward over several users' videos against one forward per video, measured outside the engine.

Also the split of that batch the engine's scheduler would make (`vision_chunks` within `vit_patch_budget`)
against separate forwards: below 1 means batching users' videos pays on this device.
"""

import statistics
from pathlib import Path

from engine import Engine, FrameSampling
from engine.config import vit_patch_budget
from engine.scheduling.scheduler import vision_chunks

from .markdown import table
from .vit_timing import prepared_prompts, vit_forward_s
from .workload import QUESTION


def vit_batching(engine: Engine, clips: list[Path], sampling: FrameSampling, repeats: int) -> dict:
    """Medians over `repeats` rounds, each measuring the three ways back to back (drift hits all alike)."""
    prompts = prepared_prompts(engine, clips, sampling, QUESTION)
    sizes = [sum(len(medium.pixel_values) for medium in prompt.media) for prompt in prompts]
    budget = vit_patch_budget(engine.config, engine.loaded.device.type)
    chunks = vision_chunks(sizes, budget)
    vit_forward_s(engine, prompts[:1])  # warm-up: kernel selection, allocator growth
    together, budgeted, separate = [], [], []
    for _ in range(repeats):
        separate.append(sum(vit_forward_s(engine, [prompt]) for prompt in prompts))
        together.append(vit_forward_s(engine, prompts))
        budgeted.append(sum(vit_forward_s(engine, [prompts[i] for i in chunk]) for chunk in chunks))
    separate_s = statistics.median(separate)
    return {
        "videos": len(prompts),
        "patches_per_video": sizes[0],
        "patch_budget": budget,
        "budgeted_forwards": len(chunks),
        "separate_forwards_s": separate_s,
        "one_forward_s": statistics.median(together),
        "budgeted_forwards_s": statistics.median(budgeted),
        "one_over_separate": statistics.median(together) / separate_s,
        "budgeted_over_separate": statistics.median(budgeted) / separate_s,
    }


def markdown(result: dict) -> str:
    n = result["videos"]
    rows = [
        [f"{n} separate forwards", f"{result['separate_forwards_s']:.3f}", "1"],
        [f"one forward over {n}", f"{result['one_forward_s']:.3f}", f"{result['one_over_separate']:.3f}"],
        [
            f"the engine's {result['budgeted_forwards']} forwards ({result['patch_budget']}-patch budget)",
            f"{result['budgeted_forwards_s']:.3f}",
            f"{result['budgeted_over_separate']:.3f}",
        ],
    ]
    return table([f"ViT over {n} videos ({result['patches_per_video']} patches each)", "seconds", "/ separate"], rows)
