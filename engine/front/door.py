"""The front door: what every way in does around `submit`, without Gradio.

The page, `/ask`, `/sweep`, the MCP tool and `/v1/chat/completions` (ui/), and `python -m engine`, come in
here, so that each setting has one default and each mistake one sentence (engine/errors.py), whichever
way a request arrives:

- `request_params` turns loose values (a form's floats, JSON, command-line text) into GenerationParams;
  a setting left out (None) takes the engine's default (`defaults`);
- `follow` submits one request per GenerationParams about one upload (or several: videos and pictures) and
  yields their events merged;
  `merged` is that merge alone, which a replica streams back to its client.
"""

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

from engine.config import FrameSampling, GenerationParams
from engine.errors import BAD_HISTORY, BAD_NUMBERS, EXPIRED_VIDEO, NO_VIDEO, InputError
from engine.stream import Event, Stream

from .serving import Serving


def defaults(engine: Serving) -> GenerationParams:
    """A request's settings where it names none: GenerationParams' own, at the pruning rate the engine
    settled at start-up (the checkpoint's `video_pruning_rate`, else the default) and the sampling of its
    device."""
    return GenerationParams(
        pruning_rate=engine.model_info["default_pruning_rate"], frame_sampling=engine.default_frame_sampling
    )


def request_params(
    engine: Serving,
    *,
    pruning_rate=None,
    pruning_method=None,
    fps=None,
    max_frames=None,
    max_pixels_per_frame=None,
    max_new_tokens=None,
    temperature=None,
    top_p=None,
    seed=None,
    enable_thinking=None,
    hear_soundtrack=None,
    skip_still_patches=None,
) -> GenerationParams:
    """GenerationParams from loose values: numbers or their text, None for the default.

    Whole numbers are rounded, since a slider sends 128.0. Raises InputError(BAD_NUMBERS) for a value that
    is not a number; whether a number is in range is the engine's to say, with its own sentence. The switches
    and the pruning method's name pass through as given: one the engine does not take gets its own sentence.
    """
    base = defaults(engine)
    try:
        sampling = FrameSampling(
            fps=_number(fps, float, base.frame_sampling.fps),
            max_frames=_number(max_frames, int, base.frame_sampling.max_frames),
            max_pixels_per_frame=_number(max_pixels_per_frame, int, base.frame_sampling.max_pixels_per_frame),
        )
        return dataclasses.replace(
            base,
            frame_sampling=sampling,
            pruning_rate=_number(pruning_rate, float, base.pruning_rate),
            pruning_method=base.pruning_method if pruning_method is None else pruning_method,
            max_new_tokens=_number(max_new_tokens, int, base.max_new_tokens),
            temperature=_number(temperature, float, base.temperature),
            top_p=_number(top_p, float, base.top_p),
            seed=_number(seed, int, base.seed),
            enable_thinking=base.enable_thinking if enable_thinking is None else enable_thinking,
            hear_soundtrack=base.hear_soundtrack if hear_soundtrack is None else hear_soundtrack,
            skip_still_patches=base.skip_still_patches if skip_still_patches is None else skip_still_patches,
        )
    except (TypeError, ValueError, OverflowError):
        raise InputError(BAD_NUMBERS) from None


def _number(value, kind: type, default):
    if value is None:
        return default
    if kind is int and isinstance(value, int):  # exact: a float has 53 bits, a seed may have 64
        return value
    if kind is int and isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return int(value)
    number = float(value)
    return int(round(number)) if kind is int else number


def history_pairs(history) -> list[tuple[str, str]]:
    """Earlier (question, answer) turns from a loose value: None, or a list of 2-item lists of text."""
    if history is None:
        return []
    if not isinstance(history, (list, tuple)) or not all(
        isinstance(turn, (list, tuple)) and len(turn) == 2 and all(isinstance(x, str) for x in turn) for turn in history
    ):
        raise InputError(BAD_HISTORY)
    return [(asked, answered) for asked, answered in history]


