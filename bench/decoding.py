"""Video reading: the engine's `read_video` on a long-GOP 1080p H.264 file, the slowest common upload, and
on a short clip.

    python -m bench.decoding [--quick] [--keep DIR]

The file is made here with PyAV (libx264, preset fast, a keyframe every 8 s at 30 fps, no scene-cut
keyframes): a grainy panorama panned across the frame (about 1.2 Mbit/s at 1080p), so every frame
costs a real decode. Full mode: 2 minutes of 1920x1080, 32 frames sampled at most 224x224 (the CPU
defaults), as issue 11 measured it; making the file takes about 5 minutes on two cores (`--keep DIR`
makes it once). Quick mode: 20 s of 960x540 with the same GOP, made and read in under 30 s on two
cores. `read_video` is timed `repeats` times each way, the median kept (the first, untimed run warms the
page cache): with a reader started for the file (every upload before issue 20), with a warm pool of one
reader, and with a warm pool of one reader per core, which reads the long file in segments at once (the
target: at most 0.55 of one warm reader's time, what splitting buys on two cores). Beside them, in this
process: the engine's read (`read_file`) with the frames it decoded and decord 0.6 (the engine's decoder
before issue 11) reading the same frames, each the median of `repeats` runs as the rows above, and every
frame decoded from the start once (what seeking and skipping save). Then two users' copies of the long file at
once (a burst): a reader started for each against the warm pool, where each reader's decoder gets the cores it
shares. The short clip (3 s of 320x240 H.264) is read with a reader started for it and by a warm one.
"""

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

if __package__ in (None, ""):  # `python bench/decoding.py`: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from assets.clips import _panorama, write_clip  # noqa: E402
from engine.config import FrameSampling
from engine.reading.decoders.pyav_video import decode_everything, read_file
from engine.reading.pool import ReaderPool, default_size
from engine.reading.video import read_video

try:
    from .markdown import cell, table
    from .targets import decoding_target_rows, met_cell
except ImportError:
    from bench.markdown import cell, table
    from bench.targets import decoding_target_rows, met_cell

FRAME_SAMPLING = FrameSampling(fps=2.0, max_frames=32, max_pixels_per_frame=224 * 224)
FULL = {"seconds": 120, "fps": 30, "size": (1920, 1080), "gop_s": 8, "repeats": 5}
QUICK = {"seconds": 20, "fps": 30, "size": (960, 540), "gop_s": 8, "repeats": 2}


