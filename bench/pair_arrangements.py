"""The two-clip question in every arrangement a user can send it: the clips in the order the model was trained on
and swapped, alone or with a still picture before or after them, through the Engine and through the OpenAI
endpoint.

    python bench/pair_arrangements.py [--model tiny-trained] [--seed 0] [--per-type 100] [--rates 0,0.5]
                                      [--threshold 0.95] [--json]
    (`python -m bench.pair_arrangements ...` from the repository root is the same.)

Each held-out pair of bench/accuracy.py's "pair" question (assets/shapes.py, clip_pair: "Which clip has the red
shape, first or second?") is asked in six arrangements: the clips as trained (the seed's clip first) and
swapped (the expected answer swapped with them), each alone, with a picture after the clips, and with a picture
before them. The picture is the first frame of the next held-out clip whose colour is neither clip's, as a PNG:
a picture beside the clips is no clip, so the answer stays the clips' order. Three ways ask each arrangement:
`engine`, Engine.submit, greedy; `openai greedy`, the same through `POST /v1/chat/completions` (the clips and the
picture as data: URLs, `temperature: 0`), which must give the engine's answers; and `openai default`, the
route's own defaults as a client that sets nothing gets them (temperature 1, OpenAI's; a fixed seed per pair, so
a rerun gives the same figures). An answer counts when it is exactly "first" or "second" as expected.

Prints a markdown table per rate (arrangement x way) and the arrangements below --threshold; exits 1 when
any is (so it can gate a retrained model), 0 otherwise. --json also prints {rate: {arrangement: {way: share}}}
as the last line.
"""

import argparse
import base64
import json
import socket
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import openai  # noqa: E402
import uvicorn  # noqa: E402
from fastapi import FastAPI  # noqa: E402
from PIL import Image  # noqa: E402

from assets.shapes import PAIR_ANSWERS, clip_pair, held_out_seeds, shape_clip  # noqa: E402
from bench.accuracy import MAX_NEW_TOKENS, clip_files, parse_rates  # noqa: E402
from bench.admitted import submit_admitted  # noqa: E402
from engine import Engine, EngineConfig, GenerationParams  # noqa: E402
from ui.openai_api import openai_routes  # noqa: E402

# (name, clips swapped, where the picture goes: None, "after" or "before")
ARRANGEMENTS = (
    ("as trained", False, None),
    ("swapped", True, None),
    ("picture after", False, "after"),
    ("swapped, picture after", True, "after"),
    ("picture before", False, "before"),
    ("swapped, picture before", True, "before"),
)
WAYS = ("engine", "openai greedy", "openai default")
OPENAI_CALLS_AT_ONCE = 8
THRESHOLD = 0.95


@dataclass(frozen=True)
class Asked:
    """One arrangement of one pair: the uploads in the order sent, the question and the expected answer."""

    media: tuple[Path, ...]
    question: str
    answer: str
    seed: int


def picture_seed(seeds: tuple[int, int]) -> int:
    """The first seed after the pair's whose clip's colour is neither of the pair's: the picture beside them."""
    colours = {shape_clip(s).colour for s in seeds}
    return next(s for s in range(seeds[1] + 1, seeds[1] + 1000) if shape_clip(s).colour not in colours)


def picture_file(folder: Path, seed: int) -> Path:
    """The first frame of `seed`'s clip as a PNG (64x64, the clips' size)."""
    path = folder / f"picture-{seed}.png"
    if not path.exists():
        Image.fromarray(shape_clip(seed).frames[0]).save(path)
    return path


def arranged(seed: int, clips: dict[int, Path], folder: Path) -> dict[str, Asked]:
    """{arrangement: Asked} of the pair of `seed` (clips: clip_files' for the seeds)."""
    pair = clip_pair(seed)
    picture = picture_file(folder, picture_seed(pair.seeds))
    result = {}
    for name, swapped, where in ARRANGEMENTS:
        order = pair.seeds[::-1] if swapped else pair.seeds
        media = tuple(clips[s] for s in order)
        media = {None: media, "after": (*media, picture), "before": (picture, *media)}[where]
        answer = PAIR_ANSWERS[1 - PAIR_ANSWERS.index(pair.answer)] if swapped else pair.answer
        result[name] = Asked(media, pair.question, answer, seed)
    return result


def data_url(path: Path) -> tuple[str, str]:
    """(content part type, data: URL) of an upload: a PNG as an image_url, anything else as a video_url."""
    kind, media_type = ("image_url", "image/png") if path.suffix == ".png" else ("video_url", "video/mp4")
    return kind, f"data:{media_type};base64,{base64.b64encode(path.read_bytes()).decode()}"


def openai_messages(asked: Asked) -> list[dict]:
    parts = [{"type": kind, kind: {"url": url}} for kind, url in map(data_url, asked.media)]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": asked.question}]}]


