"""One request's state as it moves through the engine: bookkeeping, torch-free at run time (the tensors it
holds are typed for readers, under TYPE_CHECKING)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.config import FrameSampling, GenerationParams
from engine.detokenize import SplitDetokenizer
from engine.stats import Stats
from engine.stream import Stream

from .admission import Ticket
from .stage import Stage

if TYPE_CHECKING:  # what the worker puts here is tensors; bookkeeping only holds them, without torch
    import torch
    from transformers.cache_utils import Cache

    from engine.families.base import VideoFeatures
    from engine.live.session import LiveQuestion
    from engine.prompt.pruned import PrunedPrompt
    from engine.prompt.units import EncodePlan
    from engine.prompt.unpruned import UnprunedPrompt
    from engine.reading.media import Medium
    from engine.state.lm_state import Snapshot


@dataclass(eq=False)
class Request:
    """One request. media_paths: its uploads in order (media: what was read from them, a video's sampled frames
    or a still image). feature_keys: the feature cache key of each medium; features: each one's vision output."""

    stream: Stream
    media_paths: list[str]
    question: str
    history: list[tuple[str, str]]
    params: GenerationParams
    frame_sampling: FrameSampling
    stage: Stage = Stage.QUEUED
    submitted_at: float = field(default_factory=time.perf_counter)
    stats: Stats = field(default_factory=Stats)
    media: list[Medium] | None = None
    prompt: UnprunedPrompt | None = None
    plans: list[EncodePlan] | None = None  # which units of each medium the vision tower encodes
    feature_keys: list[tuple] | None = None
    prefix_key: tuple | None = None
    features: list[VideoFeatures] | None = None
    pruned: PrunedPrompt | None = None
    detokenizer: SplitDetokenizer | None = None  # every generated token; thinking and answer text apart
    generator: torch.Generator | None = None
    kv: Cache | None = None  # its own prompt state between prefill and joining the decode batch
    # Recurrent-state snapshots inside its conversation (token count -> Snapshot), kept with it for follow-ups.
    snapshots: dict[int, Snapshot] = field(default_factory=dict)
    logits: list[torch.Tensor] = field(default_factory=list)  # (V,) float32 per token, when params.return_logits
    last_token: int = -1
    tokens_seen: int = 0  # tokens in this row's own sequence so far (its next 1-D position)
    next_position: int = 0  # MRoPE position of the next token
    first_token_at: float | None = None
    # Its share of the engine's admission: a queue slot until the worker takes the request, and the host bytes its
    # frames and pixels hold until the vision forward is done with them.
    admission: Ticket | None = None
    # A question asked of a live session: no video of its own to read, encode or prune; its prompt is its
    # session's state, forked at prefill (engine/worker/live.py), and its tail.
    live: LiveQuestion | None = None
    # What a live question saw once forked: (the newest group's index, the capture time of its last frame).
    live_seen: tuple[int, float] | None = None

    @property
    def id(self) -> int:
        return self.stream.request_id

    @property
    def generated(self) -> int:
        return len(self.detokenizer.token_ids) if self.detokenizer else 0

    def leave_queue(self) -> None:
        """Give back the admission slot (once), when the worker takes the request or it ends early."""
        if self.admission is not None:
            self.admission.leave_queue()

    def drop_pixels(self) -> None:
        """The vision forward and the pruning picture are done with the request's media: drop its frames (the
        frame cache keeps recent uploads' under its own bound), the processor's pixel values and the soundtrack's
        audio-tower input, and give their bytes back to admission. Its prompt keeps every grid and count."""
        self.media = None
        if self.prompt is not None:
            for part in self.prompt.media:
                part.pixel_values = part.audio = None
        if self.admission is not None:
            self.admission.release_bytes()

    def abort(self, error: BaseException) -> None:
        """End the request with error: give back its queue slot and tensors, fail its stream."""
        self.release()
        self.stream.fail(error)

    def release(self) -> None:
        """The request has ended: give back its queue slot and bytes, and drop its tensors to free their memory."""
        if self.admission is not None:
            self.admission.close()
        self.media = self.prompt = self.plans = self.features = self.pruned = self.kv = None
        self.snapshots = {}
        self.stage = Stage.FINISHED