def media_list(media: str | Sequence[str] | None) -> list[str]:
    """The uploads of a request from a loose value: one path, or a list of them (videos and pictures, in
    order); InputError when there is none or one was swept away."""
    paths = [media] if isinstance(media, (str, Path)) else list(media or [])
    if not paths or not all(paths):
        raise InputError(NO_VIDEO)
    if not all(Path(path).is_file() for path in paths):
        raise InputError(EXPIRED_VIDEO)
    return [str(path) for path in paths]


async def follow(
    engine: Serving,
    media: str | Sequence[str] | None,
    question: str,
    params_list: Sequence[GenerationParams],
    history: Sequence[tuple[str, str]] = (),
    *,
    burst: bool = False,
    client: str | None = None,
) -> AsyncIterator[tuple[int, Event]]:
    """Submit one request per params about the same uploads (media: one path, or several in order) and
    yield (request index, event) as events arrive. client: who asks (engine/front/shares.py), each request
    counted in its share.

    Submitting runs in a thread, never on the event loop: `submit` tokenizes the question and history, which
    other users' requests must not wait for. burst: submit them inside `engine.paused()`, so that the worker takes
    them in one iteration: each upload is read once and encoded by one ViT forward, and the prompts decode
    together.
    Raises InputError for the user's mistake (no upload, an upload swept away, the engine's checks), and
    whatever else a request failed with. However the iteration ends (finished, failed, cancelled, closed),
    unfinished requests are cancelled on the way out.
    """
    paths = media_list(media)
    streams: dict[int, Stream] = {}
    submitting: asyncio.Future | None = None
    try:
        submit = _submit_burst if burst else _submit_all
        submitting = asyncio.ensure_future(
            asyncio.to_thread(submit, engine, streams, paths, question, params_list, history, client)
        )
        # shield: a cancelled caller must not abandon the thread's later submissions (see finally)
        await asyncio.shield(submitting)
        async with contextlib.aclosing(merged(streams)) as events:
            async for index, event, error in events:
                if error is not None:
                    raise error
                yield index, event
    finally:
        cancel_unfinished(streams)
        if submitting is not None and not submitting.done():
            submitting.add_done_callback(lambda _: cancel_unfinished(streams))


def _submit_burst(
    engine: Serving,
    streams: dict[int, Stream],
    paths: list[str],
    question: str,
    params_list: Sequence[GenerationParams],
    history: Sequence[tuple[str, str]],
    client: str | None,
) -> None:
    """_submit_all while admission is held; returns once all are prepared. Blocks: run it in a thread."""
    with engine.paused():
        _submit_all(engine, streams, paths, question, params_list, history, client)


def _submit_all(
    engine: Serving,
    streams: dict[int, Stream],
    paths: list[str],
    question: str,
    params_list: Sequence[GenerationParams],
    history: Sequence[tuple[str, str]],
    client: str | None,
) -> None:
    """One request per params, each stream filled in as it is submitted (a refusal halfway still leaves
    the caller what to cancel)."""
    for index, params in enumerate(params_list):
        streams[index] = engine.submit(media=paths, question=question, params=params, history=history, client=client)


def cancel_unfinished(streams: Mapping[int, Stream]) -> None:
    for stream in list(streams.values()):  # a C-level copy: a burst's thread may still be adding streams
        if not stream.finished:
            stream.cancel()


async def merged(streams: Mapping[int, Stream]) -> AsyncIterator[tuple[int, Event | None, BaseException | None]]:
    """(index, event, None) for every event of every stream as it arrives, and (index, None, error) for a
    stream that fails; ends when every stream has ended. Close it (contextlib.aclosing) to stop early."""
    arrivals: asyncio.Queue = asyncio.Queue()
    ended = object()

    async def pump(index: int, stream: Stream) -> None:
        try:
            async for event in stream.aevents():
                arrivals.put_nowait((index, event, None))
            arrivals.put_nowait((index, ended, None))
        except Exception as error:  # the request failed: InputError (the user's) or a bug
            arrivals.put_nowait((index, ended, error))

    pumps = [asyncio.create_task(pump(index, stream)) for index, stream in streams.items()]
    try:
        open_streams = len(pumps)
        while open_streams:
            index, event, error = await arrivals.get()
            if event is not ended:
                yield index, event, None
                continue
            open_streams -= 1
            if error is not None:
                yield index, None, error
    finally:
        for task in pumps:
            task.cancel()
