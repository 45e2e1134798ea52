"""Reader faults: a file that hangs the decoder, one that crashes it and one that makes it allocate without
bound each fail only their own request; the pool replaces the reader, and the next upload is read by a
warm one (issue 11, item 6; issue 20). A reader killed from outside mid-read blames no file: another reader
reads it. A soundtrack that does not decode costs the soundtrack only.

The engine reads every upload in a warm reader process from its pool (engine/reading/pool.py). The
engine here runs tests/reader_processes.py's faulty readers (READER_PROGRAM, the pool's seam, set before
the engine starts), which misbehave on files named `hang_*`, `crash_*`, `hungry_*`, `killed_*` and `deaf_*`
and read anything else for real.

The hang, the crash and the memory each go to the engine together with a normal request on another clip.
What must hold: the faulty request ends with its own one-sentence error (engine.reading.video.TOO_SLOW after the
timeout, engine.reading.video.UNREADABLE for the crash, engine.reading.video.OUT_OF_MEMORY past the cap); the normal one
completes with its answer, without waiting for the hang; the faulty reader is killed and reaped; the
pool is back to its size with warm readers, none of them the faulty one, and the next upload is read
without waiting for a reader to start; the engine ends with no running request and keeps serving; no
reader outside the pool is alive.
"""

import shutil
import time
from pathlib import Path

import pytest

import engine.reading.video as video
from app_harness import wait_until
from engine import STATS_KEYS, Engine, EngineConfig, GenerationParams
from engine.errors import InputError
from engine.prepare import UNREADABLE_SOUNDTRACK
from engine.reading import pool as reader_pool
from reader_processes import alive, faulty_program, reader_children
from sound_clips import tone, write_clip_with_sound

# Long enough that a normal read (a few hundredths of a second warm, a few s on 2 loaded cores) never
# times out, short enough to keep the hang test at ~10 s. The normal request must finish inside it, which
# is what shows it did not wait for the hung read.
READ_TIMEOUT_S = 8.0
KILL_SLACK_S = 10.0  # the hang must fail by timeout + this: the kill works and nothing else waits on it
READERS = 2
# A warm reader is handed the file at once; starting one (importing PyAV and numpy) takes 0.3 s and more.
WARM_WAIT_S = 0.2
FAST = GenerationParams(pruning_rate=0.5, max_new_tokens=6)


# Readers of other engines alive in this test process (the suite's shared app keeps one for the session).
OTHER_READERS: set[int] = set()


@pytest.fixture(scope="module")
def engine(tiny_cache_dir):
    OTHER_READERS.update(reader_children())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reader_pool, "READER_PROGRAM", faulty_program())
        with Engine(
            EngineConfig(
                model="tiny-random",
                device="cpu",
                cache_dir=tiny_cache_dir,
                read_timeout_s=READ_TIMEOUT_S,
                video_readers=READERS,
            )
        ) as running:
            yield running


def one_sentence(text: str) -> bool:
    return text.endswith(".") and "\n" not in text and ". " not in text and "Traceback" not in text


def faulty_copy(clip: Path, folder: Path, prefix: str) -> Path:
    """A valid clip under a name that makes the faulty reader misbehave."""
    path = folder / f"{prefix}{clip.name}"
    shutil.copyfile(clip, path)
    return path


def assert_answered(stream) -> dict:
    answer = stream.result(timeout_s=60)
    assert answer.text and not answer.cancelled
    assert set(STATS_KEYS) <= set(answer.stats)
    assert answer.stats["generated_tokens"] == FAST.max_new_tokens
    return answer.stats


def assert_replaced(engine, faulty_pid: int, next_upload: Path) -> None:
    """The faulty reader is gone, the pool is back to its size with warm readers, and the next upload (one
    the engine has not read before) is read by one of them at once."""
    assert wait_until(lambda: not alive(faulty_pid), 5), "the faulty reader lives on"
    assert wait_until(lambda: engine.readers.idle == READERS, 30), "the pool did not get back to its size"
    assert faulty_pid not in engine.readers.pids() and len(engine.readers.pids()) == READERS
    assert reader_children() - OTHER_READERS == engine.readers.pids(), "a reader outside the pool is alive"
    stats = assert_answered(engine.submit(next_upload, "And now?", FAST))
    assert stats["read_wait_s"] < WARM_WAIT_S, stats["read_wait_s"]
    assert 0 < stats["read_s"] and stats["read_wait_s"] + stats["read_s"] <= stats["read_video_s"]


