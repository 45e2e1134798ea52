"""The public engine: one per process; `submit` is thread-safe and never waits for the GPU."""

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from .config import (
    DEFAULT_PRUNING_RATE,
    DEFAULT_SYSTEM_PROMPT,
    EngineConfig,
    FrameSampling,
    FrameSamplingLimits,
    GenerationParams,
    default_frame_sampling,
    frame_sampling_limits,
    max_media,
    video_tokens,
    vit_patch_budget,
)
from .errors import RESTARTING, BusyError, InputError
from .families.registry import family_for, video_geometry
from .front.checks import check_markup, check_request, media_paths, model_markup
from .front.metrics import Metrics
from .front.shares import ClientShare, ClientShares
from .live.session import LiveSession
from .live_sessions import LiveSessions
from .loading.load import load_model
from .memory.plan import Plan, engine_plan
from .prepare import Preparer
from .prompt.audio import audio_token_count, soundtrack_rate_hz
from .reading.pool import ReaderPool, default_size
from .scheduling.admission import Admission, Ticket, default_admission_bytes, request_host_bytes
from .scheduling.request import Request
from .stream import Stream
from .worker.loop import Worker

log = logging.getLogger(__name__)


def think_end_id(family, tokenizer) -> int | None:
    """The token that ends the model's thinking, or None when the model has no thinking switch."""
    if family.think_end is None:
        return None
    token_id = tokenizer.convert_tokens_to_ids(family.think_end)
    return None if token_id is None or token_id == tokenizer.unk_token_id else token_id


