"""Train `tiny-trained`, a 2 M-parameter Qwen3-VL that answers questions about assets/shapes.py clips.

    python -m train.tiny_trained [--steps 2500] [--seed 1] [--out assets/models/tiny-trained]

CPU only, seeded, one thread by default. Every step draws fresh clips from the training seeds, builds
the prompt exactly as the engine does at inference (chat text without a system turn, the real HF
processor on the 16 frames the engine samples from an 8-second 8 fps upload, the same timestamps) and
learns the answer plus <|im_end|> by teacher forcing. Recipe (what trained in feasibility runs): AdamW
(0.9, 0.98), lr 1e-3, weight decay 0.01, 50 warm-up steps then cosine, gradient clip 1.0, batch 16,
init std 0.02. The app and CI never train: the result is committed and loads through from_pretrained.
"""

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
from transformers import GenerationConfig
from transformers.video_utils import VideoMetadata

from assets.shapes import FPS, HELD_OUT_FROM, QUESTIONS, SECONDS, held_out_seeds, shape_clip
from engine.config import SamplingParams
from engine.families import family_for
from engine.models import LoadedModel, processor_video_kwargs
from engine.prompt import chat_text
from engine.tiny import MODEL_NOTES_FILE, build_tokenizer, qwen3_vl_layout
from engine.video import sample_frame_indices

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "assets" / "models" / "tiny-trained"
SAMPLING = SamplingParams()  # the engine's CPU default: 2 fps, so 16 of the clip's 64 frames
INIT_STD = 0.02
# Saved beside the weights; the engine reads them (engine.models): trained without a system turn, so it
# is served without one, and the app's banner says what it can answer.
NOTES = {"system_prompt": "",
         "about": "a tiny model trained on synthetic clips of moving shapes: ask about colour, direction or shape"}


def build(seed: int) -> LoadedModel:
    """The untrained model and its processor, wrapped as the engine would load them."""
    tokenizer = build_tokenizer()
    model_class, config, processor = qwen3_vl_layout(tokenizer, "tiny-trained", init_range=INIT_STD)
    torch.manual_seed(seed)
    model = model_class(config).to(torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=[tokenizer.eos_token_id, tokenizer.pad_token_id],
                                               pad_token_id=tokenizer.pad_token_id)
    return LoadedModel(name="tiny-trained", family="qwen3_vl", model=model, processor=processor,
                       device=torch.device("cpu"), dtype=torch.float32, attn_implementation="sdpa",
                       is_tiny=True, random_weights=False)


def sampled_frames(seed: int):
    """The frames the engine would sample from the clip's MP4, with their metadata."""
    frames = shape_clip(seed).frames
    indices = sample_frame_indices(SECONDS, len(frames), SAMPLING)
    metadata = VideoMetadata(total_num_frames=len(frames), fps=float(FPS), frames_indices=indices,
                             duration=SECONDS, height=frames.shape[1], width=frames.shape[2])
    return frames[indices], metadata


def batch(loaded: LoadedModel, examples: list[tuple[int, str]]) -> dict:
    """Model inputs with labels on the answer and <|im_end|> only, for (seed, question type) pairs."""
    family = family_for(loaded.model)
    texts, videos, metadata = [], [], []
    for seed, kind in examples:
        frames, meta = sampled_frames(seed)
        answer = shape_clip(seed).answer(kind)
        texts.append(chat_text(family, "", QUESTIONS[kind], []) + answer + "<|im_end|>")
        videos.append(frames)
        metadata.append(meta)
    inputs = loaded.processor(text=texts, videos=videos, video_metadata=metadata, do_sample_frames=False,
                              padding=True, return_tensors="pt",
                              **processor_video_kwargs(loaded, len(videos[0]), SAMPLING.max_pixels_per_frame))
    tokenizer = loaded.processor.tokenizer
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assistant_len = len(tokenizer("assistant\n")["input_ids"])
    labels = torch.full_like(inputs["input_ids"], -100)
    for row, ids in enumerate(inputs["input_ids"]):
        answer_start = int(torch.nonzero(ids == im_start).max()) + 1 + assistant_len
        answer_end = int(inputs["attention_mask"][row].sum())  # right padding
        labels[row, answer_start:answer_end] = ids[answer_start:answer_end]
    inputs["labels"] = labels
    return inputs


def learning_rate(step: int, steps: int, peak: float, warmup: int = 50) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * 0.5 * (1 + math.cos(math.pi * progress))


@torch.no_grad()
def teacher_forced_accuracy(loaded: LoadedModel, seeds: list[int]) -> dict[str, float]:
    """Share of held-out clips whose whole answer is the argmax at every answer position, per type."""
    loaded.model.eval()
    scores = {}
    for kind in QUESTIONS:
        inputs = batch(loaded, [(seed, kind) for seed in seeds])
        labels = inputs.pop("labels")
        logits = loaded.model(**inputs).logits[:, :-1]
        targets = labels[:, 1:]
        right = (logits.argmax(-1) == targets) | (targets == -100)
        scores[kind] = right.all(dim=1).float().mean().item()
    loaded.model.train()
    return scores


def train(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    loaded = build(args.seed)
    model = loaded.model
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    kinds = list(QUESTIONS)
    eval_seeds = held_out_seeds(900_000, 32)  # far from bench/accuracy.py's held-out seeds
    log = []
    start = time.perf_counter()
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args.steps, args.lr)
        examples = [(rng.randrange(HELD_OUT_FROM), rng.choice(kinds)) for _ in range(args.batch)]
        loss = model(**batch(loaded, examples)).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % args.eval_every == 0 or step == args.steps - 1:
            accuracy = teacher_forced_accuracy(loaded, eval_seeds)
            elapsed = time.perf_counter() - start
            log.append({"step": step, "loss": loss.item(), "elapsed_s": elapsed, **accuracy})
            print(f"step {step:5d}  loss {loss.item():.4f}  {elapsed:7.1f} s  " +
                  "  ".join(f"{k} {v:.2f}" for k, v in accuracy.items()), flush=True)
    model.eval()
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    loaded.processor.save_pretrained(args.out)
    (args.out / MODEL_NOTES_FILE).write_text(json.dumps(NOTES, indent=2))
    summary = {"steps": args.steps, "batch": args.batch, "lr": args.lr, "seed": args.seed, "threads": args.threads,
               "train_s": time.perf_counter() - start,
               "parameters": sum(p.numel() for p in model.parameters()), "log": log}
    (args.out / "training.json").write_text(json.dumps(summary, indent=2))
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m train.tiny_trained", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2500)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    summary = train(parser.parse_args(argv))
    print(f"trained {summary['parameters']} parameters for {summary['steps']} steps in {summary['train_s']:.0f} s")


if __name__ == "__main__":
    main()