def write_long_gop_clip(path: Path, *, seconds: int, fps: int, size: tuple[int, int], gop_s: float) -> Path:
    """An H.264 MP4 of `seconds` at `fps`, size (width, height), one keyframe every `gop_s` seconds.

    Frames are fed as yuv420p cut from a panorama converted once, which saves converting each frame from
    RGB (12 ms a 1080p frame on two cores, a fifth of the time to make the file).
    """
    width, height = size
    rng = np.random.default_rng(0)
    # Grain fixed to the scene (it pans with it): every block has texture to code, yet motion search finds
    # it from frame to frame, so P- and B-frames stay cheap as in camera footage.
    grain = rng.integers(-20, 21, (height, 3 * width, 1), dtype=np.int16)
    scene_rgb = (_panorama(width, height).astype(np.int16) + grain).clip(0, 255).astype(np.uint8)
    yuv = av.VideoFrame.from_ndarray(scene_rgb, format="rgb24").reformat(format="yuv420p")
    luma, chroma_u, chroma_v = (_plane(yuv, i) for i in range(3))
    count = round(seconds * fps)
    gop = str(round(gop_s * fps))
    with av.open(str(path), mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "fast", "crf": "23", "g": gop, "keyint_min": gop, "sc_threshold": "0"}
        for index in range(count):
            left = 2 * round(index / max(count - 1, 1) * (luma.shape[1] - width) / 2)  # even: chroma is halved
            planes = (
                luma[:, left : left + width],
                chroma_u[:, left // 2 : (left + width) // 2],
                chroma_v[:, left // 2 : (left + width) // 2],
            )
            frame_yuv = np.concatenate([plane.ravel() for plane in planes]).reshape(height * 3 // 2, width)
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame_yuv, format="yuv420p")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def _plane(frame: av.VideoFrame, index: int) -> np.ndarray:
    """Plane `index` of a yuv420p frame as a (rows, width) uint8 array without the line padding."""
    plane = frame.planes[index]
    rows = np.frombuffer(plane, np.uint8).reshape(plane.height, plane.line_size)
    return rows[:, : plane.width]


SHORT_CLIP = {"seconds": 3.0, "fps": 8, "size": (320, 240)}


def read_unbounded(path: Path, sampling: FrameSampling, readers: ReaderPool | None):
    """The engine's `read_video` on `path` with the upload limits out of the way (the bench times reading,
    not the checks): through the warm pool `readers`, or (None) a reader started for it."""
    return read_video(path, sampling, max_seconds=3 * 3600, max_bytes=1 << 40, timeout_s=600, readers=readers)


def time_load_video(
    path: Path, sampling: FrameSampling, repeats: int, readers: ReaderPool | None = None
) -> tuple[list[float], list[float], object]:
    """(wall seconds, reader-process CPU seconds, one per timed run; the last SampledVideo) of the
    engine's `read_video` on `path`: through the warm pool `readers`, or (None) with a reader started for
    each run, as every upload was read before the pool. CPU seconds count only readers that ended (the
    ones started for a run; 0 through a warm pool); they are the steadier figure on a shared machine."""

    def once():
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        video = read_unbounded(path, sampling, readers)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), video

    once()  # page cache, interpreter start-up files
    walls, cpus, video = [], [], None
    for _ in range(repeats):
        wall, cpu, video = once()
        walls.append(wall)
        cpus.append(cpu)
    return walls, cpus, video


def time_two_at_once(
    path: Path, sampling: FrameSampling, repeats: int, readers: ReaderPool | None = None
) -> list[float]:
    """Wall seconds, one per timed run, until two `read_video` calls on `path` made at the same moment both
    end: two users' long uploads in a burst, through the warm pool `readers` or (None) with a reader started
    for each, as before the pool."""

    def once() -> float:
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=2) as users:
            reads = [users.submit(read_unbounded, path, sampling, readers) for _ in range(2)]
            for read in reads:
                read.result()
        return time.perf_counter() - start

    once()
    return [once() for _ in range(repeats)]


def time_references(path: Path, sampling: FrameSampling, repeats: int) -> dict:
    """In this process, each the median of `repeats` runs after an untimed one: the engine's read (its work
    counted), the same frames decoded one after another from the first with nothing skipped, and decord 0.6 (the
    engine's decoder before) reading them by index. None where decord is not installed."""
    header, frames = read_file(str(path), sampling, 3 * 3600, 2, 1 << 40)
    if header["status"] != "ok":
        raise RuntimeError(f"the engine could not read {path}: {header}")
    _, height, width, _ = frames.shape
    planned = _median_seconds(lambda: read_file(str(path), sampling, 3 * 3600, 2, 1 << 40), repeats)
    decoded = {}

    def everything():
        decoded["work"] = decode_everything(str(path), header["frame_indices"], (height, width))[1]

    in_order = _median_seconds(everything, 1, warm_up=False)  # every frame of the file: tens of seconds at 1080p
    try:
        from decord import VideoReader
    except ImportError:
        by_decord = None
    else:
        by_decord = _median_seconds(
            lambda: VideoReader(str(path), width=width, height=height).get_batch(header["frame_indices"]).asnumpy(),
            repeats,
        )
    return {
        "planned_s": planned["wall_s"],
        "planned_cpu_s": planned["cpu_s"],
        "planned_runs_s": planned["runs_s"],
        "frames_decoded": header["frames_decoded"],
        "seeks": header["seeks"],
        "decoded_size": header["decoded_size"],
        "in_order_s": in_order["wall_s"],
        "in_order_cpu_s": in_order["cpu_s"],
        "in_order_frames_decoded": decoded["work"]["frames_decoded"],
        "decord_s": by_decord and by_decord["wall_s"],
        "decord_cpu_s": by_decord and by_decord["cpu_s"],
        "decord_runs_s": by_decord and by_decord["runs_s"],
    }


