"""Admission counted in requests and in host bytes (engine/scheduling/admission.py), the limits checked before any
work, and the narrow paths where a request used to keep its slot or get the wrong sentence (issue 39)."""

import gc
import threading
import time
from pathlib import Path

import pytest

from engine import BusyError, Engine, EngineConfig, GenerationParams, InputError
from engine import prepare as preparing
from engine.config import CPU_FRAME_SAMPLING_LIMITS, FrameSampling
from engine.errors import EXPIRED_VIDEO, QUEUE_FULL
from engine.scheduling.admission import Admission, memory_full, request_host_bytes, too_large_alone
from engine.scheduling.request import Request

MB = 1 << 20
SMALL_SAMPLING = FrameSampling(fps=4.0, max_frames=8, max_pixels_per_frame=160 * 128)
# The CPU's largest sampling: 128 frames of 401,408 pixels, 770 MB once read (uint8 frames, float32 pixel values).
MAX_SAMPLING = FrameSampling(
    fps=CPU_FRAME_SAMPLING_LIMITS.max_fps,
    max_frames=CPU_FRAME_SAMPLING_LIMITS.max_frames,
    max_pixels_per_frame=CPU_FRAME_SAMPLING_LIMITS.max_pixels_per_frame,
)


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


class PeakRss(threading.Thread):
    """The most resident memory this process held while it ran (sampled every 5 ms), above what it held at start."""

    def __init__(self):
        super().__init__(daemon=True)
        self.start_bytes, self.peak, self.done = rss_bytes(), 0, threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.005):
            self.peak = max(self.peak, rss_bytes() - self.start_bytes)

    def __enter__(self) -> "PeakRss":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.join()
        self.peak = max(self.peak, rss_bytes() - self.start_bytes)


@pytest.fixture(scope="module")
def engine(tiny_cache_dir):
    config = EngineConfig(model="tiny-random", device="cpu", cache_dir=tiny_cache_dir, frame_sampling=SMALL_SAMPLING)
    with Engine(config) as eng:
        yield eng


def idle(engine) -> bool:
    return engine.running_requests == 0 and engine.queued_requests == 0


# --- the bookkeeping -------------------------------------------------------------------------------------------


def test_admission_counts_slots_and_bytes():
    admission = Admission(max_queue=3, budget_bytes=100)
    first = admission.take(60)
    with pytest.raises(BusyError) as full:
        admission.take(50)
    assert str(full.value) == memory_full(50)
    with pytest.raises(InputError) as alone:
        admission.take(101)
    assert not isinstance(alone.value, BusyError) and str(alone.value) == too_large_alone(101, 100)
    first.settle(30)  # read, it holds less than its sampling allowed
    second = admission.take(50)
    assert admission.held_bytes == 80 and admission.queued == 2
    third = admission.take(0)
    with pytest.raises(BusyError, match=QUEUE_FULL):
        admission.take(0)
    first.leave_queue()
    first.leave_queue()  # once only
    assert admission.queued == 2 and admission.held_bytes == 80
    first.release_bytes()
    first.settle(1000)  # a read that settles after its request ended counts nothing
    second.close()
    third.close()
    assert admission.queued == 0 and admission.held_bytes == 0


# --- the engine ---------------------------------------------------------------------------------------------------


def test_the_byte_budget_bounds_what_waiting_requests_hold(tiny_cache_dir, clip):
    """Eight requests at the CPU's largest sampling, held by paused(), under a budget of one request being prepared
    (770 MB once read, and the HF processor's working copies while it is prepared: 2.6 GB at most) beside one
    prepared: submitted one after another, two come in and six are refused as busy with the sentence that says
    why; submitted at once, one. The process never grows past the budget. Without it all eight came in and held
    6 GB. Once they end, every slot and byte is back."""
    held = request_host_bytes(1, MAX_SAMPLING, None, 0) - request_host_bytes(0, MAX_SAMPLING, None, 0)
    budget = request_host_bytes(1, MAX_SAMPLING, None, 0) + held
    # 132 frames of 800x600: 128 sampled, each scaled down to 401,408 pixels at most (never up)
    video = clip("moving_object", seconds=16.5, fps=8, size=(800, 600))
    config = EngineConfig(model="tiny-random", device="cpu", cache_dir=tiny_cache_dir, admission_bytes=budget)
    params = GenerationParams(max_new_tokens=1, pruning_rate=0.9, frame_sampling=MAX_SAMPLING)
    full = memory_full(request_host_bytes(1, MAX_SAMPLING, None, 0))
    with Engine(config) as engine:
        engine.submit(video, "Warm up?", GenerationParams(max_new_tokens=1)).result(timeout_s=120)
        for one_at_a_time, admitted in ((True, 2), (False, 1)):
            streams, refused = [], []
            with PeakRss() as growth, engine.paused():
                for number in range(8):
                    try:
                        streams.append(engine.submit(video, f"What moves? ({number})", params))
                    except BusyError as error:
                        refused.append(str(error))
                    if one_at_a_time:
                        engine._preparer.wait_until_prepared(300)  # read and processed, and still held
                engine._preparer.wait_until_prepared(300)
                settled = engine._admission.held_bytes
            assert len(streams) == admitted and refused == [full] * (8 - admitted)
            assert 0.9 * admitted * held <= settled <= admitted * held  # what they hold: 128 frames each
            assert growth.peak <= budget, f"grew {growth.peak / MB:.0f} MB, the budget {budget / MB:.0f} MB"
            for stream in streams:
                assert stream.result(timeout_s=300).stats["frames_sampled"] == 128
            assert engine._admission.held_bytes == 0 and engine._admission.queued == 0


