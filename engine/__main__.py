"""Command line: `python -m engine --video clip.mp4 --question "..." --pruning-rate 0.7 [--model tiny-random]`.

`--video` and `--image` may be given several times: every one is asked about in one question, in the order
given (the kind is read from the file's content; the two flags differ only in what they say).
`--pruning-method vidcom2` (or uniform) prunes with another method than EVS; `--skip-still-patches` (or
`--no-skip-still-patches`) sets whether still patches are skipped before the vision tower.

Prints the answer as it streams (with --think, the model's thinking first, on stderr), then the stats as
JSON. A model with an audio tower hears the video's soundtrack unless --no-soundtrack. A user error prints
its sentence and exits 2.

`python -m engine --live clip.mp4 --ask-at 5,30,60 "What moves?" [--as-fast-as-possible]` plays a recording
(or a stream URL at a public address) into a live session at its own pace, asks the question at each moment,
and prints each answer as it streams with its stats, then the session's stats (docs/live.md, "A file played as
live"); `--watch "Is there a red shape?"` (repeatable) holds a standing question on it and prints each of its
events with its stream time.

`python -m engine --describe --model random:Qwen/Qwen3-VL-4B-Instruct [--device cuda]` prints, as its last
line, one JSON object describing what loading that model would give (parameters, vision_parameters,
family, dtype, attention; for a checkpoint that also holds weights transformers does not build, such as
Qwen3.5's multi-token-prediction head, unbuilt_parameters and a note), built on the meta device: instant
on any machine, nothing downloaded or loaded.

`python -m engine --model random:Qwen/Qwen3.5-9B --plan-gib 40 130` prints the GPU memory plan
(engine/memory/plan.py) that model would get with 40 and with 130 GiB free after loading: bfloat16, the GPU's
default sampling, the default limits. It reads the config alone (random:<checkpoint>, a local folder, or a
Hub id already cached): no GPU needed, nothing built.
"""

import argparse
import json
import math
import queue
import sys
import threading
import time
from pathlib import Path

from .checkpoints.random_weights import UnknownCheckpoint
from .config import GPU_FRAME_SAMPLING, EngineConfig, GenerationParams
from .engine import Engine
from .errors import InputError, one_line
from .front.door import request_params
from .live.playback import play
from .live.watch import WatchEvent
from .loading.device import DeviceUnavailable
from .loading.load import ModelUnavailable, UnsupportedModel, describe_model, resolve_device
from .memory.dims import GIB
from .memory.plan import InsufficientMemory, checkpoint_config, checkpoint_plan
from .reading.live_stream import STREAM_ENDED, LiveStream, public_stream_url, recording_path
from .stream import Stream

WATCH_END_S = 60.0  # at a recording's end, the longest its last groups and their watches' asks are waited for
BAD_ASK_AT = "--ask-at takes seconds into the recording, 0 or more, separated by commas (e.g. 5,30,60); got {!r}."


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        # `python -m engine` runs this file as __main__.py; the installed command is `evs-engine`.
        prog="python -m engine" if Path(sys.argv[0]).name == "__main__.py" else None,
        description=__doc__.splitlines()[0],
    )
    parser.add_argument(
        "--describe", action="store_true", help="print what loading --model on --device would give, as JSON, and exit"
    )
    parser.add_argument(
        "--plan-gib",
        type=float,
        nargs="+",
        metavar="GIB",
        help="print the GPU memory plan --model would get with GIB free after loading, and exit",
    )
    parser.add_argument(
        "--video",
        action="append",
        dest="media",
        metavar="PATH",
        help="a video file (repeat for several; with --image, in the order given)",
    )
    parser.add_argument(
        "--image",
        action="append",
        dest="media",
        metavar="PATH",
        help="a picture (repeat for several; with --video, in the order given)",
    )
    parser.add_argument("--question")
    parser.add_argument(
        "--live",
        metavar="FILE_OR_URL",
        help="play a recording (or read a stream URL at a public address) into a live session",
    )
    parser.add_argument(
        "--ask-at",
        metavar="SECONDS",
        help="with --live: ask the question at these seconds of the recording, e.g. 5,30,60",
    )
    parser.add_argument(
        "--watch",
        action="append",
        metavar="QUESTION",
        help="with --live: a standing question, asked again as the stream changes; each change of its answer is "
        "printed with its stream time (repeat for several)",
    )
    parser.add_argument(
        "--as-fast-as-possible",
        action="store_true",
        help="with --live: push frames as soon as they are read, waiting for the session instead "
        "of dropping frames (default: at the recording's own pace)",
    )
    parser.add_argument("live_question", nargs="?", metavar="QUESTION", help="with --live: the question")
    # Settings stay text here: the front door reads them, with the sentence every way in gives for a bad one.
    parser.add_argument(
        "--pruning-rate", help="EVS rate q in [0, 1) (default: the model's, Engine.model_info['default_pruning_rate'])"
    )
    parser.add_argument("--pruning-method", help="which video tokens are pruned: evs (the default), vidcom2 or uniform")
    parser.add_argument(
        "--skip-still-patches",
        action=argparse.BooleanOptionalAction,
        help="skip the patches that did not change since they were last encoded, before the vision tower "
        "(default: GenerationParams' own)",
    )
    parser.add_argument(
        "--think",
        action="store_true",
        help="think before answering, for a model that can (the thinking goes to stderr)",
    )
    parser.add_argument(
        "--no-soundtrack",
        action="store_true",
        help="answer from the frames alone: a model with an audio tower hears the soundtrack otherwise",
    )
    parser.add_argument(
        "--model",
        default="tiny-random",
        help="a built-in model (tiny-random, tiny-random-qwen3.5, tiny-random-nemotron-omni, "
        "tiny-trained, ...), a Hub id or folder, or random:<checkpoint>",
    )
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    parser.add_argument("--max-new-tokens", help=f"default {GenerationParams.max_new_tokens}")
    parser.add_argument("--temperature", help=f"0 answers greedily (default {GenerationParams.temperature:g})")
    args = parser.parse_args(argv)
    args.question = args.question or args.live_question
    if args.live is not None:
        asks = args.ask_at is not None and args.question is not None
        if args.media is not None or (args.ask_at is None) != (args.question is None) or not (asks or args.watch):
            parser.error("--live takes --ask-at and a question, or --watch, or both, and no --video or --image")
    elif args.watch:
        parser.error("--watch goes with --live")
    elif not (args.describe or args.plan_gib) and (args.media is None or args.question is None):
        parser.error("--video (or --image) and --question are required (or --describe, or --plan-gib, or --live)")
    if args.plan_gib and min(args.plan_gib) <= 0:
        parser.error("--plan-gib takes sizes above 0")
    return args