def _median_seconds(work, repeats: int, warm_up: bool = True) -> dict:
    """work() once untimed (unless not warm_up), then `repeats` times in this process: {"wall_s", "cpu_s"}: the
    medians of its wall and CPU seconds (CPU counts every thread, the decoder's included); "runs_s": each run's
    wall seconds."""
    if warm_up:
        work()
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        work()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return {"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus), "runs_s": walls}


def long_gop_file(quick: bool, folder: Path) -> tuple[Path, float]:
    """(the mode's long-GOP file in `folder`, seconds it took to make; 0 when it was there already)."""
    spec = QUICK if quick else FULL
    width, height = spec["size"]
    path = Path(folder) / f"long_gop_{spec['seconds']}s_{width}x{height}_{spec['fps']}fps_g{spec['gop_s']}s.mp4"
    if path.is_file():
        return path, 0.0
    path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    partial = path.with_suffix(".part.mp4")
    write_long_gop_clip(partial, seconds=spec["seconds"], fps=spec["fps"], size=spec["size"], gop_s=spec["gop_s"])
    partial.rename(path)
    return path, time.perf_counter() - start


def decoding_scenario(quick: bool, keep: Path | None = None) -> dict:
    """Make the long-GOP file, read 32 sampled frames with the engine each way; file facts and seconds.

    keep: a folder where the file is made (and reused when already there) instead of a temporary one
    (the full file takes minutes to make on two cores).
    """
    spec = QUICK if quick else FULL
    width, height = spec["size"]
    cores = default_size()
    with tempfile.TemporaryDirectory() as scratch:
        path, make_s = long_gop_file(quick, Path(keep) if keep else Path(scratch))
        short = write_clip(Path(scratch) / "short.mp4", "pan", **SHORT_CLIP)
        walls, cpus, video = time_load_video(path, FRAME_SAMPLING, spec["repeats"])
        short_cold, _, _ = time_load_video(short, FRAME_SAMPLING, spec["repeats"])
        with ReaderPool(1) as one:
            warm_one, _, _ = time_load_video(path, FRAME_SAMPLING, spec["repeats"], one)
            short_warm, _, _ = time_load_video(short, FRAME_SAMPLING, spec["repeats"], one)
        with ReaderPool(cores) as pool:
            warm_all, _, split = time_load_video(path, FRAME_SAMPLING, spec["repeats"], pool)
            two_warm = time_two_at_once(path, FRAME_SAMPLING, spec["repeats"], pool)
        two_started = time_two_at_once(path, FRAME_SAMPLING, spec["repeats"])
        references = time_references(path, FRAME_SAMPLING, spec["repeats"])
        size_bytes = path.stat().st_size
    return {
        "mode": "quick" if quick else "full",
        "file": f"H.264 {width}x{height} {spec['fps']} fps, {spec['seconds']} s, keyframe every {spec['gop_s']} s",
        "file_mb": round(size_bytes / 1e6, 1),
        "bitrate_mbit_s": round(size_bytes * 8 / spec["seconds"] / 1e6, 2),
        "make_file_s": round(make_s, 1),
        "frames_sampled": int(video.frames.shape[0]),
        "frame_size": f"{video.frames.shape[2]}x{video.frames.shape[1]}",
        "sampled_fps": round(video.sampled_fps, 4),
        "started_reader_s": round(statistics.median(walls), 3),
        "started_reader_runs_s": [round(run, 3) for run in walls],
        "started_reader_cpu_s": round(statistics.median(cpus), 3),
        "warm_one_reader_s": round(statistics.median(warm_one), 3),
        "warm_one_reader_runs_s": [round(run, 3) for run in warm_one],
        "warm_readers": cores,
        "warm_readers_used": split.readers,
        "warm_readers_s": round(statistics.median(warm_all), 3),
        "warm_readers_runs_s": [round(run, 3) for run in warm_all],
        "two_started_readers_s": round(statistics.median(two_started), 3),
        "two_started_readers_runs_s": [round(run, 3) for run in two_started],
        "two_warm_readers_s": round(statistics.median(two_warm), 3),
        "two_warm_readers_runs_s": [round(run, 3) for run in two_warm],
        "short_clip": f"H.264 {SHORT_CLIP['size'][0]}x{SHORT_CLIP['size'][1]} {SHORT_CLIP['fps']} fps, "
        f"{SHORT_CLIP['seconds']:g} s",
        "short_started_reader_s": round(statistics.median(short_cold), 3),
        "short_warm_reader_s": round(statistics.median(short_warm), 3),
        "total_frames": video.total_frames,
        **{key: _rounded(value) for key, value in references.items()},
        "cpu_cores": os.cpu_count(),
    }


def _rounded(value):
    """Seconds to the millisecond, one or a list of them; anything else as it is."""
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, list):
        return [_rounded(item) for item in value]
    return value


