"""The public engine: one per process; `submit` is thread-safe and never waits for the GPU."""

import contextlib
import itertools
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from .audio_inputs import audio_token_count, soundtrack_rate_hz
from .checks import check_markup, check_request, model_markup
from .config import (
    DEFAULT_PRUNING_RATE,
    DEFAULT_SYSTEM_PROMPT,
    EngineConfig,
    FrameSampling,
    FrameSamplingLimits,
    GenerationParams,
    default_frame_sampling,
    frame_sampling_limits,
    video_tokens,
)
from .errors import QUEUE_FULL, RESTARTING, BusyError, InputError
from .families import family_for, video_geometry
from .lru import ByteLRU
from .memory_plan import Plan, engine_plan
from .metrics import Metrics
from .models import load_model
from .prompt import PreparedPrompt, prepare_prompt
from .reader_pool import ReaderPool, default_size
from .request import Request
from .sampling import SplitDetokenizer
from .scheduler import vit_patch_budget
from .stream import Event, Stream
from .video import SampledVideo, file_sha256, load_video
from .worker import Worker

log = logging.getLogger(__name__)

NO_SOUNDTRACK = "the upload has no soundtrack"
UNREADABLE_SOUNDTRACK = "the soundtrack could not be read; answering from the frames"


def soundtrack_verdict(hears: bool, asked: bool | None, video: SampledVideo, prompt: PreparedPrompt) -> str:
    """The `soundtrack` stat: "unsupported" (the model has no audio tower), "off" (the request turned it off),
    "unreadable" (its stream did not decode), "none" (no audio stream, or one too short to hear), "cut" (only
    its first max_soundtrack_seconds were heard) or "heard"."""
    if not hears:
        return "unsupported"
    if asked is False:
        return "off"
    if video.soundtrack_status == "unreadable":
        return "unreadable"
    if prompt.audio is None:
        return "none"
    return "cut" if video.soundtrack.cut else "heard"


