"""The peer: the same users served the way a typical Gradio video demo serves them with stock transformers.

One request at a time in submission order (concurrency 1): decode the sampled frames, run the HF processor,
then `model.generate(..., streamer=TextIteratorStreamer)` on a thread while the caller reads the stream.
Same weights and processor as the engine (`engine.loaded`), the same sampled frames (`engine.reading.video.read_video`
with the engine's sampling), the same prompt text and the same token budget with EOS ignored
(min_new_tokens = max_new_tokens). No EVS: the peer's numbers hold for every q.
"""

import threading
import time
from pathlib import Path

from transformers import TextIteratorStreamer

from engine import Engine, FrameSampling
from engine.prompt.unpruned import chat_text, processor_inputs
from engine.reading.video import read_video

from .bursts import BurstRun, UserTiming
from .workload import QUESTION


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


def answer(
    engine: Engine, clip: Path, sampling: FrameSampling, new_tokens: int, timeout_s: float = 600.0
) -> tuple[str, FirstTokenStreamer]:
    """One request the stock way; returns the streamed text and the streamer (first-token time, tokens)."""
    loaded, config = engine.loaded, engine.config
    video = read_video(
        clip,
        sampling,
        max_seconds=config.max_video_seconds,
        max_bytes=config.max_file_bytes,
        timeout_s=config.read_timeout_s,
        temporal_patch=engine.family.temporal_patch,
    )
    text = chat_text(engine.family, engine.system_prompt, QUESTION, [])
    inputs = processor_inputs(loaded, video, text, sampling.max_pixels_per_frame).to(loaded.device)
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
