"""Measure causal EVS rules for live video against the offline rule, on held-out shapes clips played back to back.

    python -m train.causal_rules [--clips 80] [--rates 0.5,0.7,0.9] [--threads 1]

A live stream never ends, so its tokens are chosen group by group (pruning/causal.py). This compares, with the
committed `tiny-trained` (trained on the offline rule's masks):
- upload: the offline rule, the global top-K over each clip alone (what an upload of it gets; not causal);
- window: exact K over consecutive windows of 8 groups (causal only with 8 groups of latency);
- bucket: a token bucket of 8 groups' credit, starting full, spent on changed tokens, most changed first;
- trailing: the committed rule, the offline rule over the trailing 8 groups read off for the newest one.

Streams are two held-out clips back to back (8 groups each, read from their H.264 uploads as the engine reads
them). Each clip is asked every question type, its tokens pruned with the mask the rule chose in the stream:
the first clip of a stream as a live session's start (its first group kept whole), the second after a cut,
with the rule's window full of the first clip. An answer counts when every answer token is the argmax
(train.tiny_trained.teacher_forced_logits: what greedy decoding gives). The kept share is measured on all the
clips as one stream, as they come and with noise added to the features (a camera's frames never repeat
exactly), over the whole stream and over its every stretch of 32 groups. docs/live.md holds the figures.
"""

import argparse
import math
from fractions import Fraction

import torch

import pruning
from assets.shapes import QUESTIONS, SECONDS, held_out_seeds, shape_clip
from engine.families.registry import family_for
from engine.loading.load import load_model
from engine.prompt.pruned import pruned_with
from engine.prompt.unpruned import unpruned_prompt

from .tiny_trained import FRAME_SAMPLING, UploadedClips, answer_ids, teacher_forced_logits

WINDOW = pruning.WINDOW_GROUPS
STRETCH_GROUPS = 32
CLIP_GROUPS = round(SECONDS * FRAME_SAMPLING.fps) // 2  # temporal groups of one clip: 8
NOISE = 0.02  # feature noise, as a share of a feature's norm per dimension


def _descending(values: torch.Tensor) -> torch.Tensor:
    return torch.sort(values, descending=True, stable=True).indices


def windowed_exact_k(dissimilarity: torch.Tensor, q: float) -> torch.Tensor:
    """The offline rule on consecutive windows of WINDOW groups (the first window keeps its first group whole)."""
    t, h, w = dissimilarity.shape
    mask = torch.zeros(t, h * w, dtype=torch.bool)
    for start in range(0, t, WINDOW):
        part = dissimilarity[start : start + WINDOW]
        kept = math.floor(part.shape[0] * h * w * (1 - Fraction(repr(q))))
        window_mask = torch.zeros(part.numel(), dtype=torch.bool)
        window_mask[_descending(part.reshape(-1))[: max(h * w, kept) if start == 0 else kept]] = True
        mask[start : start + part.shape[0]] = window_mask.reshape(-1, h * w)
    return mask.reshape(-1)


def token_bucket(dissimilarity: torch.Tensor, q: float) -> torch.Tensor:
    """Each group after the first earns (1 - q) * h*w tokens of credit, held up to WINDOW groups' worth (and
    starting there); a group spends what it holds on its changed tokens, most changed first."""
    t, h, w = dissimilarity.shape
    share = h * w * (1 - Fraction(repr(q)))
    credit = cap = WINDOW * share
    mask = torch.zeros(t, h * w, dtype=torch.bool)
    mask[0] = True
    for group in range(1, t):
        credit = min(cap, credit + share)
        values = dissimilarity[group].reshape(-1)
        changed = [i for i in _descending(values).tolist() if values[i] > 0]
        spent = changed[: math.floor(credit)] if q > 0 else list(range(h * w))
        mask[group, spent] = True
        credit -= len(spent)
    return mask.reshape(-1)


def per_clip(rule, groups: int):
    """rule applied to each clip of `groups` groups alone, as uploads of them are pruned."""

    def apply(dissimilarity: torch.Tensor, q: float) -> torch.Tensor:
        return torch.cat([rule(part, q) for part in dissimilarity.split(groups)])

    return apply


RULES = {
    "upload": per_clip(pruning.retention_mask_from_dissimilarity, CLIP_GROUPS),
    f"window of {WINDOW}": windowed_exact_k,
    "bucket": token_bucket,
    "trailing": pruning.causal_retention_mask_from_dissimilarity,
}