# What keeps a model from loading or being served here: each says why in its message.
CANNOT_SERVE = (ModelUnavailable, UnsupportedModel, DeviceUnavailable, InsufficientMemory)


def describe(model: str, device: str) -> int:
    try:
        summary = describe_model(model, device=resolve_device(device))
    except CANNOT_SERVE as error:
        print(f"error: {one_line(error)}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


def print_plans(model: str, free_gib: list[float]) -> int:
    try:
        config = checkpoint_config(model)
        plans = [checkpoint_plan(config, int(gib * GIB)) for gib in free_gib]
    except (UnknownCheckpoint, OSError, ValueError, AttributeError) as error:
        print(f"error: cannot plan {model!r}: {one_line(error)}", file=sys.stderr)
        return 2
    sampling = GPU_FRAME_SAMPLING
    print(
        f"{model} ({config.model_type}), bfloat16, the GPU's default sampling ({sampling.fps:g} fps, at most "
        f"{sampling.max_frames} frames of {sampling.max_pixels_per_frame:,} pixels)"
    )
    for plan in plans:
        print(plan.summary())
        for reason in plan.reasons:
            print(f"  {reason}")
    return 0


def moments(text: str) -> list[float]:
    """--ask-at's seconds; InputError(BAD_ASK_AT) for anything but finite numbers, 0 or more."""
    try:
        seconds = [float(part) for part in text.split(",")]
    except ValueError:
        raise InputError(BAD_ASK_AT.format(text)) from None
    if not all(math.isfinite(s) and s >= 0 for s in seconds):
        raise InputError(BAD_ASK_AT.format(text))
    return seconds


class Console:
    """The command line's stdout and stderr, which a terminal shows as one: written by the thread that prints
    answers and, with --live, by the one that plays the feed (its status lines). A line that comes while an
    answer (or its thinking) is part-written waits until that line ends, so an answer is never split by one
    ("bl[The stream ended.]" then "ue")."""

    def __init__(self):
        self._lock = threading.Lock()
        self._mid_line = False
        self._held: list[tuple[str, bool]] = []  # (line, to stderr)

    def piece(self, text: str, to_stderr: bool = False) -> None:
        """Part of a line (an answer as it streams): the line stays open."""
        with self._lock:
            print(text, end="", file=sys.stderr if to_stderr else sys.stdout, flush=True)
            self._mid_line = self._mid_line or bool(text)

    def end_line(self, to_stderr: bool = False, always: bool = False) -> None:
        """End the open line (always: write a line end even when none is open, as an empty answer's), then write
        the status lines that waited for it."""
        with self._lock:
            if self._mid_line or always:
                print(file=sys.stderr if to_stderr else sys.stdout, flush=True)
            self._mid_line = False
            for line, held_to_stderr in self._held:
                print(line, file=sys.stderr if held_to_stderr else sys.stdout, flush=True)
            self._held.clear()

    def line(self, text: str, to_stderr: bool = False) -> None:
        """A whole line: written now, unless a line is open (then it waits for end_line)."""
        with self._lock:
            if self._mid_line:
                self._held.append((text, to_stderr))
            else:
                print(text, file=sys.stderr if to_stderr else sys.stdout, flush=True)


def print_answer(stream: Stream, console: Console | None = None) -> None:
    """An answer's text as it streams (thinking and status lines on stderr, the thinking's line ended before the
    answer begins), then its stats as indented JSON."""
    console = console or Console()
    thinking = False
    for event in stream:
        if event.kind == "text":
            if thinking:
                console.end_line(to_stderr=True)
                thinking = False
            console.piece(event.text)
        elif event.kind == "thinking":
            console.piece(event.text, to_stderr=True)
            thinking = thinking or bool(event.text)
        elif event.kind == "status":
            console.line(f"[{event.text}]", to_stderr=True)
        elif event.kind == "done":
            if thinking:  # the model thought to its last token: no answer
                console.end_line(to_stderr=True)
            console.end_line(always=True)  # the answer's line, empty or not
            console.line(json.dumps(event.stats, indent=2))


def live_source(text: str) -> str | Path:
    """--live's stream URL (at a public address: public_stream_url) or recording (a Path); InputError otherwise."""
    return public_stream_url(text) if "://" in text else recording_path(text)


def tell(watch, answers: queue.Queue) -> None:
    """Each of the watch's events onto the printing queue, until the watch ends."""
    for event in watch:
        answers.put((watch.question, event))


def play_live(engine: Engine, args: argparse.Namespace, params, source: str | Path, asked_at: list[float]) -> int:
    """--live: the feed played into a session, each answer printed in the order asked (one printing thread, so
    that the stream goes on while an answer decodes), then the session's stats. 2 when anything was refused."""
    sampling = params.frame_sampling or engine.default_frame_sampling
    if isinstance(source, Path):
        feed = LiveStream.of_file(source, sampling, engine.config)
    else:
        feed = LiveStream.under_limits(source, sampling, engine.config)
    answers: queue.Queue = queue.Queue()  # answers and watches' events, printed in the order they come
    refused = []
    console = Console()
    asked: list = []  # the questions' streams, answered before the session closes

    def ask(*item) -> None:
        asked.append(item[-1])
        answers.put(item)

    def printer() -> None:
        while (item := answers.get()) is not None:
            if isinstance(item[1], WatchEvent):
                question, event = item
                alert = "  ALERT" if event.alert else ""
                console.line(f"[watch, the stream at {event.t_s:g} s] {question} {event.answer}{alert}")
                continue
            moment_s, at_s, answer = item
            console.line(f"[{moment_s:g} s, the stream at {at_s:g} s] {args.question}")
            try:
                if isinstance(answer, InputError):
                    raise answer
                print_answer(answer, console)
            except InputError as error:
                refused.append(error)
                console.end_line()  # an answer cut short by its error
                console.line(f"error: {error}", to_stderr=True)

    printing = threading.Thread(target=printer, name="evs-live-answers")
    printing.start()
    try:
        with feed, engine.open_live(params) as live:
            watches = [live.watch(question, params) for question in args.watch or []]
            telling = [threading.Thread(target=tell, args=(watch, answers), daemon=True) for watch in watches]
            for thread in telling:
                thread.start()
            started_s = time.monotonic()
            last_s = play(
                live,
                feed,
                asked_at,
                lambda: live.ask(args.question, params=params),
                ask,
                lambda line: console.line(f"[{line}]", to_stderr=True),
                as_fast_as_possible=args.as_fast_as_possible,
            )
            played_s = round(time.monotonic() - started_s, 3)
            live.wait(WATCH_END_S)
            for watch in watches:  # the end of a recording is watched to its end
                watch.wait_idle(live.groups_in_state, WATCH_END_S)
            for stream in asked:  # an answer under way is not cut off by the close below
                if not isinstance(stream, InputError):
                    try:
                        stream.result()
                    except InputError:
                        pass  # the printer tells it
            session = live.stats()
            live.close()  # ends the watches: their threads have told every event
            for thread in telling:
                thread.join()
            answers.put(None)
            printing.join()
            summary = {"session": session, "played_s": played_s}
            if watches:
                summary["watches"] = [{"question": watch.question, **watch.stats()} for watch in watches]
            print(json.dumps(summary, indent=2))
    finally:
        answers.put(None)
        printing.join()
    if feed.ending not in (None, STREAM_ENDED):
        refused.append(feed.ending)
        print(f"error: {feed.ending}", file=sys.stderr)
    return 2 if refused or last_s is None else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.describe:
        return describe(args.model, args.device)
    if args.plan_gib:
        return print_plans(args.model, args.plan_gib)
    try:  # before the model loads: a mistake here is told at once
        asked_at = moments(args.ask_at) if args.ask_at is not None else []
        source = live_source(args.live) if args.live is not None else None
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        engine = Engine(EngineConfig(model=args.model, device=args.device))
    except CANNOT_SERVE as error:
        print(f"error: {one_line(error)}", file=sys.stderr)
        return 2
    try:
        params = request_params(
            engine,
            pruning_rate=args.pruning_rate,
            pruning_method=args.pruning_method,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            enable_thinking=args.think,
            hear_soundtrack=False if args.no_soundtrack else None,
            skip_still_patches=args.skip_still_patches,
        )
        if args.live is not None:
            return play_live(engine, args, params, source, asked_at)
        print_answer(engine.submit(media=args.media, question=args.question, params=params))
        return 0
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    finally:
        engine.shutdown()


if __name__ == "__main__":
    sys.exit(main())