class Engine:
    """Loads the model once and serves every request through one worker thread.

    Example: `Engine(EngineConfig(model="tiny-random", device="cpu")).submit(video=..., question=...)`.
    """

    def __init__(self, config: EngineConfig | None = None):
        self.config = config or EngineConfig()
        self.loaded = load_model(self.config.model, self.config.device, self.config.cache_dir)
        self.family = family_for(self.loaded.model)
        self._think_end = think_end_id(self.family, self.loaded.processor.tokenizer)
        self._markup = model_markup(self.loaded.processor.tokenizer)
        # An earlier answer may come back with its think block (an OpenAI client sends what it got): the
        # family writes it without one (Family.earlier_answer), so those two tags are not markup there.
        self._answer_markup = tuple(tag for tag in self._markup if tag not in ("<think>", "</think>"))
        self._hears = self.family.hears(self.loaded.model)
        # The rate every soundtrack is read at (the processor's), or None: a model that cannot hear reads none.
        self._soundtrack_rate_hz = soundtrack_rate_hz(self.loaded.processor) if self._hears else None
        # The checkpoint's own `video_pruning_rate` when its config.json has one, else DEFAULT_PRUNING_RATE.
        rate = self.loaded.video_pruning_rate
        self._default_pruning_rate = DEFAULT_PRUNING_RATE if rate is None else rate
        self._ids = itertools.count(1)
        self._admission = Admission(self.config.max_queue, self.config.admission_bytes or default_admission_bytes())
        self._shares = ClientShares(self.config.max_client_requests)
        self._closed = False
        self._submit_lock = threading.Lock()  # a submit never races shutdown past the closed check
        self._pause_lock = threading.Lock()
        self._pauses = 0  # paused() blocks open; admission is held while above 0
        device_type = self.loaded.device.type
        self._default_frame_sampling = self.config.frame_sampling or default_frame_sampling(device_type)
        self._frame_sampling_limits = frame_sampling_limits(device_type)
        patch, merge, temporal = video_geometry(self.loaded.model.config)

        def tokens_of(sampling: FrameSampling) -> int:
            return video_tokens(sampling.max_frames, sampling.max_pixels_per_frame, patch, merge, temporal)

        planned_video_tokens = self._planned_video_tokens = tokens_of(self._default_frame_sampling)
        # A model that hears is planned with the longest soundtrack it may be given.
        planned_audio_tokens = (
            audio_token_count(self.loaded.processor, int(self.config.max_soundtrack_seconds * self._soundtrack_rate_hz))
            if self._hears
            else 0
        )
        self._memory_plan = engine_plan(
            self.loaded,
            self.config,
            planned_video_tokens,
            vit_patch_budget(self.config, self.loaded.device.type),
            planned_audio_tokens,
        )
        log.info("%s", self._memory_plan.summary())
        # Not worth starting if even a small request (the CPU default, or a smaller configured default)
        # would be refused.
        self._memory_plan.check_serviceable(min(planned_video_tokens, tokens_of(FrameSampling())))
        self._worker = Worker(self.loaded, self.family, self.config, max_running=self._memory_plan.max_running)
        cuda = self.loaded.device.type == "cuda"
        self.metrics = Metrics(
            running=lambda: self.running_requests,
            queued=lambda: self.queued_requests,
            gpu_bytes=(lambda: torch.cuda.memory_allocated(self.loaded.device)) if cuda else None,
        )
        # Started last, once nothing above can fail: the readers live until shutdown.
        self._readers = ReaderPool(self.config.video_readers or default_size())
        self._preparer = Preparer(
            self.loaded,
            self.family,
            self.config,
            self._readers,
            self._memory_plan,
            system_prompt=self.system_prompt,
            hears=self._hears,
            soundtrack_rate_hz=self._soundtrack_rate_hz,
            think_end=self._think_end,
            enqueue=self._worker.enqueue,
        )
        self._live = LiveSessions(self)
        self._worker.start()

    @property
    def model_info(self) -> dict:
        loaded = self.loaded
        return {
            "name": loaded.name,
            "family": loaded.family,
            "device": str(loaded.device),
            "dtype": str(loaded.dtype).removeprefix("torch."),
            "attn": loaded.attn_implementation,
            # What each tower was built with (transformers may settle on another kernel than asked for).
            "attn_vision": loaded.model.config.vision_config._attn_implementation,
            "attn_text": loaded.model.config.text_config._attn_implementation,
            "attn_linear": loaded.linear_attention,  # a hybrid model's linear-attention kernels, else None
            "default_pruning_rate": self._default_pruning_rate,
            # Whether GenerationParams.enable_thinking does anything: the family has the switch and the
            # tokenizer the token that ends the thinking.
            "thinks": self._think_end is not None,
            # Whether the model has an audio tower: GenerationParams.hear_soundtrack does something, and the
            # soundtrack is heard by default.
            "hears": self._hears,
            # Whether GenerationParams.skip_still_patches does anything: the vision tower encodes part of a group.
            "skips_still_patches": self.family.skips_still_patches,
            "max_media": self.max_media,  # videos and pictures one request may carry
            "max_history_turns": self.config.max_history_turns,  # earlier questions a conversation may hold
            "is_tiny": loaded.is_tiny,
            "random_weights": loaded.random_weights,
            "about": loaded.about,
            # Live sessions: what the model can be asked live, the seconds of stream it reads (None: its window
            # alone bounds it), and the words it learned to answer with (None: any), for the app.
            "live_about": loaded.live_about,
            "live_span_s": loaded.live_span_s,
            "answers": list(loaded.answers) if loaded.answers is not None else None,
        }

    @property
    def default_frame_sampling(self) -> FrameSampling:
        """Sampling of a request that names none: EngineConfig.frame_sampling, else the device's default."""
        return self._default_frame_sampling

    @property
    def frame_sampling_limits(self) -> FrameSamplingLimits:
        """The sampling ranges a UI should offer on this engine's device."""
        return self._frame_sampling_limits

    @property
    def max_media(self) -> int:
        """Videos and pictures one request may carry (EngineConfig.max_media, else the device's default)."""
        return max_media(self.config, self.loaded.device.type)

    @property
    def memory_plan(self) -> Plan:
        """Video tokens per request and requests decoding together that the device's memory allows."""
        return self._memory_plan

    @property
    def system_prompt(self) -> str:
        """The system turn of every prompt: the config's, else the model's own, else the default."""
        for prompt in (self.config.system_prompt, self.loaded.system_prompt):
            if prompt is not None:
                return prompt
        return DEFAULT_SYSTEM_PROMPT

    @property
    def vision(self):
        """The vision batcher (its feature cache and forward count), for tests and benchmarks."""
        return self._worker.runner.vision

    @property
    def readers(self) -> ReaderPool:
        """The warm reader processes (their pids and how many are idle), for tests and benchmarks."""
        return self._readers

    @property
    def prefix_cache(self):
        return self._worker.runner.prefix

    @property
    def healthy(self) -> bool:
        """False once the worker thread has died: the engine can no longer answer."""
        return self._worker.is_alive()

    @property
    def stalled_s(self) -> float:
        """Seconds since the worker thread last finished a turn of its loop: at most about 0.1 s when idle, the
        longest iteration (a prefill) when busy, and growing without bound on a device that hangs."""
        return time.monotonic() - self._worker.turned_at

    @property
    def running_requests(self) -> int:
        return len(self._worker.scheduler.running)

    @property
    def queued_requests(self) -> int:
        """Submitted and not yet taken by the worker: being read, on their way to it, or waiting there.
        Read from other threads without a lock, so a scrape may be off by a request in motion."""
        return self._preparer.preparing + self._worker.inbox.qsize() + len(self._worker.scheduler.waiting)

    def submit(
        self,
        video: str | Path | None = None,
        question: str | None = None,
        params: GenerationParams | None = None,
        history: list[tuple[str, str]] | tuple = (),
        media: Sequence[str | Path] | None = None,
        client: str | None = None,
    ) -> Stream:
        """Queue a question about uploads; returns at once with the request's Stream. video: one upload; media:
        several (videos and still pictures, in the order the prompt shows them; a follow-up sends the same
        ones, a new one appended); give one of the two. Without params, the defaults at the checkpoint's own
        pruning rate (model_info["default_pruning_rate"]). client: who asks (a browser tab's session, an API
        caller's address), which may have at most max_client_requests under way; None takes no share.

        Raises InputError for a bad question, parameters or too many media, and BusyError when the queue is
        full or the client holds its share; problems with an upload itself (unreadable, too long, too large)
        arrive through the stream.
        """
        try:
            params = params or GenerationParams(pruning_rate=self._default_pruning_rate)
            paths = media_paths(video, media)
            history = check_request(
                paths, question, params, history, self.config, self._frame_sampling_limits, self.max_media
            )
            self._check_text_tokens(question, history)
            sampling = params.frame_sampling or self._default_frame_sampling
            hear = self._hears and params.hear_soundtrack is not False
            needed = request_host_bytes(
                len(paths), sampling, self._soundtrack_rate_hz if hear else None, self.config.max_soundtrack_seconds
            )
            with self._submit_lock:
                if self._closed:
                    raise BusyError(RESTARTING)
                share = self._shares.take(client)
                try:
                    ticket = self._admission.take(needed)
                except BaseException:
                    share.release()
                    raise
                try:
                    return self._accept(paths, question, params, history, ticket, share)
                except BaseException:
                    ticket.close()
                    share.release()
                    raise
        except (InputError, BusyError) as error:
            self.metrics.refused(error)
            raise

    def _check_text_tokens(self, question: str, history: list[tuple[str, str]]) -> None:
        """No tag of the model's own in the question or history; both counted in the model's tokens
        (characters say little across languages)."""
        check_markup(question, "question", self._markup)
        for asked, answered in history:
            check_markup(asked, "conversation history", self._markup)
            check_markup(answered, "conversation history", self._answer_markup)
        tokenizer = self.loaded.processor.tokenizer
        asked = len(tokenizer(question, add_special_tokens=False)["input_ids"])
        if asked > self.config.max_question_tokens:
            raise InputError(
                f"The question is {asked:,} tokens long; the limit is {self.config.max_question_tokens:,}."
            )
        earlier = (
            sum(
                len(ids)
                for ids in tokenizer([text for turn in history for text in turn], add_special_tokens=False)["input_ids"]
            )
            if history
            else 0
        )
        if earlier > self.config.max_history_tokens:
            raise InputError(
                f"The conversation so far is {earlier:,} tokens long; the limit is "
                f"{self.config.max_history_tokens:,}: please start a new conversation."
            )

    def _accept(
        self, paths: list, question: str, params: GenerationParams, history, ticket: Ticket, share: ClientShare
    ) -> Stream:
        def ended(stream: Stream) -> None:
            share.release()
            self.metrics.ended(stream)

        stream = Stream(next(self._ids), on_end=ended)
        request = Request(
            stream=stream,
            media_paths=[str(path) for path in paths],
            question=question.strip(),
            history=history,
            params=params,
            frame_sampling=params.frame_sampling or self._default_frame_sampling,
            admission=ticket,
        )
        request.stats.pruning_rate = float(params.pruning_rate)
        request.stats.pruning_method = params.pruning_method
        self._preparer.submit(request)
        return stream

    def open_live(self, params: GenerationParams | None = None) -> LiveSession:
        """A live session: push frames as they are captured, ask about the stream so far (docs/live.md). params:
        its pruning rate and frame sampling (fps, pixels per frame), and its questions' default settings; None:
        the defaults at the checkpoint's pruning rate. InputError for bad settings; BusyError when
        max_live_sessions are open or the engine is shutting down."""
        return self._live.open(params or GenerationParams(pruning_rate=self._default_pruning_rate))

    @property
    def planned_video_tokens(self) -> int:
        """Video tokens of one request at the device's default frame sampling, as the memory plan sizes rows."""
        return self._planned_video_tokens

    @contextlib.contextmanager
    def paused(self, timeout_s: float = 120.0):
        """Hold admission while the block submits a burst; on exit wait until every submitted request
        is prepared, then let the worker take them all in one iteration (one ViT forward). Benchmarks
        and tests use it to make "simultaneous" exact; running requests keep decoding meanwhile.
        Pauses may overlap (two sweeps at once): admission resumes when the last one ends."""
        with self._pause_lock:
            self._pauses += 1
            self._worker.admitting.clear()
        try:
            yield self
            self._preparer.wait_until_prepared(timeout_s)
        finally:
            with self._pause_lock:
                self._pauses -= 1
                if self._pauses == 0:
                    self._worker.admitting.set()

    def shutdown(self) -> None:
        """Stop taking requests, let accepted ones reach the worker, then end every stream still open."""
        with self._submit_lock:
            self._closed = True
        self._live.shutdown()
        self._preparer.shutdown()
        self._readers.shutdown()
        self._worker.stop()
        self._worker.join(timeout=30)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
