"""What runs in each iteration of the worker: bookkeeping over requests, no tensors (and no torch).

A request moves QUEUED -> ENCODING -> PREFILLING -> DECODING and from any stage to FINISHED
(docs/architecture.md, "Request path"). Each iteration the worker asks for:
1. `encode_chunk()`: the requests of the next vision forward, but only once every request encoded
   earlier has been prefilled. So a burst is pipelined: the first chunk's users get their first
   token after one vision forward and their own prefill, not after every video of the burst is encoded.
   Only the scheduler splits requests into vision forwards, within a budget of patches (`vit_patch_budget`).
2. `prefill_batch()`: prompts to prefill, within a token budget, so running rows wait a bounded time;
3. then one decode step for everyone in `running`.

Order within a burst: requests admitted in the same iteration are encoded shortest-remaining-work
first (vision patches still to encode plus prompt tokens left after EVS, weighted by the towers' sizes),
the order that minimises mean time to first token when work is known up front. Requests admitted
later never overtake earlier ones, so a large video waits behind at most one burst of smaller ones.
"""

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import takewhile

from .request import Request
from .stage import Stage


def vision_chunks(patches: list[int], budget: int) -> list[list[int]]:
    """The indices of videos of `patches` patches each, in order, cut into consecutive chunks of at most
    `budget` patches, one vision forward each; a video over the budget is a chunk alone."""
    chunks: list[list[int]] = []
    total = budget + 1
    for index, size in enumerate(patches):
        if total + size > budget:
            chunks.append([])
            total = 0
        chunks[-1].append(index)
        total += size
    return chunks


@dataclass(frozen=True)
class WorkWeights:
    """Relative cost of one vision patch and one prompt token (forward FLOPs grow with parameters x inputs)."""

    per_patch: float = 1.0
    per_token: float = 1.0