def soundtrack_status_line(verdict: str, seconds: float) -> str | None:
    """The status line of a request whose soundtrack was to be heard and was not, or not all of it (verdict:
    soundtrack_verdict's; seconds: how much was heard); None otherwise."""
    if verdict == "cut":
        return f"heard the first {seconds:g} s of the soundtrack"
    return {"none": NO_SOUNDTRACK, "unreadable": UNREADABLE_SOUNDTRACK}.get(verdict)


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
        self._admission = threading.BoundedSemaphore(self.config.max_queue)
        self._closed = False
        self._submit_lock = threading.Lock()  # a submit never races shutdown past the closed check
        self._preparing = 0  # requests submitted and not yet handed to the worker
        # The frame cache: sampled frames of recent uploads, so a follow-up question skips reading the file again.
        self._frames = ByteLRU(self.config.frame_cache_bytes)
        self._reading: dict[tuple, Future] = {}  # reads under way, by (digest, frame sampling, soundtrack read)
        self._frames_lock = threading.Lock()
        self._prepared = threading.Condition()
        self._pauses = 0  # paused() blocks open; admission is held while above 0
        device_type = self.loaded.device.type
        self._default_frame_sampling = self.config.frame_sampling or default_frame_sampling(device_type)
        self._frame_sampling_limits = frame_sampling_limits(device_type)
        patch, merge, temporal = video_geometry(self.loaded.model.config)

        def tokens_of(sampling: FrameSampling) -> int:
            return video_tokens(sampling.max_frames, sampling.max_pixels_per_frame, patch, merge, temporal)

        planned_video_tokens = tokens_of(self._default_frame_sampling)
        # A model that hears is planned with the longest soundtrack it may be given.
        planned_audio_tokens = audio_token_count(
            self.loaded.processor, int(self.config.max_soundtrack_seconds * self._soundtrack_rate_hz)
        ) if self._hears else 0
        self._memory_plan = engine_plan(
            self.loaded, self.config, planned_video_tokens, vit_patch_budget(self.config, self.loaded.device.type),
            planned_audio_tokens,
        )
        log.info("%s", self._memory_plan.summary())
        # Not worth starting if even a small request (the CPU default, or a smaller configured default)
        # would be refused.
        self._memory_plan.check_serviceable(min(planned_video_tokens, tokens_of(FrameSampling())))
        self._worker = Worker(self.loaded, self.family, self.config, max_running=self._memory_plan.max_running)
        cuda = self.loaded.device.type == "cuda"
        self.metrics = Metrics(running=lambda: self.running_requests, queued=lambda: self.queued_requests,
                               gpu_bytes=(lambda: torch.cuda.memory_allocated(self.loaded.device)) if cuda else None)
        # Started last, once nothing above can fail: the readers live until shutdown.
        self._readers = ReaderPool(self.config.video_readers or default_size())
        # As many as there are readers (two at least: one hashes or runs the HF processor while another
        # waits on a reader), so every reader can be busy.
        self._prepare_pool = ThreadPoolExecutor(max_workers=max(2, self._readers.size), thread_name_prefix="evs-prepare")
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
            "is_tiny": loaded.is_tiny,
            "random_weights": loaded.random_weights,
            "about": loaded.about,
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
    def running_requests(self) -> int:
        return len(self._worker.scheduler.running)

    @property
    def queued_requests(self) -> int:
        """Submitted and not yet taken by the worker: being read, on their way to it, or waiting there.
        Read from other threads without a lock, so a scrape may be off by a request in motion."""
        return self._preparing + self._worker.inbox.qsize() + len(self._worker.scheduler.waiting)

    def submit(
        self,
        video: str | Path | None,
        question: str,
        params: GenerationParams | None = None,
        history: list[tuple[str, str]] | tuple = (),
    ) -> Stream:
        """Queue a question about a video; returns at once with the request's Stream. Without params, the
        defaults at the checkpoint's own pruning rate (model_info["default_pruning_rate"]).

        Raises InputError for a bad question or parameters and BusyError when the queue is full; problems
        with the video itself (unreadable, too long, too large) arrive through the stream.
        """
        try:
            params = params or GenerationParams(pruning_rate=self._default_pruning_rate)
            history = check_request(video, question, params, history, self.config, self._frame_sampling_limits)
            self._check_text_tokens(question, history)
            with self._submit_lock:
                if self._closed:
                    raise BusyError(RESTARTING)
                if not self._admission.acquire(blocking=False):
                    raise BusyError(QUEUE_FULL)
                return self._accept(video, question, params, history)
        except (InputError, BusyError):
            self.metrics.refused()
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
            raise InputError(f"The question is {asked:,} tokens long; the limit is {self.config.max_question_tokens:,}.")
        earlier = sum(len(ids) for ids in tokenizer([text for turn in history for text in turn],
                                                     add_special_tokens=False)["input_ids"]) if history else 0
        if earlier > self.config.max_history_tokens:
            raise InputError(f"The conversation so far is {earlier:,} tokens long; the limit is "
                             f"{self.config.max_history_tokens:,}: please start a new conversation.")

    def _accept(self, video, question: str, params: GenerationParams, history) -> Stream:
        stream = Stream(next(self._ids), on_end=self.metrics.ended)
        request = Request(
            stream=stream,
            video_path=str(video),
            question=question.strip(),
            history=history,
            params=params,
            frame_sampling=params.frame_sampling or self._default_frame_sampling,
            admission=self._admission,
        )
        request.stats.pruning_rate = float(params.pruning_rate)
        with self._prepared:
            self._preparing += 1
        self._prepare_pool.submit(self._prepare, request)
        return stream

    @contextlib.contextmanager
    def paused(self, timeout_s: float = 120.0):
        """Hold admission while the block submits a burst; on exit wait until every submitted request
        is prepared, then let the worker take them all in one iteration (one ViT forward). Benchmarks
        and tests use it to make "simultaneous" exact; running requests keep decoding meanwhile.
        Pauses may overlap (two sweeps at once): admission resumes when the last one ends."""
        with self._prepared:
            self._pauses += 1
            self._worker.admitting.clear()
        try:
            yield self
            with self._prepared:
                self._prepared.wait_for(lambda: self._preparing == 0, timeout_s)
        finally:
            with self._prepared:
                self._pauses -= 1
                if self._pauses == 0:
                    self._worker.admitting.set()

    def _prepare(self, request: Request) -> None:
        """CPU work off the GPU thread: read the video's sampled frames (and soundtrack), run the HF processor."""
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
            stream.push(Event("status", "reading video"))
            start = time.perf_counter()
            sampling = request.frame_sampling
            hear = self._hears and request.params.hear_soundtrack is not False
            request.video, read_now = self._sampled_video(request.video_path, sampling, hear)
            think_end = self._think_end if request.params.enable_thinking else None
            request.prompt = prepare_prompt(
                self.loaded,
                self.family,
                request.video,
                request.question,
                request.history,
                self.system_prompt,
                sampling.max_pixels_per_frame,
                thinking=think_end is not None,
                soundtrack=request.video.soundtrack if hear else None,
            )
            T, h, w = request.prompt.grid_thw
            stats = request.stats
            stats.soundtrack = soundtrack_verdict(self._hears, request.params.hear_soundtrack, request.video,
                                                  request.prompt)
            stats.audio_tokens = int(request.prompt.is_audio.sum())
            stats.audio_seconds = request.video.soundtrack.seconds if request.prompt.audio is not None else 0.0
            stats.read_video_s = time.perf_counter() - start
            stats.read_wait_s = request.video.read_wait_s if read_now else 0.0
            stats.read_s = request.video.read_s if read_now else 0.0
            stats.frames_sampled = len(request.video.frames)
            stats.sampled_fps = request.video.sampled_fps
            stats.grid_thw, stats.video_tokens_total = [T, h, w], T * h * w
            self._check_context(request.prompt.input_ids.numel(), T * h * w, request.params.max_new_tokens)
            # Refused here, before the ViT, the KV cache or any device memory is touched.
            self._memory_plan.check_request(T * h * w, request.prompt.input_ids.numel(), request.params.max_new_tokens)
            request.detokenizer = SplitDetokenizer(self.loaded.processor.tokenizer, think_end)
            request.generator = torch.Generator().manual_seed(request.params.seed)
            stream.push(Event("status", f"read {stats.frames_sampled} frames at {stats.sampled_fps:.3g} fps"))
            if line := soundtrack_status_line(stats.soundtrack, stats.audio_seconds):
                stream.push(Event("status", line))
            stream.push(Event("status", "waiting for the GPU"))
            self._worker.enqueue(request)
        except Exception as error:
            if not isinstance(error, InputError):
                log.exception("preparing request %d failed", request.id)
                error = RuntimeError("Something went wrong while preparing the request; please try again.")
            request.abort(error)

    def _check_context(self, prompt_tokens: int, video_tokens: int, max_new_tokens: int) -> None:
        """The whole prompt (counted before EVS, whose positions keep the unpruned length) and the answer
        must fit the model's context."""
        context = self.loaded.model.config.text_config.max_position_embeddings
        if prompt_tokens + max_new_tokens > context:
            raise InputError(
                f"The video ({video_tokens:,} tokens), the conversation and up to {max_new_tokens:,} new tokens "
                f"need {prompt_tokens + max_new_tokens:,} tokens, more than the model's context of {context:,}: "
                "sample fewer frames or fewer pixels per frame, or start a new conversation.")

    def _sampled_video(self, path: str, sampling, hear: bool) -> tuple[SampledVideo, bool]:
        """(sampled frames of an upload, with its soundtrack when hear; whether they were read for this request),
        shared: a recent read is reused, and two requests on the same bytes at once (compare mode, several
        users) wait for one read instead of running two (both count it as theirs). A read with the soundtrack
        also serves a request without it (the frames are the same); one without serves only its like, so a
        request that does not hear has no soundtrack decoded for it (up to 600 s of one)."""
        file = Path(path)
        hashable = file.is_file() and file.stat().st_size <= self.config.max_file_bytes
        if not hashable:  # load_video says what is wrong with it
            return self._load_video(path, sampling, None, hear), True
        key = (file_sha256(path), sampling, hear)
        serving = [key] if hear else [key, (key[0], sampling, True)]
        with self._frames_lock:
            video = next((found for k in serving if (found := self._frames.get(k)) is not None), None)
            pending = next((self._reading[k] for k in serving if k in self._reading), None)
            owner = video is None and pending is None
            if owner:
                pending = self._reading[key] = Future()
        if video is not None:
            return video, False
        if not owner:
            return pending.result(), True
        try:
            video = self._load_video(path, sampling, key[0], hear)
            with self._frames_lock:
                self._frames.put(key, video, video.nbytes)
                if hear:  # it serves requests without the soundtrack too: the same frames need not stay twice
                    self._frames.pop((key[0], sampling, False))
            pending.set_result(video)
            return video, True
        except BaseException as error:
            pending.set_exception(error)
            raise
        finally:
            with self._frames_lock:
                del self._reading[key]

    def _load_video(self, path: str, sampling, digest: str | None, hear: bool) -> SampledVideo:
        config = self.config
        return load_video(
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
        )

    def shutdown(self) -> None:
        """Stop taking requests, let accepted ones reach the worker, then end every stream still open."""
        with self._submit_lock:
            self._closed = True
        self._prepare_pool.shutdown(wait=True)
        self._readers.shutdown()
        self._worker.stop()
        self._worker.join(timeout=30)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
