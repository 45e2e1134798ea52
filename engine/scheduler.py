"""The worker thread that owns the model: admit -> encode -> EVS -> prefill -> one decode step for all.

Only this thread touches the model, so no locks guard it; callers talk to it through a queue and read
results from each request's Stream.
"""

import logging
import queue
import threading
import time
from collections import deque

import numpy as np
import torch

from .batch_kv import DecodeBatch, cache_tensors, new_cache
from .families import Family
from .lm import LMInput, embed_prompt, embed_tokens, lm_logits
from .prefix_cache import PrefixCache, prefix_key
from .pruning import prune_prompt
from .request import Request
from .sampling import next_token
from .stream import Event, EvsPicture
from .vision import VisionEncoder

log = logging.getLogger(__name__)


def internal_error() -> RuntimeError:
    return RuntimeError("The engine hit an internal error; please try again.")


def shutting_down() -> RuntimeError:
    return RuntimeError("The engine is shutting down.")


def eos_token_ids(loaded) -> set[int]:
    ids = loaded.model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if loaded.processor.tokenizer.eos_token_id is not None:
        ids.add(loaded.processor.tokenizer.eos_token_id)
    return ids


def vit_token_budget(config, device: torch.device) -> int:
    if config.vit_token_budget is not None:
        return config.vit_token_budget
    return 65536 if device.type == "cuda" else 4096


