"""The prepare threads: everything a request needs before the GPU, off the worker's thread.

For each accepted request one thread reads the upload's sampled frames (and soundtrack) through the reader
pool, sharing reads and keeping recent ones (the frame cache), runs the checkpoint's HF processor into the
unpruned prompt, refuses what cannot fit the model's context or the memory plan, and hands the request to
the worker. Nothing here touches device memory.
"""

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

import pruning

from .config import EngineConfig, FrameSampling
from .detokenize import SplitDetokenizer
from .errors import EXPIRED_VIDEO, InputError
from .lru import ByteLRU
from .memory.plan import Plan
from .prompt.units import encode_plan
from .prompt.unpruned import MediumPrompt, UnprunedPrompt, unpruned_prompt
from .reading.media import Medium, is_video, read_medium, too_small
from .reading.pool import ReaderPool
from .reading.video import file_sha256
from .scheduling.request import Request
from .stats import Stats, video_entry
from .stream import Event

log = logging.getLogger(__name__)

NO_SOUNDTRACK = "the upload has no soundtrack"
UNREADABLE_SOUNDTRACK = "the soundtrack could not be read; answering from the frames"


def soundtrack_verdict(hears: bool, asked: bool | None, medium: Medium, prompt: MediumPrompt) -> str:
    """The `soundtrack` stat of one medium: "unsupported" (the model has no audio tower), "off" (the request
    turned it off), "unreadable" (its stream did not decode), "none" (no audio stream, one too short to hear, or
    a still picture), "cut" (only its first max_soundtrack_seconds were heard) or "heard"."""
    if not hears:
        return "unsupported"
    if asked is False:
        return "off"
    if is_video(medium) and medium.soundtrack_status == "unreadable":
        return "unreadable"
    if prompt.audio is None:
        return "none"
    return "cut" if medium.soundtrack.cut else "heard"


def read_stats(stats: Stats, media: list[Medium], prompt: UnprunedPrompt, hears: bool, asked: bool | None) -> list[str]:
    """Fill what reading and the processor say into stats: `media`, one dict per medium (kept tokens come after
    EVS), and the totals over the videos; returns the status lines to send (one medium's lines as before, each
    named by its place among several)."""
    stats.media, lines = [], []
    for number, (medium, part) in enumerate(zip(media, prompt.media), start=1):
        if part.is_image:
            size = [int(medium.pixels.shape[1]), int(medium.pixels.shape[0])]  # [width, height]
            entry = {"kind": "image", "tokens_total": part.tokens, "tokens_kept": None, "grid_thw": list(part.grid_thw)}
            entry["size"] = size
            said = [f"read a picture of {size[0]}x{size[1]}"]
        else:
            verdict = soundtrack_verdict(hears, asked, medium, part)
            seconds = medium.soundtrack.seconds if part.audio is not None else 0.0
            entry = video_entry(
                part.tokens,
                part.grid_thw,
                len(medium.frames),
                medium.sampled_fps,
                part.timestamps_s,
                verdict,
                part.audio_tokens,
                seconds,
            )
            said = [f"read {len(medium.frames)} frames at {medium.sampled_fps:.3g} fps"]
            if line := soundtrack_status_line(verdict, seconds):
                said.append(line)
        stats.media.append(entry)
        lines += said if len(media) == 1 else [f"{line} ({part.kind} {number} of {len(media)})" for line in said]
    videos = [entry for entry in stats.media if entry["kind"] == "video"]
    first = videos[0] if videos else {}
    stats.video_tokens_total = sum(entry["tokens_total"] for entry in videos)
    stats.frames_sampled = sum(entry["frames_sampled"] for entry in videos)
    stats.sampled_fps, stats.grid_thw = first.get("sampled_fps"), first.get("grid_thw")
    stats.audio_tokens = sum(entry["audio_tokens"] for entry in videos)
    stats.audio_seconds = sum(entry["audio_seconds"] for entry in videos)
    stats.soundtrack = first.get("soundtrack") or ("unsupported" if not hears else "off" if asked is False else "none")
    return lines


def soundtrack_status_line(verdict: str, seconds: float) -> str | None:
    """The status line of a request whose soundtrack was to be heard and was not, or not all of it (verdict:
    soundtrack_verdict's; seconds: how much was heard); None otherwise."""
    if verdict == "cut":
        return f"heard the first {seconds:g} s of the soundtrack"
    return {"none": NO_SOUNDTRACK, "unreadable": UNREADABLE_SOUNDTRACK}.get(verdict)


def held_bytes(media: list[Medium], prompt: UnprunedPrompt) -> int:
    """Host bytes a prepared request holds until its vision forward: its media's frames and soundtracks (an
    upload sent twice is one read), the processor's pixel values and each heard soundtrack's audio-tower input."""
    read = sum(medium.nbytes for medium in {id(medium): medium for medium in media}.values())
    processed = sum(
        part.pixel_values.nbytes + (part.audio.features.nbytes if part.audio is not None else 0)
        for part in prompt.media
    )
    return read + processed


