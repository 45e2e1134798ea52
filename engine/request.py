"""One request's state as it moves through the engine."""

import threading
import time
from dataclasses import dataclass, field

import torch

from .config import GenerationParams, SamplingParams
from .families import VideoFeatures
from .prompt import PreparedPrompt
from .pruning import PrunedPrompt
from .sampling import TextDecoder
from .stats import STATS_KEYS
from .stream import Stream
from .video import SampledVideo


@dataclass
class Request:
    stream: Stream
    video_path: str
    question: str
    history: list[tuple[str, str]]
    params: GenerationParams
    sampling: SamplingParams
    submitted_at: float = field(default_factory=time.perf_counter)
    stats: dict = field(default_factory=lambda: dict.fromkeys(STATS_KEYS))
    video: SampledVideo | None = None
    prompt: PreparedPrompt | None = None
    feature_key: tuple | None = None
    prefix_key: tuple | None = None
    features: VideoFeatures | None = None
    pruned: PrunedPrompt | None = None
    decoder: TextDecoder | None = None
    generator: torch.Generator | None = None
    last_token: int = -1
    tokens_seen: int = 0  # tokens in this row's own sequence so far (its next 1-D position)
    next_position: int = 0  # MRoPE position of the next token
    first_token_at: float | None = None
    admission: threading.Semaphore | None = None  # the queue slot held until the GPU worker takes it

    @property
    def id(self) -> int:
        return self.stream.request_id

    @property
    def generated(self) -> int:
        return len(self.decoder.token_ids) if self.decoder else 0

    def leave_queue(self) -> None:
        """Give back the admission slot (once), when the worker takes the request or it ends early."""
        slot, self.admission = self.admission, None
        if slot is not None:
            slot.release()

    def abort(self, error: BaseException) -> None:
        """End the request with error: give back its queue slot and tensors, fail its stream."""
        self.leave_queue()
        self.release()
        self.stream.fail(error)

    def release(self) -> None:
        """Drop the tensors this request holds so a finished request frees its memory."""
        self.video = self.prompt = self.features = self.pruned = None