class Scheduler:
    """Queues by stage, and the decisions of each iteration.

    max_running: requests past the queue at once (encoding, prefilling or decoding).
    vit_patch_budget: most patches (rows of pixel_values) in one vision forward; one video may exceed it alone.
    prefill_token_budget: prompt tokens per iteration between two decode steps (at least one prompt).
    missing(request): the request's media whose features are not cached, key -> vision patches ({}: no vision
    work left).
    ready(request): False while a question asked of a live session waits for its stream's groups to be in the
    session's state (it is admitted later, without holding up the requests behind it); True for an upload.
    """

    def __init__(
        self,
        max_running: int,
        vit_patch_budget: int,
        prefill_token_budget: int,
        weights: WorkWeights,
        missing: Callable[["Request"], dict[tuple, int]],
        ready: Callable[["Request"], bool] = lambda request: True,
    ):
        self.max_running = max_running
        self.vit_patch_budget = vit_patch_budget
        self.prefill_token_budget = prefill_token_budget
        self.weights = weights
        self.missing = missing
        self.ready = ready
        self.waiting: deque[Request] = deque()
        self.encoding: list[Request] = []  # in the order they will be encoded
        self.prefilling: deque[Request] = deque()
        self.running: dict[int, Request] = {}  # by request id, in the decode batch
        self.preempted: list[Request] = []  # watches' asks taken back to make room for users' requests

    # --- what to run ---------------------------------------------------------------------------
    @property
    def free(self) -> int:
        """Slots free past the queue."""
        return self.max_running - len(self.encoding) - len(self.prefilling) - len(self.running)

    def admit(self) -> list["Request"]:
        """Move waiting requests that are ready into ENCODING while decode slots are free (a live question, which
        has no video of its own, straight into PREFILLING); returns them. Watches' asks give their slots to users'
        requests: as many as the ready ones lack are taken back (`preempted`, the newest first)."""
        ready = [request for request in self.waiting if self.ready(request)]
        if len(ready) > self.free:
            asks = [r for r in [*self.prefilling, *self.running.values()] if r.live is not None and r.live.watch]
            for request in asks[::-1][: len(ready) - max(0, self.free)]:
                self.remove(request)
                self.preempted.append(request)
        new = ready[: max(0, self.free)]
        for request in new:
            self.waiting.remove(request)
        new.sort(key=self.remaining_work)  # stable: arrival order among equals
        for request in new:
            request.stage = Stage.ENCODING if request.live is None else Stage.PREFILLING
        self.encoding.extend(r for r in new if r.live is None)
        self.prefilling.extend(r for r in new if r.live is not None)
        return new

    def remaining_work(self, request: "Request") -> float:
        if request.live is not None:
            return request.live.tail_tokens * self.weights.per_token
        patches = sum(self.missing(request).values())
        video = request.stats.video_tokens_total
        prompt_tokens = len(request.prompt.input_ids) - video * request.params.pruning_rate
        return patches * self.weights.per_patch + prompt_tokens * self.weights.per_token

    def encode_chunk(self, live_patches: int = 0) -> list["Request"]:
        """The requests of the next vision forward, in order, within the patch budget less live_patches (live
        groups riding the same forward, `live_share`); [] while an earlier chunk still waits for prefill. Each
        request brings the media no earlier request brings, and the chunk ends before the first request that
        needs a medium it does not encode. Every later request whose media the chunk encodes rides along, and so
        does any whose features are cached (they cost the forward nothing)."""
        if self.prefilling or not self.encoding:
            return []
        needs = [self.missing(request) for request in self.encoding]
        brought: list[dict[tuple, int]] = []  # per request, the media it is the first to need: key -> patches
        seen: set[tuple] = set()
        for need in needs:
            brought.append({key: patches for key, patches in need.items() if key not in seen})
            seen.update(need)
        bringing = [index for index, media in enumerate(brought) if media]
        budget = max(1, self.vit_patch_budget - live_patches)
        chunks = vision_chunks([sum(brought[index].values()) for index in bringing], budget)
        taken = {key for index in (chunks[0] if chunks else []) for key in brought[bringing[index]]}
        covered = [need.keys() <= taken for need in needs]
        chunk = list(takewhile(lambda pair: pair[1], zip(self.encoding, covered)))
        riders = [request for request, ok in zip(self.encoding[len(chunk) :], covered[len(chunk) :]) if ok]
        return [request for request, _ in chunk] + riders

    def live_share(self, patches: list[int]) -> int:
        """How many of the live groups waiting for the vision tower (patches each, in the order they take turns)
        ride the next forward: within the patch budget, and within half of it while uploads wait to be encoded,
        so that neither starves the other; at least one."""
        uploads_wait = bool(self.encoding) and not self.prefilling
        budget, taken, total = self.vit_patch_budget // (2 if uploads_wait else 1), 0, 0
        for size in patches:
            if taken and total + size > budget:
                break
            taken, total = taken + 1, total + size
        return taken

    def prefill_tokens(self, request: "Request") -> int:
        """Tokens a prefill of request is counted at: a live question prefills only its tail."""
        return request.live.tail_tokens if request.live is not None else len(request.pruned.input_ids)

    def prefill_batch(self) -> list["Request"]:
        """Prompts to prefill now, in order, until the token budget is spent (at least one)."""
        batch, spent = [], 0
        for request in self.prefilling:
            tokens = self.prefill_tokens(request)
            if batch and spent + tokens > self.prefill_token_budget:
                break
            batch.append(request)
            spent += tokens
        return batch

    def take_background(self, request: "Request") -> bool:
        """Take a watch's ask straight into PREFILLING if it fits now: a slot free and no user's request ready to
        take it; False otherwise (it is dropped, never queued)."""
        if self.free <= 0 or any(self.ready(waiting) for waiting in self.waiting):
            return False
        request.stage = Stage.PREFILLING
        self.prefilling.append(request)
        return True

    # --- moves -----------------------------------------------------------------------------------
    def add(self, request: "Request") -> None:
        request.stage = Stage.QUEUED
        self.waiting.append(request)

    def encoded(self, request: "Request") -> None:
        self.encoding.remove(request)
        request.stage = Stage.PREFILLING
        self.prefilling.append(request)

    def decoding(self, request: "Request") -> None:
        self.prefilling.remove(request)
        request.stage = Stage.DECODING
        self.running[request.id] = request

    def remove(self, request: "Request") -> None:
        """Take request out of whichever queue holds it (it is ending)."""
        stage = request.stage
        if stage is Stage.QUEUED and request in self.waiting:
            self.waiting.remove(request)
        elif stage is Stage.ENCODING and request in self.encoding:
            self.encoding.remove(request)
        elif stage is Stage.PREFILLING and request in self.prefilling:
            self.prefilling.remove(request)
        elif stage is Stage.DECODING:
            self.running.pop(request.id, None)

    # --- views -----------------------------------------------------------------------------------
    def past_queue(self) -> list["Request"]:
        """Requests admitted and not ended: the ones a device fault takes down."""
        return [*self.encoding, *self.prefilling, *self.running.values()]

    def __iter__(self) -> Iterator["Request"]:
        yield from self.waiting
        yield from self.past_queue()

    @property
    def idle(self) -> bool:
        return not (self.encoding or self.prefilling or self.running)