def test_a_hanging_reader_fails_only_its_own_request(engine, clip, tmp_path):
    """The hang costs its own request the timeout and a TOO_SLOW sentence; a request submitted right
    after it (another clip, read for real by the other reader) completes before the timeout ends, so the
    hang held neither the engine nor the other request; the hung reader is then killed and replaced."""
    hang = faulty_copy(clip("static", seconds=2.0), tmp_path, "hang_")
    start = time.monotonic()
    hung = engine.submit(hang, "What moves?", FAST)
    normal = engine.submit(clip("moving_object", seconds=2.5), "What moves?", FAST)

    marker = Path(f"{hang}.child")
    assert wait_until(marker.exists, READ_TIMEOUT_S), "the hanging reader never started"
    assert int(marker.read_text()) in reader_children(), "the hanging reader is not a live child"
    assert_answered(normal)
    assert not hung.finished, "the normal request waited for the hung read (or the timeout is too short)"

    with pytest.raises(InputError) as failed:
        hung.result(timeout_s=READ_TIMEOUT_S + KILL_SLACK_S)
    elapsed = time.monotonic() - start
    assert str(failed.value) == video.TOO_SLOW and one_sentence(str(failed.value))
    assert READ_TIMEOUT_S <= elapsed <= READ_TIMEOUT_S + KILL_SLACK_S
    assert wait_until(lambda: engine.running_requests == 0, 10)
    assert_replaced(engine, int(marker.read_text()), clip("pan", seconds=2.0, size=(128, 96)))


def test_a_crashing_reader_fails_only_its_own_request(engine, clip, tmp_path):
    """A reader that aborts (SIGABRT, as a native decoder dies on a malformed file) gives its request the
    unreadable-file sentence at once; a request submitted together with it completes."""
    crash = faulty_copy(clip("scene_cut", seconds=2.0), tmp_path, "crash_")
    crashed = engine.submit(crash, "What moves?", FAST)
    normal = engine.submit(clip("moving_object", seconds=2.0, size=(128, 96)), "What moves?", FAST)

    with pytest.raises(InputError) as failed:
        crashed.result(timeout_s=READ_TIMEOUT_S)  # well before the timeout: a crash is not a hang
    assert str(failed.value) == video.UNREADABLE and one_sentence(str(failed.value))
    assert Path(f"{crash}.child").exists(), "the crashing reader never ran"
    assert_answered(normal)
    assert wait_until(lambda: engine.running_requests == 0, 10)
    assert_replaced(engine, int(Path(f"{crash}.child").read_text()), clip("pan", seconds=2.5, size=(128, 96)))


def test_a_reader_killed_from_outside_mid_read_blames_no_file(engine, clip, tmp_path):
    """A reader killed with SIGKILL while it holds a file (the kernel's out-of-memory killer, an operator)
    says nothing about the file: it goes to another reader and is answered; the killed one is replaced."""
    victim = faulty_copy(clip("scene_cut", seconds=2.5), tmp_path, "killed_")
    stats = assert_answered(engine.submit(victim, "What moves?", FAST))
    assert Path(f"{victim}.child").exists(), "no reader was killed"
    assert stats["read_s"] > 0
    assert wait_until(lambda: engine.running_requests == 0, 10)
    assert_replaced(engine, int(Path(f"{victim}.child").read_text()), clip("static", seconds=3.0))


def test_a_memory_hungry_file_fails_only_its_own_request(engine, clip, tmp_path):
    """A file that makes the reader allocate without bound meets the cap (read_memory_bytes): its
    request gets the out-of-memory sentence, the reader retires, and a request beside it completes."""
    hungry = faulty_copy(clip("pan", seconds=2.0), tmp_path, "hungry_")
    starved = engine.submit(hungry, "What moves?", FAST)
    normal = engine.submit(clip("static", seconds=2.5, size=(128, 96)), "What moves?", FAST)

    with pytest.raises(InputError) as failed:
        starved.result(timeout_s=READ_TIMEOUT_S)
    assert str(failed.value) == video.OUT_OF_MEMORY and one_sentence(str(failed.value))
    assert_answered(normal)
    assert wait_until(lambda: engine.running_requests == 0, 10)
    assert_replaced(engine, int(Path(f"{hungry}.child").read_text()), clip("pan", seconds=2.5))


def test_a_soundtrack_that_does_not_decode_costs_the_soundtrack_only(tiny_cache_dir, tmp_path):
    """A file whose audio stream fails to decode (`deaf_*`) is answered from its frames by a model that hears;
    the stats and a status line say the soundtrack was unreadable, and the reader that read it serves on: a
    soundtrack's fault is not the reader's."""
    deaf = write_clip_with_sound(tmp_path / "deaf_clip.mp4", tone(440, 2.0, 16000)[None], 16000)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reader_pool, "READER_PROGRAM", faulty_program())
        with Engine(
            EngineConfig(model="tiny-random-nemotron-omni", device="cpu", cache_dir=tiny_cache_dir, video_readers=1)
        ) as hearing:
            assert wait_until(lambda: hearing.readers.idle == 1, 60)
            pids = hearing.readers.pids()
            stream = hearing.submit(deaf, "What is said?", FAST)
            statuses = [event.text for event in stream if event.kind == "status"]
            stats = stream.result(timeout_s=60).stats
            assert hearing.readers.pids() == pids
    assert stats["generated_tokens"] == FAST.max_new_tokens and stats["frames_sampled"] > 0
    assert (stats["soundtrack"], stats["audio_tokens"], stats["audio_seconds"]) == ("unreadable", 0, 0.0)
    assert UNREADABLE_SOUNDTRACK in statuses
