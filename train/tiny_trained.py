"""Train the offline shapes models: `tiny-trained-plain` without EVS, then `tiny-trained` with EVS in the loop,
then `tiny-trained` on the two-clip question too.

    python -m train.tiny_trained --out assets/models/tiny-trained-plain
    python -m train.tiny_trained --evs --out EVS_STAGE
    python -m train.tiny_trained --pairs --init EVS_STAGE --out assets/models/tiny-trained

The plain model fine-tunes the committed base (assets/models/tiny-trained-base: a 2 M-parameter Qwen3-VL
that this script's earlier version trained from scratch to answer colour, direction and shape on unpruned
clips that moved from the first frame): 3,000 steps at q = 0, lr 1e-3, 49 minutes. The EVS model fine-tunes
the plain one for 3,000 more steps, each example pruned at a q drawn from TRAIN_RATES, lr 5e-4, 69 minutes
(both on one thread of a 2-core box that was busy with other work), as the EVS write-ups fine-tune with
pruning in the loop; so the plain model is exactly the EVS model's recipe without its EVS
stage. The pairs stage fine-tunes the EVS model for 1,500 more steps at lr 3e-4, pruned as the EVS stage
prunes, half of its examples the two-clip question of assets/shapes.py (clip_pair: "Which clip has the red
shape, first or second?", the two clips in one prompt, each pruned on its own), the other half the single-clip
questions as before; the committed tiny-trained is its output, started from the EVS stage's model as committed
before it (its default --init is that folder, so a second run would fine-tune further: give it the EVS
stage's output). All: one seed, one thread, 16 examples a step, AdamW (0.9, 0.98) with 50 warm-up steps then
cosine, weight decay 0.01, gradient clip 1.0 (RECIPES holds what differs; the flags override it).
Every step draws fresh clips from the training seeds of assets/shapes.py and builds each example exactly
as the engine serves it: the chat text without a system turn, the real HF processor on the 16 frames
the engine samples from an 8-second 8 fps upload with the same timestamps, the vision tower, then the
engine's own `prune_prompt` at the example's q: the kept features, the same mask, the positions of the
unpruned layout. With --evs each clip is the H.264 upload read back by the engine's reader
(UploadedClips), since codec noise decides which still tokens survive. The answer plus <|im_end|> is
learned by teacher forcing at the positions the engine's decode steps would give it.
`--init ''` starts from random weights instead (init std 0.02). The app and CI never train: the results
are committed and load through from_pretrained.
"""

import argparse
import json
import math
import random
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import torch
from transformers import GenerationConfig

from assets.shapes import (
    FPS,
    HELD_OUT_FROM,
    PAIR,
    QUESTIONS,
    SECONDS,
    asked,
    held_out_seeds,
    shape_clip,
    write_shape_clip,
)
from engine.checkpoints.tiny import MODEL_NOTES_FILE, qwen3_vl_layout
from engine.checkpoints.tokenizer import build_tokenizer
from engine.config import FrameSampling
from engine.families.base import Family
from engine.families.registry import family_for
from engine.loading.load import LoadedModel, load_model
from engine.prompt.pruned import PrunedPrompt, prune_prompt
from engine.prompt.unpruned import unpruned_prompt
from engine.reading.frame_sampling import sample_frame_indices
from engine.reading.pool import ReaderPool
from engine.reading.video import SampledVideo, read_video
from engine.worker.lm import embed_prompt