def test_frames_and_pixels_are_dropped_once_the_vision_forward_is_done(engine, clip):
    """While the answer decodes, its request holds no frames, pixel values or admitted bytes any more."""
    params = GenerationParams(max_new_tokens=300, ignore_eos=True)
    stream = engine.submit(clip("pan"), "What moves?", params)
    for event in stream:
        if event.kind == "text":
            break
    # type() rather than isinstance(): isinstance reads __class__, which some lazy modules answer with a warning
    [request] = [r for r in gc.get_objects() if type(r) is Request and r.stream is stream]
    assert request.media is None and all(part.pixel_values is None for part in request.prompt.media)
    assert engine._admission.held_bytes == 0
    stream.cancel()
    assert stream.result(timeout_s=60).cancelled


@pytest.mark.parametrize(
    "history, sentence",
    [
        ([("q" * 500_000, "a" * 500_000)] * 5, "The conversation so far is 5,000,000 characters long"),
        ([("q", "a")] * 1_000_000, "The conversation so far has 1,000,000 earlier questions; the limit is 128"),
    ],
)
def test_a_huge_history_is_refused_before_it_is_tokenized(engine, clip, history, sentence):
    """5 MB of history (or a million turns) is refused in well under a second and without growing the process by
    300 MB: its characters and turns are counted before the tokenizer sees it (it took 3.4 s and 1.2 GB)."""
    video = clip("pan")
    with PeakRss() as growth:
        start = time.perf_counter()
        with pytest.raises(InputError, match=sentence):
            engine.submit(video, "What moves?", history=history)
        took = time.perf_counter() - start
    assert took < 1.0 and growth.peak < 300 * MB, (took, growth.peak / MB)
    assert idle(engine)


def test_the_history_limits_leave_a_long_real_conversation_alone(engine, clip):
    """The character limit lies past what the token limit allows (tiny-random's tokenizer takes about one character a
    token, a real one four or five): a conversation under the token limit is answered, and one over it gets the token
    sentence, not the character one."""
    turn = ("What does the shape do next in the clip? " * 20, "It moves to the right and then stops. " * 20)
    answer = engine.submit(clip("pan"), "And now?", GenerationParams(max_new_tokens=2), history=[turn] * 4)
    assert answer.result(timeout_s=120).stats["generated_tokens"] == 2
    with pytest.raises(InputError, match="tokens long; the limit is 8,192"):
        engine.submit(clip("pan"), "And now?", history=[turn] * 40)


# --- the narrow paths ---------------------------------------------------------------------------------------------


def test_a_fault_while_the_worker_collects_a_request_fails_that_request_only(engine, clip, monkeypatch):
    """A bug met while the worker takes a request in (here: keying its features) fails that request with a
    sentence and gives its slot and bytes back; the next request is answered. It used to be dropped, its stream
    never ending and its slot held for good."""
    vision = engine._worker.runner.vision
    real = vision.feature_keys
    faults = iter([RuntimeError("injected fault")])

    def feature_keys(request):
        if (fault := next(faults, None)) is not None:
            raise fault
        return real(request)

    monkeypatch.setattr(vision, "feature_keys", feature_keys)
    failed = engine.submit(clip("pan"), "What moves?", GenerationParams(max_new_tokens=2))
    with pytest.raises(RuntimeError, match="internal error"):
        failed.result(timeout_s=60)
    answered = engine.submit(clip("pan"), "What moves?", GenerationParams(max_new_tokens=2))
    assert answered.result(timeout_s=60).stats["generated_tokens"] == 2
    assert engine._admission.queued == 0 and engine._admission.held_bytes == 0


def test_an_upload_deleted_while_it_is_prepared_gets_the_expired_sentence(engine, clip, tmp_path, monkeypatch):
    """The cleaner deleting an upload between the prepare thread's look at it and its read: the user reads that the
    upload is gone, not that the server failed."""
    upload = tmp_path / "swept.mp4"
    upload.write_bytes(clip("scene_cut").read_bytes())
    real = preparing.file_sha256

    def swept_then_hashed(path):
        Path(path).unlink()  # the cleaner, at just this moment
        return real(path)

    monkeypatch.setattr(preparing, "file_sha256", swept_then_hashed)
    with pytest.raises(InputError) as expired:
        engine.submit(upload, "What moves?").result(timeout_s=60)
    assert str(expired.value) == EXPIRED_VIDEO
