"""`Serving`: what the front door, the UI and app.py use of an engine. `Engine` offers it, and so does
`replicas.ReplicatedEngine`, which is why ui/ is typed against this and never names either class."""

from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from engine.config import FrameSampling, FrameSamplingLimits, GenerationParams
from engine.stream import Stream

from .metrics import Metrics


class Serving(Protocol):
    metrics: Metrics

    @property
    def model_info(self) -> dict:
        """name, device, default_pruning_rate, thinks, ... (Engine.model_info)."""

    @property
    def default_frame_sampling(self) -> FrameSampling:
        """How frames are sampled when a request does not say."""

    @property
    def frame_sampling_limits(self) -> FrameSamplingLimits:
        """The largest frame sampling a request may ask for."""

    def submit(
        self,
        video: str | Path | None = None,
        question: str | None = None,
        params: GenerationParams | None = None,
        history: Sequence[tuple[str, str]] = (),
        media: Sequence[str | Path] | None = None,
        client: str | None = None,
    ) -> Stream:
        """Returns at once; InputError / BusyError for what is wrong now, the rest through the stream. video:
        one upload; media: several, in order (model_info["max_media"] at most). client: who asks (a tab's
        session, an API caller's address), held to its share of the queue (engine/front/shares.py)."""

    def open_live(self, params: GenerationParams | None = None):
        """A live session (engine/live/session.py's LiveSession, docs/live.md: push frames, ask about the stream so
        far, recent_picture, stats, close); behind the replicas one with the same methods, held by one replica.
        InputError for bad settings, BusyError when max_live_sessions are open."""

    def paused(self, timeout_s: float = 120.0) -> AbstractContextManager:
        """Requests submitted inside the block start together (one read of the video, one ViT forward)."""

    def shutdown(self) -> None:
        """Stop taking requests and end the ones in flight."""