REPO_ROOT = Path(__file__).resolve().parent.parent
BASE = REPO_ROOT / "assets" / "models" / "tiny-trained-base"
PLAIN = REPO_ROOT / "assets" / "models" / "tiny-trained-plain"
TRAINED = REPO_ROOT / "assets" / "models" / "tiny-trained"
# Keyed by stage (`stage`): "plain", "evs" (--evs), "pairs" (--pairs). Why the EVS model starts from the plain
# one: trained from the base in one run with every question at five rates, it answered direction at q = 0 only
# 0.56 of the time after 1,800 steps, where the plain run had reached 1.00 (it sees a fifth as many unpruned
# examples). The pairs stage fine-tunes the EVS stage's model (tiny-trained as committed before it) on the
# two-clip question beside the single-clip ones, so that they keep their answers.
RECIPES = {
    "plain": {"init": str(BASE), "steps": 3000, "lr": 1e-3},
    "evs": {"init": str(PLAIN), "steps": 3000, "lr": 5e-4},
    "pairs": {"init": str(TRAINED), "steps": 1500, "lr": 3e-4},
}
PAIR_SHARE = 0.5  # of the pairs stage's examples, the two-clip question; the others single-clip, as before
FRAME_SAMPLING = FrameSampling()  # the engine's CPU default: 2 fps, so 16 of the clip's 64 frames
TRAIN_RATES = (0.0, 0.3, 0.5, 0.7, 0.9)  # each --evs example is pruned at one of these, drawn uniformly
EVAL_RATES = (0.0, 0.7)  # q = 0.7 is the app's default
INIT_STD = 0.02
# Saved beside the weights; the engine reads them (engine.loading.load): trained without a system turn, so it
# is served without one, and the app's banner says what it can answer.
ABOUT = (
    "a tiny model trained on synthetic clips of moving shapes: ask about colour, direction, shape or "
    "when it starts moving"
)
NOTES = {  # keyed by stage
    "pairs": {
        "system_prompt": "",
        "about": ABOUT + ", or of two clips which one has a colour; trained with EVS in "
        "the loop, it answers all five at the default pruning rate",
    },
    "evs": {
        "system_prompt": "",
        "about": ABOUT + "; trained with EVS in the loop, it answers all four at the default pruning rate",
    },
    "plain": {"system_prompt": "", "about": ABOUT + "; trained without EVS, it loses direction and start as q grows"},
}


def build(seed: int) -> LoadedModel:
    """The untrained model and its processor, wrapped as the engine would load them."""
    tokenizer = build_tokenizer()
    model_class, config, processor = qwen3_vl_layout(tokenizer, "tiny-trained", init_range=INIT_STD)
    torch.manual_seed(seed)
    model = model_class(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.eos_token_id, tokenizer.pad_token_id], pad_token_id=tokenizer.pad_token_id
    )
    return LoadedModel(
        name="tiny-trained",
        family="qwen3_vl",
        model=model,
        processor=processor,
        device=torch.device("cpu"),
        dtype=torch.float32,
        attn_implementation="sdpa",
        is_tiny=True,
        random_weights=False,
    )


def start_model(init: str, seed: int) -> LoadedModel:
    """The model training starts from: the folder `init` loaded as the engine loads it, or random weights."""
    loaded = load_model(init, device="cpu") if init else build(seed)
    loaded.model.requires_grad_(True)
    loaded.model.train()
    return loaded


def sampled_video(seed: int) -> SampledVideo:
    """The clip of `seed` as drawn, before any codec: the frames the engine samples, at their times."""
    frames = shape_clip(seed).frames
    indices = sample_frame_indices(SECONDS, len(frames), FRAME_SAMPLING)
    return SampledVideo(
        frames=frames[indices],
        frame_indices=indices,
        timestamps_s=[i / FPS for i in indices],
        native_fps=float(FPS),
        total_frames=len(frames),
        duration_s=SECONDS,
        sampled_fps=len(indices) / SECONDS,
        content_hash="",
    )


class UploadedClips:
    """Clips as a user's upload reaches the engine: each written as its H.264 MP4 and read back by the
    engine's own reader (read_video through a warm reader), 25 ms a clip.

    Why not the drawn frames: EVS breaks ties among equally unchanged tokens in raster order, and the still
    groups of drawn frames tie exactly, while a codec's noise breaks those ties another way in every
    upload; at q = 0.3 and 0.5 that decides which still groups the model sees.
    """

    def __enter__(self) -> "UploadedClips":
        self._folder = tempfile.TemporaryDirectory(prefix="evs-train-")
        self._readers = ReaderPool(1)
        return self

    def __exit__(self, *exc) -> None:
        self._readers.shutdown()
        self._folder.cleanup()

    def video(self, seed: int) -> SampledVideo:
        path = write_shape_clip(Path(self._folder.name) / f"{seed}.mp4", seed)
        try:
            return read_video(
                path, FRAME_SAMPLING, max_seconds=SECONDS + 1, max_bytes=1 << 24, timeout_s=60.0, readers=self._readers
            )
        finally:
            path.unlink()


def served_prompts(
    loaded: LoadedModel, family: Family, videos: list[list[SampledVideo]], questions: list[str], rates: list[float]
) -> list[PrunedPrompt]:
    """What the engine's language model receives for each (videos, question, q): the prompt about one clip or
    several prepared as the engine prepares it, every clip encoded in one vision forward (with gradients when
    training), each prompt pruned by the engine's own prune_prompt (every clip on its own)."""
    prompts = [
        unpruned_prompt(loaded, family, clips, question, [], "", FRAME_SAMPLING.max_pixels_per_frame)
        for clips, question in zip(videos, questions)
    ]
    features = iter(family.encode_media(loaded.model, [medium for prompt in prompts for medium in prompt.media]))
    return [prune_prompt(prompt, [next(features) for _ in prompt.media], q, "evs") for prompt, q in zip(prompts, rates)]


