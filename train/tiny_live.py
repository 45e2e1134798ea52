"""Teach `tiny-trained` live streams, beside what it answers about uploads: the streams stage.

    python -m train.tiny_live --out assets/models/tiny-trained     # from the pairs stage's model (the default)

Half of each step's examples are questions asked of live streams (train/stream_examples.py: a clip at a random
point of a longer stretch of still background, shapes appearing and leaving, two clips one after the other,
asked at random moments up to 10 minutes in and some up to 3 hours, about what is in view now: its colour or
kind or `none`, "Is there a red shape?", the way it moves), each built exactly as the engine serves it (the
window of the checkpoint's 8-s span opened by a whole key group, causal EVS with the noise floor, times from
the stream's start). The other half are uploads as the earlier stages trained them, so that they keep their
answers: the four single-clip questions, and the two-clip question in every arrangement a user may send it
(either order, and with a still picture before, between or after the clips). Each example is pruned at a q drawn
from TRAIN_RATES. Every eval step saves the model to --out (so a run stopped early leaves the last one) with its
log, training.json. The engine reads the checkpoint's live span, noise floor and what it can be asked live from
its notes (LIVE_NOTES).
"""

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np
import torch

from assets.clips import _city, _landscape
from assets.shapes import (
    COLOURS,
    DIRECTIONS,
    HELD_OUT_FROM,
    PAIR,
    PAIR_ANSWERS,
    QUESTIONS,
    SHAPES,
    STILL_SECONDS,
    asked,
    held_out_seeds,
    shape_clip,
)
from assets.streams import LIVE_KINDS, NONE
from engine.checkpoints.tiny import MODEL_NOTES_FILE
from engine.config import video_tokens
from engine.families.registry import family_for
from engine.live.layout import LiveLayout
from engine.live.window import span_groups
from engine.reading.media import StillImage

from .stream_examples import draw_stream_example, stream_prompts
from .tiny_trained import (
    FRAME_SAMPLING,
    NOTES,
    TRAIN_RATES,
    TRAINED,
    UploadedClips,
    add_run_options,
    answer_ids,
    learning_rate,
    served_prompts,
    start_model,
    teacher_forced_logits,
)

STREAM_SHARE = 0.5  # of each step's examples, questions asked of live streams
PAIR_SHARE = 0.4  # of the upload examples, the two-clip question (in one of PAIR_ARRANGEMENTS)
PAIR_ARRANGEMENTS = ("clips", "clips swapped", "picture first", "picture between", "picture last")
SPAN_S = 8.0  # the clips the model learned are 8 s: the live window it reads
# The sessions' noise floor on this model's vision tower: a still 64x64 or 640x480 camera with sensor noise up to
# 8 levels and H.264 at 250 kbps-4 Mbps changed no token by more than 1e-3; a shape moving or appearing changed
# its group's most changed token by 0.26 or more (bench/noise_floor.py, docs/live.md).
NOISE_FLOOR = 0.01
LIVE_ABOUT = (
    "In the Live tab it sees the last 8 s of the stream: ask what colour or shape is in view now (it answers "
    '"none" when no shape is), "Is there a red shape?" (yes or no), or which way the shape moves.'
)
# Every answer the model learned; the app marks any other as a guess.
ANSWERS = [*COLOURS, *SHAPES, *DIRECTIONS, *(str(s) for s in STILL_SECONDS), *PAIR_ANSWERS, NONE, "yes", "no"]
LIVE_NOTES = {"live_span_s": SPAN_S, "live_noise_floor": NOISE_FLOOR, "live_about": LIVE_ABOUT, "answers": ANSWERS}
EVAL_Q = 0.7


def picture(rng: random.Random) -> StillImage:
    """A still picture a user might send beside two clips: a frame of another clip, a scene, a flat colour."""
    draw = rng.randrange(4)
    if draw == 0:
        pixels = shape_clip(rng.randrange(HELD_OUT_FROM - 1000)).frames[rng.randrange(64)]
    elif draw == 1:
        pixels = np.ascontiguousarray((_landscape if rng.random() < 0.5 else _city)(160, 120))
    elif draw == 2:
        pixels = np.full((64, 64, 3), [rng.randrange(256) for _ in range(3)], np.uint8)
    else:
        pixels = np.random.default_rng(rng.randrange(1 << 30)).integers(0, 256, (96, 128, 3), dtype=np.uint8)
    return StillImage(pixels=pixels, stored_size=(pixels.shape[1], pixels.shape[0]), content_hash="")