def markdown(result: dict, targets: list[dict] = ()) -> str:
    """The tables, with the long-file target's verdict on the split pool's row (targets: the run's target rows)."""
    facts = table(
        ["measure", "value"],
        [
            ["file", f"{result['file']}, {result['file_mb']} MB ({result['bitrate_mbit_s']} Mbit/s)"],
            ["sampled", f"{result['frames_sampled']} frames at {result['frame_size']} ({result['sampled_fps']} fps)"],
            ["CPU cores", result["cpu_cores"]],
        ],
    )
    total = result["total_frames"]
    none = "–"

    def runs(key: str) -> str:
        return f"runs {', '.join(cell(run) for run in result[key])}"

    rows = [
        [
            "`read_video`, a reader started for the file (every upload before the pool; median)",
            cell(result["started_reader_s"]),
            cell(result["started_reader_cpu_s"]),
            f"{result['frames_decoded']} of {total}, {result['seeks']} seeks",
            runs("started_reader_runs_s"),
            none,
        ],
        [
            "`read_video`, a warm pool of 1 reader (median)",
            cell(result["warm_one_reader_s"]),
            "—",
            f"{result['frames_decoded']} of {total}",
            runs("warm_one_reader_runs_s"),
            none,
        ],
        [
            f"`read_video`, a warm pool of {result['warm_readers']} readers (median)",
            cell(result["warm_readers_s"]),
            "—",
            f"in {result['warm_readers_used']} segments at once; "
            f"{cell(result['warm_readers_s'] / result['warm_one_reader_s'], 2)} of one warm reader's",
            runs("warm_readers_runs_s"),
            met_cell(targets, "decoding", {}),
        ],
        [
            "two of the file at once, a reader started for each (median)",
            cell(result["two_started_readers_s"]),
            "—",
            "each whole",
            runs("two_started_readers_runs_s"),
            none,
        ],
        [
            f"two of the file at once, the warm pool of {result['warm_readers']} (median)",
            cell(result["two_warm_readers_s"]),
            "—",
            "each whole, the cores shared",
            runs("two_warm_readers_runs_s"),
            none,
        ],
        [
            "the engine's read, in process (median)",
            cell(result["planned_s"]),
            cell(result["planned_cpu_s"]),
            f"{result['frames_decoded']} of {total}",
            runs("planned_runs_s"),
            none,
        ],
        [
            "every frame from the start, nothing skipped (one run)",
            cell(result["in_order_s"]),
            cell(result["in_order_cpu_s"]),
            f"{result['in_order_frames_decoded']} of {total}",
            "PyAV, same threads",
            none,
        ],
        [
            "decord 0.6 by index, in process (the decoder before; median)",
            cell(result["decord_s"]),
            cell(result["decord_cpu_s"]),
            "—",
            "not installed" if result["decord_s"] is None else runs("decord_runs_s"),
            none,
        ],
    ]
    short = table(
        ["short clip", "wall s"],
        [
            [f"{result['short_clip']}, a reader started for it", cell(result["short_started_reader_s"])],
            [f"{result['short_clip']}, a warm reader", cell(result["short_warm_reader_s"])],
        ],
    )
    reads = table(["32-frame read", "wall s", "CPU s", "frames decoded", "notes", "met"], rows)
    return facts + "\n\n" + reads + "\n\n" + short


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 s of 960x540 instead of 2 min of 1080p")
    parser.add_argument("--keep", type=Path, help="make (or reuse) the file in this folder")
    args = parser.parse_args()
    result = decoding_scenario(args.quick, args.keep)
    print(markdown(result, decoding_target_rows(result, {})))


if __name__ == "__main__":
    main()