def answer_ids(loaded: LoadedModel, answer: str) -> torch.Tensor:
    """(A,) long: the answer's tokens and <|im_end|>, what greedy decoding should produce."""
    return loaded.processor.tokenizer(answer + "<|im_end|>", add_special_tokens=False, return_tensors="pt")[
        "input_ids"
    ][0]


def teacher_forced_logits(
    loaded: LoadedModel, family: Family, pruned: list[PrunedPrompt], answers: list[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits predicting each answer token after its pruned prompt, and those tokens.

    Each row is the pruned prompt followed by its answer, at the positions the engine's decode steps give
    the answer (1-D position = tokens so far, MRoPE t/h/w = next_position onwards). Rows are right-padded:
    attention is causal, so pads after a row's last token change nothing before it.
    Returns (N, V) float logits and (N,) long targets, N = all answer tokens of the batch.
    """
    model = loaded.model
    length = max(p.input_ids.numel() + a.numel() for p, a in zip(pruned, answers))
    embeds, positions, visual, predicting, targets = [], [], [], [], []
    for prompt, answer in zip(pruned, answers):
        prompt_len, pad = prompt.input_ids.numel(), length - prompt.input_ids.numel() - answer.numel()
        steps = torch.arange(answer.numel() + pad)
        visual_mask = torch.cat([prompt.visual_mask, torch.zeros(answer.numel() + pad, dtype=torch.bool)])
        ids = torch.cat([prompt.input_ids, answer, answer.new_zeros(pad)])
        embeds.append(embed_prompt(model, ids, visual_mask, prompt.features))
        decode = torch.stack([steps + prompt_len, *[steps + prompt.next_position] * 3])
        positions.append(torch.cat([prompt.positions, decode], dim=1))
        visual.append(visual_mask)
        # the token at position i is predicted by the logits at i - 1
        predicting.append(torch.arange(answer.numel()) + prompt_len - 1 + len(predicting) * length)
        targets.append(answer)
    visual_mask = torch.stack(visual)
    deepstack = [torch.cat(levels) for levels in zip(*(p.features.deepstack for p in pruned))]
    out = model.model.language_model(
        inputs_embeds=torch.stack(embeds),
        position_ids=torch.stack(positions, dim=1),
        use_cache=False,
        **family.language_kwargs(visual_mask, deepstack),
    )
    hidden = out.last_hidden_state.flatten(0, 1)[torch.cat(predicting)]
    return model.lm_head(hidden), torch.cat(targets)


def example_loss(
    loaded: LoadedModel, family: Family, examples: list[tuple[int, str, float]], video: Callable[[int], SampledVideo]
) -> torch.Tensor:
    """Mean cross-entropy over the answer tokens of (seed, question type, q) examples; `video` gives a
    seed's clip as the model sees it."""
    questions = [asked(seed, kind) for seed, kind, _ in examples]
    pruned = served_prompts(
        loaded,
        family,
        [[video(s) for s in seeds] for seeds, _, _ in questions],
        [question for _, question, _ in questions],
        [q for _, _, q in examples],
    )
    answers = [answer_ids(loaded, answer) for _, _, answer in questions]
    logits, targets = teacher_forced_logits(loaded, family, pruned, answers)
    return torch.nn.functional.cross_entropy(logits, targets)


def learning_rate(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * 0.5 * (1 + math.cos(math.pi * progress))


@torch.no_grad()
def teacher_forced_accuracy(
    loaded: LoadedModel, family: Family, seeds: list[int], kinds: list[str], video: Callable[[int], SampledVideo]
) -> dict[str, float]:
    """{"<type>@<q>": share of clips whose whole answer is the argmax at every answer token} over EVAL_RATES."""
    loaded.model.eval()
    scores = {}
    for q in EVAL_RATES:
        for kind in kinds:
            questions = [asked(s, kind) for s in seeds]
            pruned = served_prompts(
                loaded,
                family,
                [[video(s) for s in clips] for clips, _, _ in questions],
                [question for _, question, _ in questions],
                [q] * len(seeds),
            )
            answers = [answer_ids(loaded, answer) for _, _, answer in questions]
            logits, targets = teacher_forced_logits(loaded, family, pruned, answers)
            right = (logits.argmax(-1) == targets).split([a.numel() for a in answers])
            scores[f"{kind}@{q:g}"] = sum(bool(r.all()) for r in right) / len(seeds)
    loaded.model.train()
    return scores


def stage(args: argparse.Namespace) -> str:
    """The recipe the flags pick: "pairs" (--pairs, which prunes as --evs does), "evs" or "plain"."""
    return "pairs" if args.pairs else "evs" if args.evs else "plain"


def train(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    args.evs = args.evs or args.pairs
    recipe = RECIPES[stage(args)]
    init = recipe["init"] if args.init is None else args.init
    steps, lr = args.steps or recipe["steps"], args.lr or recipe["lr"]
    loaded = start_model(init, args.seed)
    model, family = loaded.model, family_for(loaded.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    kinds, rates = list(QUESTIONS), TRAIN_RATES if args.evs else (0.0,)
    eval_seeds = held_out_seeds(900_000, args.eval_clips)  # far from bench/accuracy.py's held-out seeds
    log = []
    with ExitStack() as stack:
        video = stack.enter_context(UploadedClips()).video if args.evs else sampled_video
        start = time.perf_counter()
        for step in range(steps):
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, steps, lr, args.warmup)
            examples = [
                (
                    rng.randrange(HELD_OUT_FROM - 1000),  # a pair's second clip is a later seed
                    PAIR if args.pairs and rng.random() < PAIR_SHARE else rng.choice(kinds),
                    rng.choice(rates),
                )
                for _ in range(args.batch)
            ]
            loss = example_loss(loaded, family, examples, video)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            if step % args.eval_every == 0 or step == steps - 1:
                accuracy = teacher_forced_accuracy(loaded, family, eval_seeds, kinds + [PAIR] * args.pairs, video)
                elapsed = time.perf_counter() - start
                log.append({"step": step, "loss": loss.item(), "elapsed_s": elapsed, **accuracy})
                print(
                    f"step {step:5d}  loss {loss.item():.4f}  {elapsed:7.1f} s  "
                    + "  ".join(f"{k} {v:.2f}" for k, v in accuracy.items()),
                    flush=True,
                )
    model.eval()
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    loaded.processor.save_pretrained(args.out)
    (args.out / MODEL_NOTES_FILE).write_text(json.dumps(NOTES[stage(args)], indent=2))
    summary = {
        "init": Path(init).name if init else None,
        "evs": args.evs,
        "pairs": args.pairs,
        "pair_share": PAIR_SHARE if args.pairs else 0.0,
        "read_from": "mp4" if args.evs else "frames",
        "rates": list(rates),
        "steps": steps,
        "batch": args.batch,
        "lr": lr,
        "warmup": args.warmup,
        "seed": args.seed,
        "threads": args.threads,
        "train_s": time.perf_counter() - start,
        "parameters": sum(p.numel() for p in model.parameters()),
        "log": log,
    }
    (args.out / "training.json").write_text(json.dumps(summary, indent=2))
    return summary


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m train.tiny_trained", description=__doc__.splitlines()[0])
    parser.add_argument("--evs", action="store_true", help=f"prune each example at a q drawn from {TRAIN_RATES}")
    parser.add_argument(
        "--pairs",
        action="store_true",
        help=f"as --evs, and ask {PAIR_SHARE * 100:.0f}%% of the examples about two clips (clip_pair)",
    )
    parser.add_argument("--init", help="model folder to start from ('' for random weights); default: the recipe's")
    parser.add_argument("--steps", type=int, help="default: the recipe's")
    parser.add_argument("--lr", type=float, help="peak learning rate; default: the recipe's")
    add_run_options(parser, seed=1)
    return parser


def add_run_options(parser: argparse.ArgumentParser, seed: int) -> None:
    """The options every training command takes: batch, warm-up steps, seed (default `seed`), torch threads,
    evaluation every N steps on how many clips, and the output folder."""
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--seed", type=int, default=seed)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--eval-clips", type=int, default=32)
    parser.add_argument("--out", type=Path, required=True)


def main(argv: list[str] | None = None) -> None:
    summary = train(parser().parse_args(argv))
    print(f"trained {summary['parameters']} parameters for {summary['steps']} steps in {summary['train_s']:.0f} s")


if __name__ == "__main__":
    main()
