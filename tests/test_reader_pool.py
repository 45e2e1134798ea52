"""The warm reader pool (engine/reading/pool.py): long videos read by several readers at once give exactly
the frames one reader gives; stopping the engine, or the death of its process, leaves no reader alive.

Faults (hangs, crashes, memory) and the replacement of a reader: tests/test_decoder_faults.py. The pool
under 16 users at once: tests/test_load.py.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app_harness import wait_until
from bench.decoding import write_long_gop_clip
from engine import Engine, EngineConfig
from engine.config import FrameSampling
from engine.reading.pipe import ReaderPipe
from engine.reading.pool import ReaderPool
from engine.reading.segments import segments, units
from engine.reading.video import read_video
from reader_processes import alive, reader_children
from sound_clips import tone, write_clip_with_sound
from test_video_formats import VARIABLE, write_video

ROOT = Path(__file__).resolve().parent.parent
LIMITS = dict(max_seconds=600.0, max_bytes=1 << 30, timeout_s=120.0)
FRAME_SAMPLING = FrameSampling(fps=4.0, max_frames=32, max_pixels_per_frame=224 * 224)
# Long-GOP H.264 as the bench makes it (bench/decoding.py), 12 s of 320x240 with a keyframe every 1.5 s
# and B-frames: 8 keyframe groups for 32 samples, made in about a second.
LONG_GOP = dict(seconds=12, fps=30, size=(320, 240), gop_s=1.5)
# The variable-rate clip of tests/test_video_formats.py (30 fps for 2 s, then 10 fps) with a keyframe
# every 10 frames: 10 groups, 24 samples by time across both rates.
VARIABLE_GOP = {"g": "10", "keyint_min": "10", "sc_threshold": "0", "bf": "2"}


@pytest.fixture(scope="module")
def long_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("long")
    return {
        "long_gop": write_long_gop_clip(folder / "long_gop.mp4", **LONG_GOP),
        "variable_rate": write_video(folder / "variable_rate.mp4", "mp4", "libx264", VARIABLE, options=VARIABLE_GOP),
    }


@pytest.fixture(scope="module")
def one_reader():
    with ReaderPool(1) as pool:
        yield pool


@pytest.mark.parametrize("name", ["long_gop", "variable_rate"])
@pytest.mark.parametrize("readers", [2, 3])
def test_segments_read_at_once_give_the_frames_one_reader_gives(long_files, one_reader, name, readers):
    """Split at keyframes among `readers` readers (splitting made worth it for these small files): the
    same frames to the bit, the same ordinals and times, as one reader reading the whole file."""
    with ReaderPool(readers, split_min_pixels=0) as pool:
        assert wait_until(lambda: pool.idle == readers, 60)
        together = read_video(long_files[name], FRAME_SAMPLING, readers=pool, **LIMITS)
    alone = read_video(long_files[name], FRAME_SAMPLING, readers=one_reader, **LIMITS)
    assert together.readers == readers and alone.readers == 1
    assert together.frames.shape == alone.frames.shape and len(alone.frames) >= 20
    assert np.array_equal(together.frames, alone.frames)
    assert together.frame_indices == alone.frame_indices
    assert together.timestamps_s == alone.timestamps_s
    assert (together.total_frames, together.duration_s) == (alone.total_frames, alone.duration_s)


def test_a_split_read_carries_the_soundtrack_one_reader_gives(tmp_path, one_reader):
    """The first segment's reader reads the soundtrack while the others decode theirs: the same samples, to
    the bit, as one reader reading the whole file (4 s of tone, a keyframe every 5 frames: 8 groups)."""
    path = write_clip_with_sound(
        tmp_path / "sounding.mp4", tone(440, 4.0, 22050)[None], 22050, seconds=4.0, keyframe_every=5
    )
    with ReaderPool(2, split_min_pixels=0) as pool:
        assert wait_until(lambda: pool.idle == 2, 60)
        together = read_video(path, FRAME_SAMPLING, readers=pool, soundtrack_rate_hz=16000, **LIMITS)
    alone = read_video(path, FRAME_SAMPLING, readers=one_reader, soundtrack_rate_hz=16000, **LIMITS)
    assert together.readers == 2 and alone.readers == 1
    assert together.soundtrack_status == alone.soundtrack_status == "ok"
    assert abs(together.soundtrack.seconds - 4.0) <= 0.1 and together.soundtrack.cut == alone.soundtrack.cut
    assert np.array_equal(together.soundtrack.samples, alone.soundtrack.samples)
    assert np.array_equal(together.frames, alone.frames)


def test_a_short_clip_is_read_by_one_reader(long_files):
    """Below the pool's threshold a video is not split, however many readers are free."""
    with ReaderPool(2) as pool:
        assert wait_until(lambda: pool.idle == 2, 60)
        assert read_video(long_files["long_gop"], FRAME_SAMPLING, readers=pool, **LIMITS).readers == 1


