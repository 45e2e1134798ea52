"""Reader processes as the tests see them: this process's children that are video readers, and readers
that misbehave on purpose.

`faulty_program()` is engine/reading/pool.py's READER_PROGRAM with engine.reading.reader_process._read wrapped, so
that a reader, before reading a file, looks at its name:
- `hang_*`: writes a marker with its pid (`<file>.child`), then sleeps for an hour (a decoder stuck on a
  malformed file);
- `crash_*`: writes the marker, then `os.abort()`s (a native decoder dying with SIGABRT);
- `hungry_*`: writes the marker, then allocates 64 MB at a time without end (a file that makes the
  decoder allocate without bound; the reader's memory cap turns it into a MemoryError);
- `garbled_*`: writes the marker, then answers frames that do not fill the shape it gives;
- `killed_*`: the first reader to see it writes the marker, then dies of SIGKILL (as the kernel's
  out-of-memory killer or an operator would kill it); a later reader finds the marker and reads it;
- `deaf_*`: its frames are read for real, its soundtrack fails as a stream PyAV cannot decode does
  (av.error.InvalidDataError);
- anything else: reads the file for real.
The faulty files are valid clips, so nothing but the reader is at fault; the markers prove the fault ran
in a reader (the tests fail on a missing marker if the seam moves, or here if READER_PROGRAM changes).
"""

import os
from pathlib import Path

from engine.reading import pool as reader_pool

FAULTS = """
import os as _os, signal as _signal, time as _time
import av as _av
import engine.reading.reader_process as _reader
_real_read = _reader._read
_real_read_soundtrack = _reader.read_soundtrack


def _faulty_read(request):
    name = _os.path.basename(request["path"])
    if name.startswith("killed_") and not _os.path.exists(request["path"] + ".child"):
        with open(request["path"] + ".child", "w") as marker:
            marker.write(str(_os.getpid()))
        _os.kill(_os.getpid(), _signal.SIGKILL)
    if name.startswith(("hang_", "crash_", "hungry_", "garbled_")):
        with open(request["path"] + ".child", "w") as marker:
            marker.write(str(_os.getpid()))
    if name.startswith("hang_"):
        _time.sleep(3600)
    if name.startswith("crash_"):
        _os.abort()
    if name.startswith("hungry_"):
        import numpy as _np
        hoard = [_np.empty(64 << 20, _np.uint8) for _ in range(1 << 16)]  # untouched: counted, never written
    if name.startswith("garbled_"):
        return {"status": "ok", "shape": [2, 4, 4, 3], "entries": [{}, {}]}, b"short"
    return _real_read(request)



def _faulty_read_soundtrack(path, rate_hz, max_seconds):
    if _os.path.basename(str(path)).startswith("deaf_"):
        raise _av.error.InvalidDataError(22, "Invalid data found when processing input")
    return _real_read_soundtrack(path, rate_hz, max_seconds)


_reader._read = _faulty_read
_reader.read_soundtrack = _faulty_read_soundtrack
"""
_ANCHOR = "from engine.reading.reader_process import serve\n"


def faulty_program() -> str:
    """READER_PROGRAM with the faults above, put in just before the reader starts serving; once only, when the
    program in force has them already (a second copy would wrap the first, whose call of the real read then
    finds itself)."""
    program = reader_pool.READER_PROGRAM
    assert _ANCHOR in program, "READER_PROGRAM changed: give the tests another way to run readers of their own"
    return program if FAULTS in program else program.replace(_ANCHOR, _ANCHOR + FAULTS)


def reader_children(parent: int | None = None) -> set[int]:
    """Pids of the live (not zombie) children of `parent` (default: this process) running the reader."""
    parent = os.getpid() if parent is None else parent
    found = set()
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
            cmdline = (status.parent / "cmdline").read_bytes()
        except OSError:
            continue  # ended meanwhile
        alive = fields.get("State", "").strip()[:1] != "Z"
        if alive and int(fields.get("PPid", "0").strip()) == parent and b"reader_process" in cmdline:
            found.add(int(status.parent.name))
    return found


def alive(pid: int) -> bool:
    """Whether process `pid` has a thread that has not ended. The main thread of a killed process shows
    as a zombie while its other threads (the decoder's) are still being torn down; only once every one
    has ended can its parent collect it."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return False
    for task in tasks:
        try:
            state = (task / "status").read_text().split("State:\t", 1)[1][:1]
        except (OSError, IndexError):
            continue  # ended meanwhile
        if state != "Z":
            return True
    return False
