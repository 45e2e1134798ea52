"""Frames for the live-session tests: a shapes clip at a frame rate, the same frames as a lossless file (so that an
upload and a live session see the same pixels), and playing frames into a session at their capture times."""

import io
import threading
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from assets.shapes import FPS, shape_clip
from engine.stream import Answer


def clip_frames(seed: int, fps: int = 2, seconds: float = 8.0) -> np.ndarray:
    """(N, 64, 64, 3) uint8: the shapes clip of `seed` taken at `fps` (every FPS/fps-th frame), `seconds` long."""
    frames = shape_clip(seed).frames[:: FPS // fps]
    return frames[: round(seconds * fps)]


def write_lossless(path, frames: np.ndarray, fps: int) -> Path:
    """frames as an FFV1 file at fps (lossless: read back, every pixel is the same)."""
    with av.open(str(path), mode="w", format="matroska") as container:
        stream = container.add_stream("ffv1", rate=Fraction(fps))
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "bgr0"
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return Path(path)


def jpeg_frames(path) -> list[tuple[float, bytes]]:
    """A clip's frames as (capture time in seconds, JPEG bytes at quality 90), as a /v1/live client sends them."""
    frames = []
    with av.open(str(path)) as video:
        for frame in video.decode(video=0):
            data = io.BytesIO()
            frame.to_image().save(data, "JPEG", quality=90)
            frames.append((float(frame.time), data.getvalue()))
    return frames


def play(live, frames: np.ndarray, fps: float, first: int = 0, wait: bool = True) -> None:
    """Push frames captured 1/fps apart (frame i at (first + i) / fps s); with wait, each group is in the session's
    state before the next frame is pushed, so none is dropped however slow the machine."""
    for index, frame in enumerate(frames):
        live.push(frame, (first + index) / fps)
        if wait:
            assert live.wait(60), live.stats()


def logits_close(got: Answer, want: Answer, atol: float = 1e-4) -> float:
    """The largest difference between two answers' logits, which must be the same tokens."""
    assert got.token_ids == want.token_ids
    difference = float(np.abs(got.logits - want.logits).max())
    assert difference <= atol, difference
    return difference


class RecordedLive:
    """A live session as the engine opened it, recording what it was given: every frame it took (a copy, with its
    capture time) and each question with the number of frames pushed before it. A test that cannot control when a
    question reaches the session (a browser's camera, a stream read at its own pace) replays exactly that into a
    fresh session (`replayed_answer`) and checks the answer it was shown against the engine's for the same frames.

    Pushes and questions take one lock, so a question's count is the frames the session had been given when it
    counted its groups. Only the frames the session sampled are kept (`pushed`): a frame it skipped by its clock or
    dropped because the engine was behind is not, so a replay forms the same groups however slow this machine was
    (a frame left out moves no tick that a sampled one would not: engine/live/frames.py's CaptureClock).
    `dropped_before` holds the frames the session had dropped by each question. Anything else is the session's own.
    """

    def __init__(self, live, params):
        self.live, self.params = live, params
        self.pushed: list[tuple[np.ndarray, float]] = []  # the frames sampled, with their capture times
        self.asked: list[tuple[str, tuple, object, int]] = []  # (question, history, params, frames sampled before)
        self.dropped_before: list[int] = []
        self._lock = threading.Lock()

    def push(self, frame, t_s: float) -> None:
        with self._lock:
            sampled = self.live.stats()["frames_sampled"]
            self.live.push(frame, t_s)  # a refused frame raises before it is recorded
            if self.live.stats()["frames_sampled"] > sampled:
                self.pushed.append((np.array(frame, copy=True), t_s))

    def ask(self, question: str, history=(), params=None):
        with self._lock:
            stream = self.live.ask(question, history, params)
            self.asked.append((question, tuple(history), params, len(self.pushed)))
            self.dropped_before.append(self.live.stats()["frames_dropped"])
            return stream

    def __getattr__(self, name):
        return getattr(self.live, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.live.close()


def replayed_answer(engine, recorded: RecordedLive, question_index: int = 0) -> Answer:
    """The answer a fresh session of `engine` gives when it is pushed the frames `recorded` had sampled before its
    question `question_index` (each group in the state before the next frame, so none is dropped) and asked it."""
    question, history, params, frames_before = recorded.asked[question_index]
    with engine.open_live(recorded.params) as live:
        for frame, t_s in recorded.pushed[:frames_before]:
            live.push(frame, t_s)
            assert live.wait(60), live.stats()
        return live.ask(question, history, params).result()


def cold_logits(engine, frames: np.ndarray, groups: int, question: str, token_ids, q: float) -> np.ndarray:
    """(A, V) float32: the logits a cold prefill of the live window gives each of token_ids, the answer to question
    asked when `groups` groups of frames (pushed at 2 fps from 0 s, every one sampled) are in the state: the window
    the engine's rule shows then (its key group whole), causal EVS over the frames up to it with the engine's noise
    floor, laid out and prefilled in one forward by transformers' model (train.stream_examples, train.tiny_trained:
    what training builds), not by the engine's state."""
    import torch

    import pruning
    from engine.live.group import group_of
    from engine.live.layout import LiveLayout
    from engine.live.window import span_groups
    from train.stream_examples import StreamExample, stream_prompts
    from train.tiny_trained import teacher_forced_logits

    loaded, family = engine.loaded, engine.family
    sessions, sampling = engine._live, engine.default_frame_sampling
    probe = group_of(loaded, family, sampling, 0, [(frames[0], 0.0), (frames[1], 0.5)])
    layout = LiveLayout.of(loaded, family, engine.system_prompt, sampling.fps)
    span = span_groups(loaded.live_span_s, sampling.fps, family.temporal_patch)
    window = layout.window(span, sessions.window_tokens, probe.grid_hw)
    start = window.start(groups)
    first = max(0, start - (pruning.WINDOW_GROUPS - 1))
    made = [
        group_of(loaded, family, sampling, g, [(frames[2 * g + i], (2 * g + i) / 2) for i in range(2)])
        for g in range(first, groups)
    ]
    example = StreamExample(0, made, first, start, question, "", q)
    with torch.no_grad():
        prompt = stream_prompts(loaded.model, family, layout, [example], sessions.evs_floor)[0]
        logits, _ = teacher_forced_logits(loaded, family, [prompt], [torch.tensor(list(token_ids))])
    return logits.numpy()