@given(
    gaps=st.lists(st.integers(1, 5), min_size=1, max_size=200),
    every=st.integers(1, 40),
    count=st.integers(1, 64),
    parts=st.integers(1, 8),
)
def test_segments_are_runs_of_whole_keyframe_groups(gaps, every, count, parts):
    pts = np.concatenate([[0], np.cumsum(gaps)]).astype(np.int64)
    keyframes = [int(p) for p in pts[::every]]
    targets = sorted({int(pts[i]) for i in np.linspace(0, len(pts) - 1, count).round().astype(int)})
    found = units(pts, keyframes, targets)
    pieces = segments(found, parts)
    assert [p for piece in pieces for p in piece] == targets
    assert len(pieces) == min(parts, len(found)) and all(pieces)
    groups = [set(members) for members, _ in found]
    for piece in pieces:  # no keyframe group is cut in two
        assert all(group <= set(piece) or not group & set(piece) for group in groups)


def test_a_reader_killed_while_idle_is_replaced_and_blames_no_file(clip):
    """A free reader killed from outside (the kernel's out-of-memory killer, an operator) is not handed
    the next file: that file is read by its replacement."""
    with ReaderPool(1) as pool:
        assert wait_until(lambda: pool.idle == 1, 60)
        (pid,) = pool.pids()
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: not alive(pid), 5)
        video = read_video(clip("pan", seconds=2.0), FRAME_SAMPLING, readers=pool, **LIMITS)
        assert len(video.frames) == 8 and pid not in pool.pids() and len(pool.pids()) == 1


def test_stopping_the_engine_leaves_no_reader_alive(tiny_cache_dir):
    others = reader_children()  # other tests' pools in this process
    with Engine(EngineConfig(model="tiny-random", device="cpu", cache_dir=tiny_cache_dir, video_readers=3)) as engine:
        assert wait_until(lambda: engine.readers.idle == 3, 60)
        pids = engine.readers.pids()
        assert len(pids) == 3 and reader_children() - others == pids
    assert not reader_children() - others
    assert not any(alive(pid) for pid in pids)


PARENT = """
import sys, threading, time
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests"]
from engine.reading import pool as reader_pool
from reader_processes import faulty_program
reader_pool.READER_PROGRAM = faulty_program()
pool = reader_pool.ReaderPool(2)
while pool.idle < 2:
    time.sleep(0.05)
print(" ".join(str(pid) for pid in pool.pids()), flush=True)
request = {"path": sys.argv[2], "frame_sampling": {}, "max_seconds": 60, "patch": 2, "max_source_pixels": 10**8,
           "memory_bytes": 1 << 30}
threading.Thread(target=pool.read, args=(request, 3600), daemon=True).start()
time.sleep(3600)
"""


def test_readers_die_with_the_engines_process(clip, tmp_path):
    """A parent killed with SIGKILL (no shutdown, no atexit) takes its readers with it: the idle one, and
    one stuck in a file (it reads no pipe, so only the kernel's parent-death signal can end it)."""
    hang = tmp_path / "hang_clip.mp4"
    shutil.copyfile(clip("static", seconds=2.0), hang)
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(ROOT), str(hang)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(pid) for pid in parent.stdout.readline().split()]
        assert len(pids) == 2 and all(alive(pid) for pid in pids)
        assert reader_children(parent.pid) == set(pids)
        marker = Path(f"{hang}.child")
        assert wait_until(marker.exists, 30), "no reader got stuck in the file"
        assert int(marker.read_text()) in pids
    finally:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
    try:
        assert wait_until(lambda: not any(alive(pid) for pid in pids), 10), "a reader outlived its parent"
    finally:  # a failure leaves no sleeper behind
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_answers_that_arrive_in_one_read_are_each_received():
    """A stream's reader answers frame after frame (a file played as live, a stream's first frames after probing):
    one read of the pipe may hold several answers, and the bytes past the first are the next ones, not lost."""
    answers = (
        b"".join(json.dumps({"status": "frame", "payload_bytes": 3}).encode() + b"\n" + bytes([n] * 3) for n in (1, 2))
        + json.dumps({"status": "ended"}).encode()
        + b"\n"
    )
    writer = f"import sys; sys.stdout.buffer.write({answers!r}); sys.stdout.flush(); sys.stdin.read()"
    pipe = ReaderPipe(
        subprocess.Popen([sys.executable, "-c", writer], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    )
    try:
        got = [pipe.receive(time.monotonic() + 10) for _ in range(3)]
    finally:
        pipe.kill()
    assert [header["status"] for header, _ in got] == ["frame", "frame", "ended"]
    assert [payload.tolist() for _, payload in got[:2]] == [[1, 1, 1], [2, 2, 2]] and got[2][1] is None