class OpenAIServer:
    """The app's OpenAI routes for `engine` on a free local port, served by uvicorn in a thread."""

    def __init__(self, engine: Engine):
        app = FastAPI(routes=openai_routes(engine, engine.config.max_file_bytes))
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> openai.OpenAI:
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the OpenAI routes did not start")
            threading.Event().wait(0.05)
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="unused", max_retries=0, timeout=300)

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def engine_answers(engine: Engine, asked: list[Asked], rate: float) -> list[str]:
    """Each question's answer through Engine.submit, greedy; all submitted at once, as many as the engine takes."""
    params = GenerationParams(pruning_rate=rate, max_new_tokens=MAX_NEW_TOKENS)
    streams: list = []
    for a in asked:
        streams.append(submit_admitted(engine, streams, media=list(a.media), question=a.question, params=params))
    return [stream.result().text.strip() for stream in streams]


def openai_answers(client: openai.OpenAI, model: str, asked: list[Asked], rate: float, greedy: bool) -> list[str]:
    """Each question's answer through the OpenAI endpoint: greedy (temperature 0), or with the route's own
    sampling defaults and the pair's seed."""

    def one(a: Asked) -> str:
        sampling = {"temperature": 0} if greedy else {"seed": a.seed}
        reply = client.chat.completions.create(
            model=model,
            messages=openai_messages(a),
            max_tokens=MAX_NEW_TOKENS,
            extra_body={"pruning_rate": rate},
            **sampling,
        )
        return (reply.choices[0].message.content or "").strip()

    with ThreadPoolExecutor(OPENAI_CALLS_AT_ONCE) as pool:
        return list(pool.map(one, asked))


def measure(model: str, seeds: list[int], rates: list[float] | None = None, device: str = "cpu") -> dict[str, dict]:
    """{str(rate): {arrangement: {way: share of pairs answered exactly}}}; rates: None, the model's own."""
    with tempfile.TemporaryDirectory() as folder:
        clips = clip_files(Path(folder), seeds)
        by_seed = [arranged(seed, clips, Path(folder)) for seed in seeds]
        config = EngineConfig(model=model, device=device, max_queue=len(seeds) * len(ARRANGEMENTS), max_media=3)
        table: dict[str, dict] = {}
        with Engine(config) as engine, OpenAIServer(engine) as client:
            name = engine.model_info["name"]
            for rate in rates or [engine.model_info["default_pruning_rate"]]:
                row = table[str(rate)] = {}
                for arrangement, _, _ in ARRANGEMENTS:
                    asked = [arrangements[arrangement] for arrangements in by_seed]
                    answers = {
                        "engine": engine_answers(engine, asked, rate),
                        "openai greedy": openai_answers(client, name, asked, rate, greedy=True),
                        "openai default": openai_answers(client, name, asked, rate, greedy=False),
                    }
                    row[arrangement] = {
                        way: sum(got == a.answer for got, a in zip(said, asked)) / len(asked)
                        for way, said in answers.items()
                    }
        return table


def markdown(row: dict[str, dict[str, float]]) -> str:
    """Arrangement x way for one rate."""
    lines = ["| arrangement | " + " | ".join(WAYS) + " |", "|---|" + "---|" * len(WAYS)]
    lines += [f"| {name} | " + " | ".join(f"{row[name][way]:.2f}" for way in WAYS) + " |" for name in row]
    return "\n".join(lines)


def below(table: dict[str, dict], threshold: float) -> list[str]:
    """'q = rate, arrangement, way: share' for every figure under threshold."""
    return [
        f"q = {rate}, {arrangement}, {way}: {share:.2f}"
        for rate, row in table.items()
        for arrangement, by_way in row.items()
        for way, share in by_way.items()
        if share < threshold
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/pair_arrangements.py", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-trained")
    parser.add_argument("--device", default="cpu", choices=["auto", "cuda", "cpu"])
    parser.add_argument("--seed", type=int, default=0, help="first held-out pair (bench/accuracy.py's range)")
    parser.add_argument("--per-type", type=int, default=100, help="held-out pairs, each asked in every arrangement")
    parser.add_argument("--rates", type=parse_rates, help="comma-separated (default: the model's own rate)")
    parser.add_argument("--threshold", type=float, default=THRESHOLD, help="the share every figure must reach")
    parser.add_argument("--json", action="store_true", help="also print the table as one JSON line, last")
    args = parser.parse_args(argv)
    table = measure(args.model, held_out_seeds(args.seed, args.per_type), args.rates, args.device)
    print(f"{args.model}: {args.per_type} held-out pairs from seed {args.seed}, exact match\n")
    for rate, row in table.items():
        print(f"q = {rate}\n\n{markdown(row)}\n")
    failing = below(table, args.threshold)
    print(f"below {args.threshold:g}: " + ("; ".join(failing) if failing else "none"))
    if args.json:
        print(json.dumps(table))
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
