"""One video's sampled frames as segments several readers can read at once, and the readers' frames put
back in sampled order. Numpy only: the engine process and the reader processes both use it.

A unit is the sampled frames that share one keyframe: a reader decodes from that keyframe to the last of
them. Segments are runs of whole units, so each starts where one reader alone would seek to (or from the
first frame), and decoding a segment gives exactly the frames one reader gives for it
(tests/test_reader_pool.py checks it frame for frame).
"""

from bisect import bisect_right

import numpy as np

# Split a video only when its units would decode at least this many pixels: each segment costs its reader
# opening the file and its decoder again, about 45 ms of CPU (the 2-minute 1080p bench file read in 15
# segments took 0.6 s more than in one), what 50 megapixels of H.264 (25 frames of 1080p) take to decode.
SPLIT_MIN_PIXELS = 50_000_000


def units(pts: np.ndarray, keyframes: list[int], targets: list[int]) -> list[tuple[list[int], int]]:
    """[(targets, frames to decode)]: the ascending target pts grouped by the keyframe at or before each
    (targets before every keyframe group with the first one), with the frames from that keyframe to the
    group's last target, the decoding work of the group read alone.

    pts: (n,) ascending pts of every frame. keyframes: ascending pts decoding can start from.
    """
    groups: dict[int, list[int]] = {}
    for target in targets:
        groups.setdefault(keyframes[max(0, bisect_right(keyframes, target) - 1)], []).append(target)
    found = []
    for key, members in groups.items():
        start = int(np.searchsorted(pts, min(key, members[0])))
        found.append((members, int(np.searchsorted(pts, members[-1], side="right")) - start))
    return found


def partition(work: list[int], parts: int) -> list[int]:
    """Where to cut `work` (each unit's cost, in order) into min(parts, units) contiguous runs of about
    equal total: the start index of every run after the first. Each run holds at least one unit."""
    parts = max(1, min(parts, len(work)))
    total = sum(work)
    cuts, running = [], 0
    for index, cost in enumerate(work[:-1]):
        running += cost
        needed, left = parts - 1 - len(cuts), len(work) - index - 1  # cuts still to make, units after this one
        # Cut once the running total reaches this run's share, or when every unit left must start a run.
        if needed and (running >= total * (len(cuts) + 1) / parts or left == needed):
            cuts.append(index + 1)
    return cuts


def segments(found: list[tuple[list[int], int]], parts: int) -> list[list[int]]:
    """The targets of `units` in min(parts, units) segments of about equal work, each a list of pts."""
    cuts = [0, *partition([work for _, work in found], parts), len(found)]
    return [[pts for members, _ in found[start:end] for pts in members] for start, end in zip(cuts, cuts[1:])]


def worth_splitting(found: list[tuple[list[int], int]], frame_pixels: int, min_pixels: int = SPLIT_MIN_PIXELS) -> bool:
    """Whether reading `found` with more than one reader pays: two units or more, and at least
    `min_pixels` to decode (frame_pixels: width * height as stored)."""
    return len(found) > 1 and sum(work for _, work in found) * frame_pixels >= min_pixels


def assemble(
    wanted: list[int], parts: list[tuple[list[dict], np.ndarray]]
) -> tuple[np.ndarray, list[int], list[float]] | None:
    """((N, H, W, 3) uint8 frames, frame ordinals, seconds) for the N sampled pts `wanted` (ascending, a pts
    repeated where two sampled times show the same frame), from the readers' parts: each a list of
    {"pts": target, "ordinal": frame shown, "seconds": its time} and their (K, H, W, 3) frames in that
    order. A target no part holds (a count from a damaged file) repeats the latest frame any part holds;
    None when no part holds any. One part that holds exactly `wanted` is returned as it is, uncopied.
    """
    taken = {entry["pts"]: (entry, frames, row) for entries, frames in parts for row, entry in enumerate(entries)}
    if not taken:
        return None
    if len(parts) == 1 and [entry["pts"] for entry in parts[0][0]] == list(wanted):
        entries, frames = parts[0]
        return frames, [entry["ordinal"] for entry in entries], [entry["seconds"] for entry in entries]
    latest = taken[max(taken)]
    out = np.empty((len(wanted), *latest[1].shape[1:]), np.uint8)
    ordinals, seconds = [], []
    for slot, pts in enumerate(wanted):
        entry, frames, row = taken.get(pts, latest)
        out[slot] = frames[row]
        ordinals.append(entry["ordinal"])
        seconds.append(entry["seconds"])
    return out, ordinals, seconds
