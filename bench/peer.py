"""The peer: the same users served the way a stock Gradio video demo serves them with transformers alone.

One request at a time in submission order (concurrency 1), all in this process, as such a demo is written:
`transformers.video_utils.load_video` decodes the sampled frames with PyAV (the backend transformers' video
processors use by default), the HF processor turns them and the prompt into tensors, then
`model.generate(..., streamer=TextIteratorStreamer)` runs on a thread while the caller reads the stream. It is
given what the engine has: the same weights, processor, dtype and torch threads (`engine.loaded`, in the same
process), the same frames (the engine's frame indices for a constant-rate clip, `sample_frame_indices`; a frame
over the sampling's pixel cap is scaled by the processor, where the engine's reader scales it with FFmpeg, and the
bench's 224x224 clips need neither), the same prompt text and the same token budget with EOS ignored
(min_new_tokens = max_new_tokens). tests/test_bench.py checks that its prompt and pixels equal the engine's.
No EVS: the peer's numbers hold for every q.

Before issue 45 the peer read each video through `engine.reading.video.read_video` without a pool, which starts
a reader process per video (220 ms on the bench's 4-s clip, against 14 ms decoded in process): a handicap no
stock demo has.
"""

import threading
import time
from pathlib import Path

import numpy as np
from transformers import TextIteratorStreamer
from transformers.video_utils import VideoMetadata, load_video

from engine import Engine, FrameSampling
from engine.prompt.unpruned import chat_text
from engine.reading.frame_sampling import sample_frame_indices

from .bursts import BurstRun, UserTiming
from .workload import QUESTION

DECODER = "pyav"  # transformers.video_utils.load_video's default backend


class FirstTokenStreamer(TextIteratorStreamer):
    """A TextIteratorStreamer that also notes when the first generated token arrives (time.perf_counter
    seconds) and counts the generated tokens."""

    def __init__(self, tokenizer, timeout_s: float):
        super().__init__(tokenizer, skip_prompt=True, skip_special_tokens=True, timeout=timeout_s)
        self.first_token_at: float | None = None
        self.generated_tokens = 0

    def put(self, value):
        if not (self.skip_prompt and self.next_tokens_are_prompt):  # generate hands over the prompt first
            if self.first_token_at is None:
                self.first_token_at = time.perf_counter()
            self.generated_tokens += value.numel()
        super().put(value)


def stock_inputs(engine: Engine, clip: Path, sampling: FrameSampling) -> dict:
    """The model's inputs the stock way: the clip's sampled frames decoded in this process by
    transformers' `load_video`, then the HF processor on them and the prompt text (on the model's device)."""
    loaded, family = engine.loaded, engine.family

    def engine_frames(metadata: VideoMetadata, **_) -> np.ndarray:
        indices = sample_frame_indices(metadata.duration, metadata.total_num_frames, sampling, family.temporal_patch)
        return np.array(indices)

    frames, metadata = load_video(str(clip), backend=DECODER, sample_indices_fn=engine_frames)
    processor, size = family.sized_processor(loaded.processor, len(frames), sampling.max_pixels_per_frame)
    text = chat_text(family, engine.system_prompt, QUESTION, [])
    inputs = processor(
        text=[text], videos=[frames], video_metadata=[metadata], do_sample_frames=False, return_tensors="pt", **size
    )
    return inputs.to(loaded.device)


def answer(
    engine: Engine, clip: Path, sampling: FrameSampling, new_tokens: int, timeout_s: float = 600.0
) -> tuple[str, FirstTokenStreamer]:
    """One request the stock way; returns the streamed text and the streamer (first-token time, tokens)."""
    loaded = engine.loaded
    inputs = stock_inputs(engine, clip, sampling)
    streamer = FirstTokenStreamer(loaded.processor.tokenizer, timeout_s)
    failures: list[BaseException] = []

    def generate() -> None:
        try:
            loaded.model.generate(
                **inputs, streamer=streamer, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False
            )
        except BaseException as error:  # reraised below, on the caller's thread
            failures.append(error)
            streamer.end()

    thread = threading.Thread(target=generate, name="peer-generate")
    thread.start()
    streamed = "".join(streamer)
    thread.join()
    if failures:
        raise failures[0]
    return streamed, streamer


def serve_one_by_one(engine: Engine, clips: list[Path], sampling: FrameSampling, new_tokens: int) -> BurstRun:
    """Every clip's user arrives at the burst's start and is served after the previous one finishes; each
    TTFT counts from the burst's start."""
    start = time.perf_counter()
    users = []
    for clip in clips:
        _, streamer = answer(engine, clip, sampling, new_tokens)
        done = time.perf_counter()
        users.append(
            UserTiming(
                ttft_s=streamer.first_token_at - start,
                done_s=done - start,
                decode_s=done - streamer.first_token_at,
                generated_tokens=streamer.generated_tokens,
            )
        )
    return BurstRun(users, time.perf_counter() - start)