def pair_example(seed: int, arrangement: str, rng: random.Random, video) -> tuple[list, str, str]:
    """(media in prompt order, question, answer) of the two-clip question about `seed`'s pair in an arrangement."""
    seeds, question, answer = asked(seed, PAIR)
    if arrangement == "clips swapped":
        seeds, answer = seeds[::-1], "second" if answer == "first" else "first"
    media = [video(s) for s in seeds]
    if arrangement.startswith("picture"):
        media.insert({"picture first": 0, "picture between": 1, "picture last": 2}[arrangement], picture(rng))
    return media, question, answer


def batch_loss(loaded, family, layout, window, examples, video) -> torch.Tensor:
    """Mean cross-entropy over the answers of a batch: upload examples (media, question, answer, q) and stream
    examples (StreamExample)."""
    uploads = [e for e in examples if isinstance(e, tuple)]
    streams = [e for e in examples if not isinstance(e, tuple)]
    prompts = (
        served_prompts(loaded, family, *map(list, zip(*[(m, qu, q) for m, qu, _, q in uploads]))) if uploads else []
    )
    prompts += stream_prompts(loaded.model, family, layout, streams, NOISE_FLOOR) if streams else []
    answers = [answer_ids(loaded, a) for _, _, a, _ in uploads] + [answer_ids(loaded, e.answer) for e in streams]
    logits, targets = teacher_forced_logits(loaded, family, prompts, answers)
    return torch.nn.functional.cross_entropy(logits, targets)


def draw_example(loaded, family, window, rng: random.Random, np_rng, video):
    q = rng.choice(TRAIN_RATES)
    if rng.random() < STREAM_SHARE:
        return draw_stream_example(loaded, family, FRAME_SAMPLING, window, np_rng, range(HELD_OUT_FROM - 1000), q)
    seed = rng.randrange(HELD_OUT_FROM - 1000)
    if rng.random() < PAIR_SHARE:
        return (*pair_example(seed, rng.choice(PAIR_ARRANGEMENTS), rng, video), q)
    return upload_example(seed, rng.choice(list(QUESTIONS)), q, video)


def upload_example(seed: int, kind: str, q: float, video) -> tuple[list, str, str, float]:
    """(media, question, answer, q) of a single-clip question about `seed`'s upload."""
    seeds, question, answer = asked(seed, kind)
    return [video(s) for s in seeds], question, answer, q


@torch.no_grad()
def evaluate(loaded, family, layout, window, held_out: dict, video) -> dict[str, float]:
    """{"<label>": share answered right (every answer token the argmax)} on the held-out examples."""
    loaded.model.eval()
    scores = {}
    for label, examples in held_out.items():
        uploads = isinstance(examples[0], tuple)
        if uploads:
            prompts = served_prompts(loaded, family, *map(list, zip(*[(m, qu, q) for m, qu, _, q in examples])))
        else:
            prompts = stream_prompts(loaded.model, family, layout, examples, NOISE_FLOOR)
        answers = [answer_ids(loaded, e[2] if uploads else e.answer) for e in examples]
        logits, targets = teacher_forced_logits(loaded, family, prompts, answers)
        right = (logits.argmax(-1) == targets).split([a.numel() for a in answers])
        scores[label] = sum(bool(r.all()) for r in right) / len(examples)
    loaded.model.train()
    return scores


def held_out_examples(loaded, family, window, clips: int, video) -> dict[str, list]:
    """Examples no training step draws: streams from held-out seeds (held-out clips) per question type at q =
    EVAL_Q, `none` apart; uploads of held-out clips at q = 0 and EVAL_Q; the pair in every arrangement."""
    np_rng, rng = np.random.default_rng(900_001), random.Random(900_002)
    seeds = range(HELD_OUT_FROM + 900_000, HELD_OUT_FROM + 1_000_000)
    held: dict[str, list] = {}
    for kind in LIVE_KINDS:
        examples = [
            draw_stream_example(loaded, family, FRAME_SAMPLING, window, np_rng, seeds, EVAL_Q) for _ in range(clips)
        ]
        held[f"live {kind}"] = [e for e in examples if e.answer != NONE]
        if kind == "colour":
            held["live none"] = [e for e in examples if e.answer == NONE] or examples[:1]
    for q in (0.0, EVAL_Q):
        for kind in QUESTIONS:
            held[f"{kind}@{q:g}"] = [upload_example(seed, kind, q, video) for seed in held_out_seeds(900_000, clips)]
    for arrangement in PAIR_ARRANGEMENTS:
        held[f"pair {arrangement}@{EVAL_Q:g}"] = [
            (*pair_example(seed, arrangement, rng, video), EVAL_Q) for seed in held_out_seeds(900_000, clips)
        ]
    return held