class Preparer:
    """The prepare threads of one engine (one per reader, two at least: one hashes or runs the HF processor
    while another waits on a reader, so every reader can be busy) and the frame cache they share.

    system_prompt: the system turn of every prompt. hears: whether the model has an audio tower;
    soundtrack_rate_hz: the rate every soundtrack is read at (None when it cannot hear). think_end: the token
    that ends thinking, None when the model cannot think. enqueue: hands a prepared request to the worker.
    """

    def __init__(
        self,
        loaded,
        family,
        config: EngineConfig,
        readers: ReaderPool,
        memory_plan: Plan,
        *,
        system_prompt: str,
        hears: bool,
        soundtrack_rate_hz: int | None,
        think_end: int | None,
        enqueue: Callable[[Request], None],
    ):
        self.loaded, self.family, self.config = loaded, family, config
        self._readers, self._memory_plan = readers, memory_plan
        self._system_prompt, self._hears = system_prompt, hears
        self._soundtrack_rate_hz, self._think_end = soundtrack_rate_hz, think_end
        self._enqueue = enqueue
        self._levels = family.pixel_levels(loaded.processor)  # pixel value units -> 0-255 levels, per channel
        # The frame cache: sampled frames of recent uploads, so a follow-up question skips reading the file again.
        self._frames = ByteLRU(config.frame_cache_bytes)
        self._reading: dict[tuple, Future] = {}  # reads under way, by (digest, frame sampling, soundtrack read)
        self._frames_lock = threading.Lock()
        self._prepared = threading.Condition()
        self._preparing = 0  # requests accepted and not yet handed to the worker
        self._pool = ThreadPoolExecutor(max_workers=max(2, readers.size), thread_name_prefix="evs-prepare")

    @property
    def preparing(self) -> int:
        """Requests accepted and not yet handed to the worker (read without a lock: a scrape may be off by one)."""
        return self._preparing

    def submit(self, request: Request) -> None:
        """Prepare `request` on a prepare thread; it reaches the worker, or its stream ends with the reason."""
        with self._prepared:
            self._preparing += 1
        self._pool.submit(self._prepare, request)

    def wait_until_prepared(self, timeout_s: float) -> None:
        """Block until every request submitted so far is handed to the worker (or ended), at most timeout_s."""
        with self._prepared:
            self._prepared.wait_for(lambda: self._preparing == 0, timeout_s)

    def shutdown(self) -> None:
        """Let every accepted request finish preparing, then stop the threads."""
        self._pool.shutdown(wait=True)

    def _prepare(self, request: Request) -> None:
        try:
            self._prepare_request(request)
        finally:
            with self._prepared:
                self._preparing -= 1
                self._prepared.notify_all()

    def _prepare_request(self, request: Request) -> None:
        stream = request.stream
        if stream.cancelled:  # dropped before any work: end it like a cancel in the queue
            request.leave_queue()
            stream.push(Event("done", stats=request.stats.as_dict()))
            return
        try:
            count = len(request.media_paths)
            stream.push(Event("status", "reading video" if count == 1 else f"reading {count} files"))
            start = time.perf_counter()
            sampling = request.frame_sampling
            hear = self._hears and request.params.hear_soundtrack is not False
            request.media, read_now = self._read_media(request.media_paths, sampling, hear)
            think_end = self._think_end if request.params.enable_thinking else None
            request.prompt = unpruned_prompt(
                self.loaded,
                self.family,
                request.media,
                request.question,
                request.history,
                self._system_prompt,
                sampling.max_pixels_per_frame,
                thinking=think_end is not None,
                hear=hear,
            )
            skip = request.params.skip_still_patches and self.family.skips_still_patches
            request.plans = [
                encode_plan(
                    self.family,
                    medium,
                    self._levels,
                    self.config.vision_reuse,
                    skip and not medium.is_image,
                    pruning.STILL_THRESHOLD_LEVELS,
                )
                for medium in request.prompt.media
            ]
            if request.admission is not None:  # what it holds now, in place of the estimate from its sampling
                request.admission.settle(held_bytes(request.media, request.prompt))
            stats = request.stats
            stats.vision_patches_total = sum(medium.pixel_values.shape[0] for medium in request.prompt.media)
            stats.vision_patches_encoded = 0
            stats.read_video_s = time.perf_counter() - start
            stats.read_wait_s = sum(m.read_wait_s for m, now in zip(request.media, read_now) if now)
            stats.read_s = sum(m.read_s for m, now in zip(request.media, read_now) if now)
            lines = read_stats(stats, request.media, request.prompt, self._hears, request.params.hear_soundtrack)
            prompt_tokens = request.prompt.input_ids.numel()
            self._check_context(prompt_tokens, request.prompt.media_tokens, request.params.max_new_tokens, count)
            # Refused here, before the ViT, the KV cache or any device memory is touched.
            self._memory_plan.check_fits(
                request.prompt.media_tokens, prompt_tokens, request.params.max_new_tokens, media=count
            )
            request.detokenizer = SplitDetokenizer(self.loaded.processor.tokenizer, think_end)
            request.generator = torch.Generator().manual_seed(request.params.seed)
            for line in lines:
                stream.push(Event("status", line))
            stream.push(Event("status", "waiting for the GPU"))
            self._enqueue(request)
        except Exception as error:
            if not isinstance(error, InputError):
                log.exception("preparing request %d failed", request.id)
                error = RuntimeError("Something went wrong while preparing the request; please try again.")
            request.abort(error)

    def _check_context(self, prompt_tokens: int, media_tokens: int, max_new_tokens: int, media: int) -> None:
        """The whole prompt (counted before EVS, whose positions keep the unpruned length) and the answer
        must fit the model's context."""
        context = self.loaded.model.config.text_config.max_position_embeddings
        if prompt_tokens + max_new_tokens > context:
            what = "The video" if media == 1 else f"The {media} videos and pictures"
            raise InputError(
                f"{what} ({media_tokens:,} tokens), the conversation and up to {max_new_tokens:,} new tokens "
                f"need {prompt_tokens + max_new_tokens:,} tokens, more than the model's context of {context:,}: "
                "sample fewer frames or fewer pixels per frame, or start a new conversation."
            )

    def _read_media(self, paths: list[str], sampling: FrameSampling, hear: bool) -> tuple[list[Medium], list[bool]]:
        """(each upload read, whether it was read for this request), in order; the same bytes sent twice are
        read once. An InputError says which upload, when there are several."""
        media, read_now, seen = [], [], {}
        for number, path in enumerate(paths, start=1):
            try:
                medium, now = self._medium(path, sampling, hear, seen)
            except InputError as error:
                if len(paths) == 1:
                    raise
                raise InputError(f"Upload {number} of {len(paths)}: {error}") from None
            media.append(medium)
            read_now.append(now)
        return media, read_now

    def _medium(self, path: str, sampling: FrameSampling, hear: bool, seen: dict) -> tuple[Medium, bool]:
        """(an upload read: a video's sampled frames, with its soundtrack when hear, or a still picture; whether it
        was read for this request), shared: an upload already in `seen` (this request's, by content) is not read
        again, a recent read is reused, and two requests on the same bytes at once (compare mode, several users)
        wait for one read instead of running two (both count it as theirs). A read with the soundtrack also
        serves a request without it (the frames are the same); one without serves only its like, so a request
        that does not hear has no soundtrack decoded for it (up to 600 s of one)."""
        file = Path(path)
        try:  # the cleaner may delete an old upload at any moment, between two of these steps too
            hashable = file.is_file() and file.stat().st_size <= self.config.max_file_bytes
            if not hashable:  # read_medium says what is wrong with it
                return self._read(path, sampling, None, hear), True
            digest = file_sha256(path)
        except FileNotFoundError:
            raise InputError(EXPIRED_VIDEO) from None
        key = (digest, sampling, hear)
        if key in seen:
            return seen[key], False
        seen[key] = (medium := self._shared(path, sampling, hear, key))[0]
        return medium

    def _shared(self, path: str, sampling: FrameSampling, hear: bool, key: tuple) -> tuple[Medium, bool]:
        """_medium's read through the frame cache and the reads under way, by key."""
        serving = [key] if hear else [key, (key[0], sampling, True)]
        with self._frames_lock:
            medium = next((found for k in serving if (found := self._frames.get(k)) is not None), None)
            pending = next((self._reading[k] for k in serving if k in self._reading), None)
            owner = medium is None and pending is None
            if owner:
                pending = self._reading[key] = Future()
        if medium is not None:
            return medium, False
        if not owner:
            return pending.result(), True
        try:
            medium = self._read(path, sampling, key[0], hear)
            with self._frames_lock:
                self._frames.put(key, medium, medium.nbytes)
                if hear:  # it serves requests without the soundtrack too: the same frames need not stay twice
                    self._frames.pop((key[0], sampling, False))
            pending.set_result(medium)
            return medium, True
        except BaseException as error:
            pending.set_exception(error)
            raise
        finally:
            with self._frames_lock:
                del self._reading[key]

    def _read(self, path: str, sampling: FrameSampling, digest: str | None, hear: bool) -> Medium:
        """The upload read; a still picture with a side under one token refused (too_small)."""
        config = self.config
        medium = read_medium(
            path,
            sampling,
            max_seconds=config.max_video_seconds,
            max_bytes=config.max_file_bytes,
            timeout_s=config.read_timeout_s,
            temporal_patch=self.family.temporal_patch,
            content_hash=digest,
            max_source_pixels=config.max_video_source_pixels,
            memory_bytes=config.read_memory_bytes,
            readers=self._readers,
            soundtrack_rate_hz=self._soundtrack_rate_hz if hear else None,
            max_soundtrack_seconds=config.max_soundtrack_seconds,
            max_picture_pixels=config.max_picture_pixels,
        )
        if not is_video(medium) and (
            why := too_small("The picture", *medium.stored_size, self.family.token_side(self.loaded.processor))
        ):
            raise InputError(why)
        return medium
