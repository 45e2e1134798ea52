"""Decoder faults: a decoder that hangs and one that crashes fail only their own request (issue 11, item 6).

engine/video.py decodes every upload in a fresh child interpreter that runs the module-level program
`engine.video._CHILD_PROGRAM` (`python -c _CHILD_PROGRAM <engine dir> <request JSON>`), and kills it
after `decode_timeout_s`. That string is the seam: the tests put a few lines in front of it, so that the
child, before decoding, looks at the upload's file name and
- `hang_*`: writes a marker with its pid, then sleeps for an hour (a decoder stuck on a malformed file);
- `crash_*`: writes a marker, then `os.abort()`s (a native decoder dying with SIGABRT);
- anything else: runs the real program unchanged (the real decoder, in a real child).
The faulty files are valid clips, so nothing but the decoder is at fault; the markers prove the fault
really ran in a child (the tests are not vacuous if the seam moves: they fail on the missing marker, or
on the missing attribute).

Each fault goes to the engine together with a normal request on another clip. What must hold: the
faulty request ends with its own one-sentence error (engine.video.TOO_SLOW after the timeout,
engine.video.UNREADABLE for the crash); the normal one completes with its answer, without waiting for
the hang; the hung child is killed; the engine ends with no running request and keeps serving.
"""

import os
import shutil
import signal
import time
from pathlib import Path

import pytest

import engine.video as video
from engine import Engine, EngineConfig, GenerationParams, STATS_KEYS
from engine.errors import InputError

from app_harness import wait_until

# Long enough that a normal decode (a fresh interpreter importing numpy and decord: ~0.5 s, a few s on
# 2 loaded cores) never times out, short enough to keep the hang test at ~10 s. The normal request must
# finish inside it, which is what shows it did not wait for the hung decode.
DECODE_TIMEOUT_S = 8.0
KILL_SLACK_S = 10.0  # the hang must fail by timeout + this: the kill works and nothing else waits on it
FAST = GenerationParams(pruning_rate=0.5, max_new_tokens=6)

FAULTS_PROLOGUE = '''
import json, os, sys, time
_path = json.loads(sys.argv[2])["path"]
_name = os.path.basename(_path)
if _name.startswith(("hang_", "crash_")):
    with open(_path + ".child", "w") as _marker:
        _marker.write(str(os.getpid()))
if _name.startswith("hang_"):
    time.sleep(3600)
if _name.startswith("crash_"):
    os.abort()
'''


def one_sentence(text: str) -> bool:
    return text.endswith(".") and "\n" not in text and ". " not in text and "Traceback" not in text


def decoder_children() -> dict[int, bytes]:
    """This process's live children running the decoder program: pid -> command line."""
    children = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            lines = status.read_text().splitlines()
            cmdline = (status.parent / "cmdline").read_bytes()
        except OSError:
            continue  # ended meanwhile
        fields = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
        alive = fields.get("State", "").strip()[:1] != "Z"
        if alive and int(fields.get("PPid", "0")) == os.getpid() and b"_child_main" in cmdline:
            children[int(status.parent.name)] = cmdline
    return children


@pytest.fixture(scope="module")
def engine(tiny_cache_dir):
    with Engine(EngineConfig(model="tiny-random", device="cpu", cache_dir=tiny_cache_dir,
                             decode_timeout_s=DECODE_TIMEOUT_S)) as running:
        yield running


@pytest.fixture
def faulty_decoders(monkeypatch, tmp_path):
    """The decoder child program with the fault prologue; afterwards any child that outlived its test
    (only ones this test started, by the pid they wrote) is killed so a failure leaves no sleeper."""
    assert hasattr(video, "_CHILD_PROGRAM"), (
        "engine/video.py no longer has _CHILD_PROGRAM, the seam these tests use; give the tests another "
        "way to run a decoder of their own in the child")
    monkeypatch.setattr(video, "_CHILD_PROGRAM", FAULTS_PROLOGUE + video._CHILD_PROGRAM)
    yield
    for marker in tmp_path.glob("*.child"):
        pid = int(marker.read_text())
        if pid in decoder_children():
            os.kill(pid, signal.SIGKILL)


def faulty_copy(clip: Path, folder: Path, prefix: str) -> Path:
    """A valid clip under a name that makes the test decoder misbehave."""
    path = folder / f"{prefix}{clip.name}"
    shutil.copyfile(clip, path)
    return path


def assert_answered(stream) -> None:
    answer = stream.result(timeout_s=60)
    assert answer.text and not answer.cancelled
    assert set(STATS_KEYS) <= set(answer.stats)
    assert answer.stats["generated_tokens"] == FAST.max_new_tokens


def test_a_hanging_decoder_fails_only_its_own_request(engine, faulty_decoders, clip, tmp_path):
    """The hang costs its own request the timeout and a TOO_SLOW sentence; a request submitted right
    after it (another clip, decoded by the real program in its own child) completes before the timeout
    ends, so the hang held neither the engine nor the other request; the hung child is then killed."""
    hang = faulty_copy(clip("static", seconds=2.0), tmp_path, "hang_")
    start = time.monotonic()
    hung = engine.submit(hang, "What moves?", FAST)
    normal = engine.submit(clip("moving_object", seconds=2.5), "What moves?", FAST)

    marker = Path(f"{hang}.child")
    assert wait_until(marker.exists, DECODE_TIMEOUT_S), "the hanging decoder never started"
    assert int(marker.read_text()) in decoder_children(), "the hanging decoder is not a live child"
    assert_answered(normal)
    assert not hung.finished, "the normal request waited for the hung decode (or the timeout is too short)"

    with pytest.raises(InputError) as failed:
        hung.result(timeout_s=DECODE_TIMEOUT_S + KILL_SLACK_S)
    elapsed = time.monotonic() - start
    assert str(failed.value) == video.TOO_SLOW and one_sentence(str(failed.value))
    assert DECODE_TIMEOUT_S <= elapsed <= DECODE_TIMEOUT_S + KILL_SLACK_S
    assert wait_until(lambda: int(marker.read_text()) not in decoder_children(), 5), "the hung child lives on"
    assert wait_until(lambda: engine.running_requests == 0, 10)
    assert_answered(engine.submit(clip("pan", seconds=2.0), "And now?", FAST))  # still serving


def test_a_crashing_decoder_fails_only_its_own_request(engine, faulty_decoders, clip, tmp_path):
    """A decoder that aborts (SIGABRT, as a native decoder dies on a malformed file) gives its request the
    unreadable-file sentence at once; a request submitted together with it completes."""
    crash = faulty_copy(clip("scene_cut", seconds=2.0), tmp_path, "crash_")
    crashed = engine.submit(crash, "What moves?", FAST)
    normal = engine.submit(clip("moving_object", seconds=2.0, size=(128, 96)), "What moves?", FAST)

    with pytest.raises(InputError) as failed:
        crashed.result(timeout_s=DECODE_TIMEOUT_S)  # well before the timeout: a crash is not a hang
    assert str(failed.value) == video.UNREADABLE and one_sentence(str(failed.value))
    assert Path(f"{crash}.child").exists(), "the crashing decoder never ran"
    assert_answered(normal)
    assert wait_until(lambda: engine.running_requests == 0, 10)
    assert not decoder_children()