def train(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    rng, np_rng = random.Random(args.seed), np.random.default_rng(args.seed)
    loaded = start_model(args.init, args.seed)
    model, family = loaded.model, family_for(loaded.model)
    layout = LiveLayout.of(loaded, family, "", FRAME_SAMPLING.fps)
    # As the engine opens a session on a CPU: a window of the span, within one request's planned video tokens
    # (784 on Qwen3-VL's CPU sampling), every token counted; a 64x64 frame is 2x2 tokens.
    planned = video_tokens(FRAME_SAMPLING.max_frames, FRAME_SAMPLING.max_pixels_per_frame, 16, 2, 2)
    window = layout.window(span_groups(SPAN_S, FRAME_SAMPLING.fps, family.temporal_patch), planned, (2, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    args.out.mkdir(parents=True, exist_ok=True)
    log = []
    with UploadedClips() as uploads:
        video = uploads.video
        held = held_out_examples(loaded, family, window, args.eval_clips, video)
        start = time.perf_counter()
        for step in range(args.steps):
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, args.steps, args.lr, args.warmup)
            examples = [draw_example(loaded, family, window, rng, np_rng, video) for _ in range(args.batch)]
            loss = batch_loss(loaded, family, layout, window, examples, video)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            if step % args.eval_every == 0 or step == args.steps - 1:
                scores = evaluate(loaded, family, layout, window, held, video)
                elapsed = time.perf_counter() - start
                log.append({"step": step, "loss": loss.item(), "elapsed_s": elapsed, **scores})
                print(
                    f"step {step:5d}  loss {loss.item():.4f}  {elapsed:7.1f} s  "
                    + "  ".join(f"{k} {v:.2f}" for k, v in scores.items()),
                    flush=True,
                )
                save(loaded, args, log, elapsed)
    return save(loaded, args, log, time.perf_counter() - start)


def save(loaded, args: argparse.Namespace, log: list, train_s: float) -> dict:
    """The model as it is now, its notes and its log, to args.out."""
    loaded.model.eval()
    loaded.model.save_pretrained(args.out)
    loaded.processor.save_pretrained(args.out)
    loaded.model.train()
    notes = {**NOTES["pairs"], **LIVE_NOTES}
    (args.out / MODEL_NOTES_FILE).write_text(json.dumps(notes, indent=2))
    summary = {
        "init": Path(args.init).name,
        "stage": "streams",
        "stream_share": STREAM_SHARE,
        "pair_share": PAIR_SHARE,
        "pair_arrangements": list(PAIR_ARRANGEMENTS),
        "rates": list(TRAIN_RATES),
        "noise_floor": NOISE_FLOOR,
        "span_s": SPAN_S,
        "steps": args.steps,
        "batch": args.batch,
        "lr": args.lr,
        "warmup": args.warmup,
        "seed": args.seed,
        "threads": args.threads,
        "train_s": train_s,
        "parameters": sum(p.numel() for p in loaded.model.parameters()),
        "log": log,
    }
    init_log = Path(args.init) / "training.json"
    if init_log.exists():
        summary["init_training"] = json.loads(init_log.read_text())
    (args.out / "training.json").write_text(json.dumps(summary, indent=2))
    return summary


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m train.tiny_live", description=__doc__.splitlines()[0])
    parser.add_argument("--init", default=str(TRAINED), help="model folder to start from (default: tiny-trained)")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--lr", type=float, default=3e-4)
    add_run_options(parser, seed=3)
    return parser


def main(argv: list[str] | None = None) -> None:
    summary = train(parser().parse_args(argv))
    print(f"trained {summary['parameters']} parameters for {summary['steps']} steps in {summary['train_s']:.0f} s")


if __name__ == "__main__":
    main()
