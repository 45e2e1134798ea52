"""Training examples on live streams, built exactly as the engine serves a question asked of a live session.

An example is a stream of assets/streams.py asked a question when `groups` temporal groups are in the session's
state. Its groups are made by the engine's own code (engine.live.session.group_of: the frames sampled at 2 fps,
scaled, through the HF processor) and encoded by the vision tower; causal EVS (pruning.CausalEVS, the session's
noise floor) decides each one as the session would, fed from as far back as its trailing window reaches into
the window the model sees (engine.live.window.LiveWindow: the checkpoint's span, opened by a key group kept
whole); the window is laid out by the engine's LiveLayout (times from the stream's start, positions from the
prefix) and closed by the question's tail, engine.live.layout.window_prompt, as the worker forks it. Only the
groups the rule reads are made: a stream of three hours costs what one of 20 s does.
"""

import math
from dataclasses import dataclass

import numpy as np
import torch

import pruning
from assets.streams import LIVE_KINDS, NONE, live_asked, shape_stream
from engine.config import FrameSampling
from engine.families.base import Family, VideoFeatures, VideoInputs
from engine.live.group import LiveGroup, group_of
from engine.live.layout import LiveLayout, window_prompt
from engine.live.window import LiveWindow
from engine.prompt.pruned import PrunedPrompt

# Groups in the state when asked: a quarter at a stream's start (fewer groups than the window), most up to 10
# minutes in, some up to 3 hours (a time the prompt's text has not shown in training otherwise).
START_SHARE, LONG_SHARE = 0.25, 0.15
TEN_MINUTES_GROUPS, THREE_HOURS_GROUPS = 600, 10_800


@dataclass
class StreamExample:
    """A question asked of a stream when `groups` groups are in the state: its groups from the first the causal
    rule reads (`first`) to the newest, the window's first group `start`, the question, its answer, the rate."""

    seed: int
    groups: list[LiveGroup]
    first: int
    start: int
    question: str
    answer: str
    q: float


def asked_groups(rng: np.random.Generator) -> int:
    """How many groups are in the state when a training question is asked (groups_per_second: 1 at 2 fps)."""
    draw = rng.random()
    if draw < START_SHARE:
        return int(rng.integers(1, 13))
    if draw < START_SHARE + LONG_SHARE:
        return int(math.exp(rng.uniform(math.log(TEN_MINUTES_GROUPS), math.log(THREE_HOURS_GROUPS))))
    return int(rng.integers(13, TEN_MINUTES_GROUPS + 1))


def group_times(index: int, sampling: FrameSampling, temporal_patch: int) -> list[float]:
    """The capture times of group `index`'s frames: a camera whose frames fall on the sampling's ticks."""
    return [(index * temporal_patch + i) / sampling.fps for i in range(temporal_patch)]


def stream_question(
    sampling: FrameSampling, window: LiveWindow, temporal_patch: int, seed: int, groups: int, kind: str
) -> tuple[int, tuple[str, str] | None]:
    """(the window's first group, (question, answer) of type `kind` or None where it has no answer then) for
    stream `seed` asked with `groups` groups in the state."""
    start = window.start(groups)
    now_s = group_times(groups - 1, sampling, temporal_patch)[-1]
    seen_from_s = group_times(start, sampling, temporal_patch)[0]
    return start, live_asked(shape_stream(seed, now_s), kind, now_s, seen_from_s)


def stream_example(
    loaded, family: Family, sampling: FrameSampling, window: LiveWindow, seed: int, groups: int, kind: str, q: float
) -> StreamExample | None:
    """The example of stream `seed` asked a question of type `kind` (assets.streams.LIVE_KINDS) with `groups`
    groups in the state, or None where the type has no answer then."""
    patch = family.temporal_patch
    start, asked = stream_question(sampling, window, patch, seed, groups, kind)
    if asked is None:
        return None
    stream = shape_stream(seed, group_times(groups - 1, sampling, patch)[-1])
    # The causal rule's trailing window reaches WINDOW_GROUPS - 1 dissimilarities back from the window's second
    # group, each needing the group before it.
    first = max(0, start - (pruning.WINDOW_GROUPS - 1))
    made = [
        group_of(loaded, family, sampling, g, [(stream.frame(t), t) for t in group_times(g, sampling, patch)])
        for g in range(first, groups)
    ]
    return StreamExample(seed, made, first, start, *asked, q)


def stream_prompts(
    model, family: Family, layout: LiveLayout, examples: list[StreamExample], floor: float
) -> list[PrunedPrompt]:
    """Each example's prompt as the engine serves it: the groups of every window encoded in one vision forward (with
    gradients when training), the groups before them in another; floor: the sessions' noise floor."""

    def encoded(groups: list[LiveGroup]) -> list[VideoFeatures]:
        inputs = [VideoInputs(g.pixel_values, g.grid_thw_patches, (1, *g.grid_hw), 0.0) for g in groups]
        return family.encode_media(model, inputs) if inputs else []

    # The groups before a window only decide its groups' tokens: no gradient flows through them.
    shown = iter(encoded([g for e in examples for g in e.groups if g.index >= e.start]))
    with torch.no_grad():
        history = iter(encoded([g for e in examples for g in e.groups if g.index < e.start]))
    prompts = []
    for example in examples:
        rule = pruning.CausalEVS(example.q, floor=floor)
        layout.restart(example.start)
        parts, kept, masks, changes = [layout.prefix], [], [], []
        for group in example.groups:
            features = next(history if group.index < example.start else shown)
            retention, dissimilarity = rule.add(features.embeds.detach(), group.grid_hw)
            if group.index < example.start:
                continue
            if group.index == example.start:  # the key group, whole
                retention = torch.ones_like(retention)
            parts.append(layout.group(group.index, group.times_s, group.grid_hw).kept(retention.cpu()))
            kept.append(features.select(retention))
            masks.append(retention.cpu())
            changes.append(dissimilarity.cpu())
        state = sum(part.ids.numel() for part in parts)
        parts.append(layout.tail_tokens(layout.tail(example.question, [], False)))
        prompts.append(window_prompt(parts, state, torch.cat(masks), torch.stack(changes), VideoFeatures.joined(kept)))
    return prompts


def draw_stream_example(
    loaded,
    family: Family,
    sampling: FrameSampling,
    window: LiveWindow,
    rng: np.random.Generator,
    seeds: range,
    q: float,
) -> StreamExample:
    """A training example: a question type drawn evenly, then streams and moments until the type has an answer;
    the way a shape moves is asked about a shape in view three times in four (`none` otherwise dominates it)."""
    kind = LIVE_KINDS[rng.integers(len(LIVE_KINDS))]
    while True:
        seed, groups = int(rng.integers(seeds.start, seeds.stop)), asked_groups(rng)
        _, asked = stream_question(sampling, window, family.temporal_patch, seed, groups, kind)
        if asked is None or (kind == "direction" and asked[1] == NONE and rng.random() < 0.75):
            continue
        return stream_example(loaded, family, sampling, window, seed, groups, kind, q)
