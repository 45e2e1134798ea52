"""The worker thread that owns the model: each iteration the scheduler decides, the runner runs the
forwards, and outputs go to the streams (docs/architecture.md, "Request path").

Only this thread touches the model, so no locks guard it; callers talk to it through a queue and read
results from each request's Stream.
"""

import logging
import queue
import threading
import time

import torch

from engine.config import vit_patch_budget
from engine.errors import SHUTTING_DOWN, InputError
from engine.families.base import Family
from engine.scheduling.request import Request
from engine.scheduling.scheduler import Scheduler
from engine.scheduling.stage import Stage

from . import events
from .runner import ModelRunner
from .token_choice import next_token

log = logging.getLogger(__name__)


def internal_error() -> RuntimeError:
    return RuntimeError("The engine hit an internal error; please try again.")


def vision_failed() -> RuntimeError:
    return RuntimeError("Encoding the video failed on the server; please try again.")


def shutting_down() -> RuntimeError:
    return RuntimeError(SHUTTING_DOWN)


def ask_dropped() -> RuntimeError:
    return RuntimeError("A watch's ask gave way to a user's question.")


def live_session_ended() -> InputError:
    return InputError("The live session ended before the question could be answered.")


class Worker(threading.Thread):
    """max_running: requests past the queue together, config.max_running unless the memory plan allows fewer."""

    def __init__(self, loaded, family: Family, config, max_running: int | None = None):
        super().__init__(name="evs-gpu-worker", daemon=True)
        self.runner = ModelRunner(loaded, family, config)
        self.temporal_patch = family.temporal_patch
        self.scheduler = Scheduler(
            max_running=config.max_running if max_running is None else min(max_running, config.max_running),
            vit_patch_budget=vit_patch_budget(config, loaded.device.type),
            prefill_token_budget=config.prefill_token_budget,
            weights=self.runner.weights,
            missing=self.runner.missing,
            ready=self.runner.live.ready,
        )
        self.inbox: queue.Queue[Request | None] = queue.Queue()
        self._stopping = threading.Event()
        self.admitting = threading.Event()  # cleared by Engine.paused() to line up a burst
        self.admitting.set()
        # time.monotonic() at the end of the loop's latest turn: every 0.1 s at most when idle, after every
        # iteration when busy; a device that hangs stops it (Engine.stalled_s).
        self.turned_at = time.monotonic()

    # --- called from other threads -------------------------------------------------------------
    def enqueue(self, request: Request) -> None:
        self.inbox.put(request)

    def wake(self) -> None:
        """A live session has work: the worker stops waiting for requests (None is never queued as one)."""
        self.inbox.put(None)

    def stop(self) -> None:
        self._stopping.set()
        self.inbox.put(None)

    # --- the loop ------------------------------------------------------------------------------
    def run(self) -> None:
        with torch.inference_mode():
            while not self._stopping.is_set():
                try:
                    self.step()
                except Exception:  # a bug or a device fault: fail the requests on the device, keep serving
                    log.exception("engine iteration failed")
                    self.runner.drop_batch()
                    self._end(self.scheduler.past_queue(), internal_error)
                self.turned_at = time.monotonic()
        self._end([*self.scheduler, *self._drain_inbox()], shutting_down)

    def step(self) -> None:
        scheduler, live = self.scheduler, self.runner.live
        self._collect(block=scheduler.idle and not live.busy and not (scheduler.waiting and self.admitting.is_set()))
        live.refresh()
        self._end([r for r in scheduler if r.stream.cancelled])
        self._end([r for r in scheduler if live.gone(r)], live_session_ended)  # admitted ones too
        if self.admitting.is_set():
            for request in scheduler.admit():
                request.leave_queue()
            self._drop_asks(scheduler.preempted)
            scheduler.preempted = []
        groups = live.vision_work()
        groups = groups[: scheduler.live_share([len(g.pixel_values) for g in groups])]
        self._encode(scheduler.encode_chunk(sum(len(g.pixel_values) for g in groups)), groups)
        batch = scheduler.prefill_batch()
        spent = sum(map(scheduler.prefill_tokens, batch))  # before the prefill: a request answered at once lets go
        self._prefill(batch)
        live.prefill(scheduler.prefill_token_budget - spent)
        self._ask_watches()
        self._decode()

    def _ask_watches(self) -> None:
        """Each watch due an ask gets one now if there is room, below users' requests; else it is dropped: when
        admission refuses it a queue slot (the engine is behind), its session has just ended, or no decode slot
        is free that no user's request is ready to take."""
        for watch in self.runner.live.take_due():
            try:
                request = watch.make_ask()
            except InputError:  # BusyError: admission's queue is full; SessionEnded: the session just ended
                watch.dropped()
                continue
            if self.scheduler.take_background(request):
                request.leave_queue()  # in a decode slot at once, as admit() takes a user's
                watch.asking()
            else:
                request.admission.close()
                watch.dropped()

    def _drop_asks(self, asks: list[Request]) -> None:
        """Watches' asks taken back for users' requests: each watch asks again at its next group."""
        for request in asks:
            request.live.watch.dropped()
        self._end(asks, ask_dropped)

    def _collect(self, block: bool) -> None:
        """Queue arrived requests; when block, wait up to 0.1 s for the first one."""
        arrived = []
        if block:
            try:
                arrived.append(self.inbox.get(timeout=0.1))
            except queue.Empty:
                return
        arrived.extend(self._drain_inbox())
        for request in arrived:
            if request is None:
                continue
            try:
                if request.live is None:
                    request.feature_keys = self.runner.vision.feature_keys(request)
            except Exception:  # a bug: this request fails, its slot and bytes go back, the others are served
                log.exception("request %d failed", request.id)
                request.abort(internal_error())
            else:
                self.scheduler.add(request)

    def _drain_inbox(self) -> list[Request | None]:
        drained = []
        while True:
            try:
                drained.append(self.inbox.get_nowait())
            except queue.Empty:
                return [r for r in drained if r is not None]

    # --- the stages ------------------------------------------------------------------------------
    def _encode(self, chunk: list[Request], live_groups) -> None:
        """One vision forward for the chunk's requests and the live groups riding it (engine/worker/live.py)."""
        if not chunk and not live_groups:
            return
        try:
            self.runner.encode(
                chunk, on_forward=lambda served: events.vision_started(served, self.temporal_patch), live=live_groups
            )
        except Exception:
            log.exception("vision forward failed")
            self._end(chunk, vision_failed)
            self.runner.live.failed(live_groups)
            return
        self.runner.live.encoded(live_groups)
        for request in chunk:
            try:
                self.runner.prune(request)
                events.pruned(request, self.temporal_patch)
                request.drop_pixels()  # its features are in hand: frames and pixels need not wait for the answer
            except Exception:
                log.exception("request %d failed", request.id)
                self._end([request], internal_error)
            else:
                self.scheduler.encoded(request)

    def _prefill(self, batch: list[Request]) -> None:
        for request in batch:
            if self.runner.live.gone(request):  # its session failed in this iteration's vision forward
                self._end([request], live_session_ended)
                continue
            try:
                logits = self.runner.prefill(request)
                finished = self._emit(request, logits)
                if not finished:
                    self.runner.join(request)
                    self.scheduler.decoding(request)
            except Exception:
                log.exception("request %d failed", request.id)
                self._end([request], internal_error)
            else:
                if finished:
                    self._end([request])

    def _decode(self) -> None:
        rows = [self.scheduler.running[key] for key in self.runner.batch.keys]
        if not rows:
            return
        logits = self.runner.decode_step(rows)
        greedy = logits.argmax(dim=-1).tolist()  # one host sync for every greedy row
        finished = []
        for i, request in enumerate(rows):
            request.stats.decode_batch_max = max(request.stats.decode_batch_max, len(rows))
            if self._emit(request, logits[i], greedy[i]):
                finished.append(request)
        self._end(finished)

    def _emit(self, request: Request, logits: torch.Tensor, greedy: int | None = None) -> bool:
        """Choose the next token from logits (V,) float32 and stream it; True when the answer is complete."""
        params = request.params
        if params.temperature <= 0 and greedy is not None:
            token = greedy
        else:
            token = next_token(logits, params.temperature, params.top_p, request.generator)
        return events.token(request, token, logits, self.runner.eos_ids)

    # --- the one way out ---------------------------------------------------------------------------
    def _end(self, requests: list[Request], failure=None) -> None:
        """End requests in any stage. failure None: answered or cancelled (the done event with stats, and
        the conversation KV kept for a follow-up); else a callable making each one's error."""
        requests = [r for r in requests if r.stage is not Stage.FINISHED]
        if not requests:
            return
        for request in requests:
            self.scheduler.remove(request)
        self.runner.leave(requests, remember=failure is None)
        for request in requests:
            if failure is None:
                events.done(request)
                request.release()
            else:
                request.abort(failure())