def clip_features(loaded, family, seeds: list[int]) -> tuple[dict, dict]:
    """({(seed, question type): UnprunedPrompt}, {seed: VideoFeatures}) of every clip's H.264 upload."""
    prompts, features = {}, {}
    with UploadedClips() as uploads:
        for seed in seeds:
            video = uploads.video(seed)
            for kind, text in QUESTIONS.items():
                prompts[seed, kind] = unpruned_prompt(
                    loaded, family, video, text, [], "", FRAME_SAMPLING.max_pixels_per_frame
                )
            prompt = prompts[seed, "colour"]
            features[seed] = family.encode_media(loaded.model, prompt.media)[0]
    return prompts, features


def accuracy(loaded, family, prompts, features, seeds, rule, q) -> dict[str, dict[str, float]]:
    """{"first" | "after a cut": {question type: share answered}} over streams of two clips."""
    masks, first = {}, set(seeds[0::2])
    for pair in zip(seeds[0::2], seeds[1::2]):
        embeds = torch.cat([features[seed].embeds for seed in pair])
        T, h, w = prompts[pair[0], "colour"].media[0].grid_thw
        groups = len(pair) * T
        dissimilarity = pruning.frame_dissimilarity(embeds, (groups, h, w))
        mask = rule(dissimilarity, q)
        per_clip = groups // len(pair)
        for index, seed in enumerate(pair):
            rows = slice(index * per_clip, (index + 1) * per_clip)
            masks[seed] = (mask.reshape(groups, -1)[rows].reshape(-1), dissimilarity[rows])
    right = {"first": dict.fromkeys(QUESTIONS, 0), "after a cut": dict.fromkeys(QUESTIONS, 0)}
    for kind in QUESTIONS:
        pruned = [
            pruned_with(prompts[seed, kind], [features[seed]], [masks[seed][0]], [masks[seed][1]]) for seed in seeds
        ]
        answers = [answer_ids(loaded, shape_clip(seed).answer(kind)) for seed in seeds]
        logits, targets = teacher_forced_logits(loaded, family, pruned, answers)
        for seed, hits in zip(seeds, (logits.argmax(-1) == targets).split([a.numel() for a in answers])):
            right["first" if seed in first else "after a cut"][kind] += bool(hits.all())
    return {part: {kind: count / (len(seeds) // 2) for kind, count in counts.items()} for part, counts in right.items()}


def kept_shares(dissimilarity: torch.Tensor, rule, q) -> tuple[float, float, float]:
    """(kept share of the stream after its first group, least and most of any stretch of STRETCH_GROUPS)."""
    t, h, w = dissimilarity.shape
    per_group = rule(dissimilarity, q).reshape(t, h * w).sum(dim=1)[1:].double() / (h * w)
    stretches = per_group.unfold(0, STRETCH_GROUPS, 1).mean(dim=1)
    return float(per_group.mean()), float(stretches.min()), float(stretches.max())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m train.causal_rules", description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=int, default=80, help="held-out clips (even): half start a stream")
    parser.add_argument("--rates", default="0.5,0.7,0.9")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rates = [float(rate) for rate in args.rates.split(",")]
    loaded = load_model("tiny-trained", "cpu")
    family = family_for(loaded.model)
    seeds = held_out_seeds(0, args.clips // 2 * 2)
    with torch.inference_mode():
        prompts, features = clip_features(loaded, family, seeds)
        embeds = torch.cat([features[seed].embeds for seed in seeds])
        noise = torch.randn(embeds.shape, generator=torch.Generator().manual_seed(0))
        noisy = embeds + NOISE * embeds.norm(dim=-1, keepdim=True) / embeds.shape[-1] ** 0.5 * noise
        grid = (
            embeds.shape[0] // math.prod(prompts[seeds[0], "colour"].media[0].grid_thw[1:]),
            *prompts[seeds[0], "colour"].media[0].grid_thw[1:],
        )
        streams = {label: pruning.frame_dissimilarity(e, grid) for label, e in (("as read", embeds), ("noisy", noisy))}
        print(
            f"{len(seeds) // 2} streams of two held-out clips; accuracy colour / direction / shape / start; kept "
            f"share of all {len(seeds)} clips as one stream of {grid[0]} groups (range over {STRETCH_GROUPS}-group "
            "stretches)\n"
        )
        print("| q | rule | first clip | after a cut | kept, as read | kept, noisy |\n|---|---|---|---|---|---|")
        for q in rates:
            for name, rule in RULES.items():
                table = accuracy(loaded, family, prompts, features, seeds, rule, q)
                cells = [" / ".join(f"{v:.2f}" for v in table[part].values()) for part in table]
                kept = [kept_shares(d, rule, q) for d in streams.values()]
                cells += [f"{mean:.3f} ({low:.2f}-{high:.2f})" for mean, low, high in kept]
                print(f"| {q:g} | {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