class Scheduler(threading.Thread):
    """max_running: requests decoding together, config.max_running unless the memory plan allows fewer."""

    def __init__(self, loaded, family: Family, config, max_running: int | None = None):
        super().__init__(name="evs-gpu-worker", daemon=True)
        self.loaded = loaded
        self.model = loaded.model
        self.family = family
        self.config = config
        self.max_running = config.max_running if max_running is None else min(max_running, config.max_running)
        self.vision = VisionEncoder(
            self.model, family, loaded.name, config.feature_cache_bytes, vit_token_budget(config, loaded.device)
        )
        self.prefix = PrefixCache(config.prefix_cache_bytes)
        self.batch = DecodeBatch()
        self.eos_ids = eos_token_ids(loaded)
        self.temporal_patch = self.model.config.vision_config.temporal_patch_size
        self.inbox: queue.Queue[Request | None] = queue.Queue()
        self.waiting: deque[Request] = deque()  # prepared, not yet admitted
        self.encoded: deque[Request] = deque()  # features and EVS done, prefill pending
        self.running: dict[int, Request] = {}  # in the decode batch
        self._stopping = threading.Event()
        self.admitting = threading.Event()  # cleared by Engine.paused() to line up a burst
        self.admitting.set()

    # --- called from other threads -------------------------------------------------------------
    def enqueue(self, request: Request) -> None:
        self.inbox.put(request)

    def stop(self) -> None:
        self._stopping.set()
        self.inbox.put(None)

    # --- the loop ------------------------------------------------------------------------------
    def run(self) -> None:
        with torch.inference_mode():
            while not self._stopping.is_set():
                try:
                    self._iteration()
                except Exception:  # a bug or a device fault: fail the requests on the device, keep serving
                    log.exception("engine iteration failed")
                    self._fail_many([*self.running.values(), *self.encoded], internal_error)
        self._fail_many([*self.running.values(), *self.encoded, *self.waiting, *self._drain_inbox()], shutting_down)

    def _iteration(self) -> None:
        idle = not self.running and not self.encoded
        self._collect(block=idle and not (self.waiting and self.admitting.is_set()))
        self._drop_cancelled()
        busy = len(self.running) + len(self.encoded)
        free = self.max_running - busy if self.admitting.is_set() else 0
        new = [self.waiting.popleft() for _ in range(min(free, len(self.waiting)))]
        if new:
            for request in new:
                request.leave_queue()
            self._start(new)
        self._prefill_within_budget()
        if self.running:
            self._decode_step()

    def _collect(self, block: bool) -> None:
        """Move arrived requests to `waiting`; when block, wait up to 0.1 s for the first one."""
        if block:
            try:
                first = self.inbox.get(timeout=0.1)
            except queue.Empty:
                return
            if first is not None:
                self.waiting.append(first)
        self.waiting.extend(self._drain_inbox())

    # --- new requests: vision, EVS, prefill ------------------------------------------------------
    def _start(self, requests: list[Request]) -> None:
        """Requests taken from the queue are in neither `waiting` nor `running` until their prefill
        ends, so a failure here must fail them itself."""
        try:
            self.vision.encode(requests, on_batch=self._announce_vit)
        except Exception:
            log.exception("vision forward failed")
            for request in requests:
                self._fail(request, RuntimeError("Encoding the video failed on the server; please try again."))
            return
        for request in requests:
            try:
                self._evs(request)
            except Exception:
                log.exception("request %d failed", request.id)
                self._fail(request, internal_error())
            else:
                self.encoded.append(request)

    def _prefill_within_budget(self) -> None:
        """Prefill encoded requests until this iteration's token budget is spent (at least one), so a
        burst of new prompts delays the running requests' next token by a bounded amount."""
        budget, spent = self.config.prefill_token_budget, 0
        while self.encoded and (spent == 0 or spent + self.encoded[0].pruned.input_ids.numel() <= budget):
            request = self.encoded.popleft()
            spent += request.pruned.input_ids.numel()
            try:
                self._prefill(request)
            except Exception:
                log.exception("request %d failed", request.id)
                self._fail(request, internal_error())

    def _announce_vit(self, served: list[Request]) -> None:
        for request in served:
            others = len(served) - 1
            frames = request.prompt.grid_thw[0] * self.temporal_patch
            tail = f" (batched with {others} other request{'s' if others != 1 else ''})" if others else ""
            request.stream.push(Event("status", f"encoding {frames} frames{tail}"))

    def _evs(self, request: Request) -> None:
        start = time.perf_counter()
        request.pruned = pruned = prune_prompt(request.prompt, request.features, request.params.pruning_rate)
        request.stats["evs_s"] = time.perf_counter() - start
        T, h, w = request.prompt.grid_thw
        request.stream.push(
            Event(
                "evs",
                evs=EvsPicture(
                    frames=request.video.frames[:: self.temporal_patch][:T],
                    timestamps_s=request.prompt.timestamps_s,
                    grid_thw=(T, h, w),
                    kept_mask=pruned.retention.reshape(T, h, w).numpy(),
                    dissimilarity=pruned.dissimilarity.numpy().astype(np.float16),
                ),
            )
        )
        request.stream.push(Event("status", "prefill"))

    def _prefill(self, request: Request) -> None:
        start = time.perf_counter()
        pruned = request.pruned
        request.prefix_key = prefix_key(
            request.feature_key, request.params.pruning_rate, pruned.input_ids[: pruned.prefix_len]
        )
        cache, begin = self.prefix.lookup(request.prefix_key, pruned.input_ids, min_len=pruned.prefix_len)
        hit = cache is not None
        ids = pruned.input_ids[begin:]
        positions = pruned.positions[:, None, begin:].to(self.model.device)
        if hit:  # the video lies inside the reused part; the rest is text
            batch = LMInput(embed_tokens(self.model, ids)[None], positions)
        else:
            cache = new_cache()
            embeds = embed_prompt(self.model, ids, pruned.video_mask, pruned.features)
            visual_mask = pruned.video_mask[None].to(self.model.device)
            batch = LMInput(embeds[None], positions, None, visual_mask, pruned.features.deepstack)
        logits = lm_logits(self.model, self.family, batch, cache)
        request.stats.update(
            prefix_cache_hit=hit, prefill_tokens=ids.numel(), prefill_s=time.perf_counter() - start, decode_batch_max=1
        )
        request.tokens_seen = pruned.input_ids.numel()
        request.next_position = pruned.next_position
        self._emit(request, next_token(logits[0], request.params.temperature, request.params.top_p, request.generator))
        if request.stream.finished:
            self._retire(request, cache_tensors(cache))
        else:
            if not hit:  # requests arriving meanwhile on the same video reuse at least this prompt
                self.prefix.store(request.prefix_key, pruned.input_ids, cache_tensors(cache))
            self.running[request.id] = request
            self.batch.add(request.id, cache)

    def _remember(self, request: Request, tensors: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Store a request's conversation KV (prompt + the answer tokens fed back so far; a cancelled one's
        too, its partial answer is what a follow-up will quote) for a follow-up.
        tensors: per layer (1, heads, tokens_seen, head_dim)."""
        answer = torch.tensor(request.decoder.token_ids[: request.tokens_seen - request.pruned.input_ids.numel()])
        token_ids = torch.cat([request.pruned.input_ids, answer.to(request.pruned.input_ids.dtype)])
        self.prefix.store(request.prefix_key, token_ids, tensors)

    # --- the shared decode step -----------------------------------------------------------------
    def _decode_step(self) -> None:
        rows = [self.running[key] for key in self.batch.keys]
        device = self.model.device
        tokens = torch.tensor([r.last_token for r in rows], device=device)
        one_d = torch.tensor([r.tokens_seen for r in rows], device=device)
        mrope = torch.tensor([r.next_position for r in rows], device=device)
        positions = torch.stack([one_d, mrope, mrope, mrope])[:, :, None]  # (4, B, 1)
        batch = LMInput(embed_tokens(self.model, tokens)[:, None], positions, self.batch.step_mask())
        logits = lm_logits(self.model, self.family, batch, self.batch.cache)
        greedy = logits.argmax(dim=-1).tolist()  # one host sync for every greedy row
        for i, request in enumerate(rows):
            request.tokens_seen += 1
            request.next_position += 1
            request.stats["decode_batch_max"] = max(request.stats["decode_batch_max"], len(rows))
            params = request.params
            sampled = params.temperature > 0
            token = next_token(logits[i], params.temperature, params.top_p, request.generator) if sampled else greedy[i]
            self._emit(request, token)
        self._leave({r.id for r in rows if r.stream.finished})

    def _emit(self, request: Request, token: int) -> None:
        now = time.perf_counter()
        if request.first_token_at is None:
            request.first_token_at = now
            request.stats["ttft_s"] = now - request.submitted_at
        is_eos = token in self.eos_ids and not request.params.ignore_eos
        if not is_eos:
            piece = request.decoder.add(token)
            if piece:
                request.stream.push(Event("text", piece))
        request.last_token = token
        if is_eos or request.generated >= request.params.max_new_tokens:
            self._finish(request)

    # --- leaving ---------------------------------------------------------------------------------
    def _finish(self, request: Request) -> None:
        if request.decoder is not None and (tail := request.decoder.flush()):
            request.stream.push(Event("text", tail))
        now = time.perf_counter()
        stats = request.stats
        stats["generated_tokens"] = request.generated
        stats["total_s"] = now - request.submitted_at
        stats["decode_s"] = now - request.first_token_at if request.first_token_at else 0.0
        if request.pruned is not None:
            stats.update(
                video_tokens_kept=int(request.pruned.retention.sum()),
                tokens_kept_per_frame=request.pruned.tokens_kept_per_group,
                prompt_tokens=int(request.pruned.input_ids.numel()),
            )
        token_ids = tuple(request.decoder.token_ids) if request.decoder else ()
        request.stream.push(Event("done", stats=stats, token_ids=token_ids))

    def _fail(self, request: Request, error: BaseException) -> None:
        self.running.pop(request.id, None)
        if request.id in self.batch.keys:
            self.batch.remove({request.id})
        request.abort(error)

    def _fail_many(self, requests: list[Request], make_error) -> None:
        """Fail requests (every running one among them) without touching the device again: after a fault
        it may be out of memory, so the decode batch is dropped whole instead of rebuilt row by row."""
        failed = {id(r) for r in requests}
        self.batch = DecodeBatch()
        self.running.clear()
        self.encoded = deque(r for r in self.encoded if id(r) not in failed)
        self.waiting = deque(r for r in self.waiting if id(r) not in failed)
        for request in requests:
            request.abort(make_error())

    def _drain_inbox(self) -> list[Request]:
        drained = []
        while True:
            try:
                request = self.inbox.get_nowait()
            except queue.Empty:
                return drained
            if request is not None:
                drained.append(request)

    def _leave(self, gone: set[int]) -> None:
        """Finished or cancelled rows leave the decode batch; their conversation KV is kept for reuse."""
        if not gone:
            return
        for key in gone:
            self._retire(self.running.pop(key), self.batch.row_tensors(key))
        self.batch.remove(gone)

    def _retire(self, request: Request, tensors: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self._remember(request, tensors)
        request.release()

    def _drop_cancelled(self) -> None:
        for queue_ in (self.waiting, self.encoded):
            for request in [r for r in queue_ if r.stream.cancelled]:
                queue_.remove(request)
                request.leave_queue()
                self._finish(request)
                request.release()
        cancelled = [r for r in self.running.values() if r.stream.cancelled]
        for request in cancelled:
            self._finish(request)
        self._leave({r.id for r in cancelled})
