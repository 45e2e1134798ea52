"""PyAV decoding, run in a reader process (engine/reading/reader_process.py): the video's timeline from its packets,
then the sampled frames only, each decoded the cheapest way the file allows.

1. One pass over the packets, without decoding, gives every frame's presentation time (PTS) and which
   frames are keyframes. Frames are sampled by time from it (`sample_by_time`), so a variable-frame-rate
   file is sampled at even seconds and each frame carries its own time.
2. Decoding seeks to the keyframe before a sampled frame when one lies ahead of what is decoded so far
   (otherwise it decodes through), and skips the frames nothing refers to (`skip_frame = "NONREF"`) except
   the sampled ones. With decoder threads, on a 2-minute 1080p H.264 file with a keyframe every 8 s, this
   decodes about 1,400 of 3,600 frames for 32 samples (bench/decoding.py).
3. Codecs that can decode at a reduced size (MPEG-4 part 2, MPEG-1/2, MJPEG) do, when the sampled size is
   half the stored one or less.
4. Where a container's times cannot be trusted the decode stays correct, only slower: AVI and raw streams
   store no presentation times, so their frames are counted instead (no skipping); a seek that lands
   wrong, or frames that come out at times the first pass did not see (MPEG-PS), start the decode over
   from the first frame, nothing skipped.
"""

from array import array
from bisect import bisect_right
from dataclasses import dataclass
from fractions import Fraction

import av
import numpy as np

from engine.config import FrameSampling

from ..frame_sampling import fit_pixels, sample_by_time, sampled_frame_count
from ..segments import assemble

# A seek drops the frames the decoder threads have in flight and restarts at a keyframe: when the next
# keyframe is only a few frames ahead, decoding through to it costs less.
SEEK_AHEAD_FRAMES = 8
# FFmpeg decoders with a `lowres` mode (its max_lowres is 3 for each); other decoders refuse the option.
_LOWRES_DECODERS = {"mpeg4", "h263", "msmpeg4", "msmpeg4v2", "msmpeg4v3", "mpeg1video", "mpeg2video", "mjpeg"}
_MAX_LOWRES = 3
# Opening without decoding frames while probing (open_unprobed): containers (FFmpeg's demuxer names) whose
# index holds every packet's times and whose headers hold the frame size; MP4/MOV, whose index also says how
# far frames are reordered (FFmpeg's mov demuxer reads it from the composition offsets); and codecs that show
# frames in the order they are stored.
_MP4 = "mov,mp4,m4a,3gp,3g2,mj2"
_INDEXED_FORMATS = {_MP4, "matroska,webm"}
_UNREORDERED_CODECS = {"vp8", "vp9", "av1"}


class SeekMissed(Exception):
    """A seek landed past the frame it was for, also from earlier keyframes, or on nothing decodable."""


@dataclass(frozen=True)
class Timeline:
    """Every frame of a video stream, read from its packets without decoding.

    pts: (n,) int64, one per frame, ascending, in time_base units. keyframes: ascending pts decoding can
    start from. end: pts at which the last frame stops showing. by_order: the packets carry no
    presentation times, so a decoded frame is known by its place in the output, not by its pts: raw
    streams (pts are then the ordinals, time_base 1 / the rate), and AVI, which stores none (FFmpeg
    numbers its packets in decode order, so with B-frames decoded frames come out with their neighbours'
    numbers; the numbers still index the frames, and keyframes, in a constant-rate file).
    """

    pts: np.ndarray
    keyframes: list[int]
    time_base: Fraction
    end: int
    by_order: bool

    def seconds(self, pts) -> np.ndarray:
        """Seconds from the first frame of `pts` (any int array-like in time_base units)."""
        offset = np.asarray(pts, dtype=np.int64) - int(self.pts[0])
        return offset * self.time_base.numerator / self.time_base.denominator

    @property
    def duration_s(self) -> float:
        return float(self.seconds([self.end])[0])


@dataclass(frozen=True)
class Plan:
    """What to read from one upload: its timeline, the pts of each sampled frame (wanted: N ascending, a pts
    repeated where two sampled times show the same frame), its frame size as stored and as sampled."""

    timeline: Timeline
    wanted: list[int]
    stored_hw: tuple[int, int]
    fit_hw: tuple[int, int]


def plan_file(
    path: str, sampling: FrameSampling, max_seconds: float, temporal_patch: int, max_source_pixels: int
) -> tuple[dict, Plan | None]:
    """(header, plan): the file's checks and its sampled frames' pts, from one pass over its packets.

    header["status"]: "ok" (with total_frames and duration_s; the plan goes with it), "too_long"
    (duration_s), "too_many_pixels" (size), or "unreadable".
    """
    with open_unprobed(path, decoding=False) as container:
        # FFmpeg reads still images (PNG, JPEG, ...) through image demuxers as one-frame videos: not uploads.
        if container.format.name == "image2" or container.format.name.endswith("_pipe"):
            return {"status": "unreadable"}, None
        stream = video_stream(container)
        if stream is None:
            return {"status": "unreadable"}, None
        width, height = stream.codec_context.width, stream.codec_context.height
        if width <= 0 or height <= 0:
            return {"status": "unreadable"}, None
        if width * height > max_source_pixels:
            return {"status": "too_many_pixels", "size": [width, height]}, None
        timeline = read_timeline(container, stream)
        if timeline is None or not 0 < timeline.duration_s < float("inf"):
            return {"status": "unreadable"}, None
        if timeline.duration_s > max_seconds:
            return {"status": "too_long", "duration_s": timeline.duration_s}, None
    count = sampled_frame_count(timeline.duration_s, len(timeline.pts), sampling, temporal_patch)
    wanted = [int(timeline.pts[i]) for i in sample_by_time(timeline.pts, count)]
    plan = Plan(timeline, wanted, (height, width), fit_pixels(height, width, sampling.max_pixels_per_frame))
    return {"status": "ok", "total_frames": len(timeline.pts), "duration_s": timeline.duration_s}, plan


def read_targets(
    path: str, plan: Plan, targets: list[int], threads: int = 0
) -> tuple[list[dict], np.ndarray | None, dict]:
    """(entries, (K, H, W, 3) uint8 frames or None, work): the frames at the ascending, distinct pts
    `targets` (all of plan.wanted's or one segment's), decoded the planned way, or in order from the first
    frame where a seek missed, by `threads` decoder threads (0: one per core).

    entries: one {"pts": target, "ordinal": the frame shown, "seconds": its time} per frame, in target
    order; a target past the last frame that decodes has none. work: frames_decoded, seeks, in_order (True
    when decoded from the start), decoded_size (the (width, height) the decoder gave before scaling).
    """
    timeline = plan.timeline

    def planned(container, stream, convert):
        return decode_planned(container, stream, timeline, targets, convert)

    def in_order(container, stream, convert):
        return decode_in_order(container, stream, timeline, targets, convert)

    try:
        taken, work = with_fresh_decoder(path, plan.stored_hw, plan.fit_hw, planned, threads)
    except SeekMissed:
        taken, work = with_fresh_decoder(path, plan.stored_hw, plan.fit_hw, in_order, threads)
    if not taken:
        return [], None, work
    order = sorted(taken)
    shown = [taken[pts][0] for pts in order]
    ordinals = np.minimum(np.searchsorted(timeline.pts, shown), len(timeline.pts) - 1)
    work["decoded_size"] = list(taken[order[-1]][2])
    frames = np.empty((len(order), *taken[order[-1]][1].shape), np.uint8)
    for row, pts in enumerate(order):
        frames[row] = taken.pop(pts)[1]  # popped: the frames are held once, not twice, at the peak
    entries = [
        {"pts": pts, "ordinal": int(ordinal), "seconds": float(seconds)}
        for pts, ordinal, seconds in zip(order, ordinals, timeline.seconds(shown))
    ]
    return entries, frames, work


def read_file(
    path: str, sampling: FrameSampling, max_seconds: float, temporal_patch: int, max_source_pixels: int
) -> tuple[dict, np.ndarray | None]:
    """(header, (N, H, W, 3) uint8 frames or None): one upload read whole in this process, as one reader
    reads it.

    header["status"]: "ok" (with shape, frame_indices, timestamps_s, total_frames, duration_s, and what
    decoding took: read_targets' work), or plan_file's other statuses.
    """
    header, plan = plan_file(path, sampling, max_seconds, temporal_patch, max_source_pixels)
    if plan is None:
        return header, None
    entries, frames, work = read_targets(path, plan, sorted(set(plan.wanted)))
    assembled = assemble(plan.wanted, [(entries, frames)]) if entries else None
    if assembled is None:
        return {"status": "unreadable"}, None
    frames, ordinals, seconds = assembled
    return {**header, "shape": list(frames.shape), "frame_indices": ordinals, "timestamps_s": seconds, **work}, frames


def timeline_message(timeline: Timeline) -> tuple[dict, bytes]:
    """The timeline as a JSON-ready dict and the bytes of its pts and keyframes (int64), for a reader that
    reads one segment of the same file (timeline_from_message is the inverse)."""
    keyframes = np.asarray(timeline.keyframes, dtype=np.int64)
    meta = {
        "frames": len(timeline.pts),
        "keyframes": len(keyframes),
        "time_base": [timeline.time_base.numerator, timeline.time_base.denominator],
        "end": int(timeline.end),
        "by_order": timeline.by_order,
    }
    return meta, np.ascontiguousarray(timeline.pts, dtype=np.int64).tobytes() + keyframes.tobytes()


def timeline_from_message(meta: dict, payload: bytes) -> Timeline:
    numbers = np.frombuffer(payload, np.int64)
    pts, keyframes = numbers[: meta["frames"]], numbers[meta["frames"] : meta["frames"] + meta["keyframes"]]
    return Timeline(pts, [int(key) for key in keyframes], Fraction(*meta["time_base"]), meta["end"], meta["by_order"])


def with_fresh_decoder(path: str, stored_hw: tuple[int, int], fit_hw: tuple[int, int], decode, threads: int = 0):
    """decode(container, stream, convert) on a freshly opened file, with `threads` decoder threads (0: one
    per core): its demuxer starts exactly at the first frame, where seeking back to it is not exact
    everywhere (MPEG-TS lands on a packet after the first keyframe), and a stream without times cannot seek
    at all."""
    with open_unprobed(path, decoding=True) as container:
        stream = video_stream(container)
        open_decoder(stream, stored_hw, fit_hw, threads)
        return decode(container, stream, rgb_converter(*fit_hw))


def open_unprobed(path: str, *, decoding: bool):
    """The file opened without decoding frames while probing it where that changes nothing, else in full.

    Opening a file, FFmpeg decodes a few frames to learn what the headers leave out (60 ms for 1080p
    H.264, at every open). For reading packets (decoding False), MP4/MOV and Matroska/WebM need none of
    it: their index holds every packet's time and their headers the frame size; other containers may
    interpolate packet times with what the probe learned (MPEG-TS, MPEG-PS). For decoding, the decoder
    starts from the probe's reorder delay, so only MP4/MOV (whose demuxer reads the delay from its index)
    and VP8, VP9 and AV1 in either (no reordering) skip the probe. tests/test_video_decoding.py checks both
    against full opens on every container and codec of its corpus.
    """
    container = open_without_video_probe(path)
    name = container.format.name
    stream = video_stream(container)
    if name in _INDEXED_FORMATS and (
        not decoding or name == _MP4 or (stream is not None and stream.codec_context.name in _UNREORDERED_CODECS)
    ):
        return container
    container.close()
    return av.open(path)


def video_stream(container):
    """The container's first video stream that is a video: an mp3's or m4a's cover art is a video stream of one
    picture marked as attached (FFmpeg's attached_pic disposition), and reads as a video of two copies of it
    lasting 11 microseconds; None when there is no other."""
    attached = av.stream.Disposition.attached_pic
    return next((stream for stream in container.streams.video if not stream.disposition & attached), None)


def open_without_video_probe(path: str):
    """av.open without the video frames FFmpeg decodes while probing (60 ms per open of 1080p H.264). The
    option reaches the probe's decoders only, not the streams' own, and audio decoders ignore it, so audio
    streams are still probed in full. Where video may skip its probe: open_unprobed."""
    return av.open(path, options={"skip_frame": "all"})


def read_timeline(container, stream) -> Timeline | None:
    """The stream's frames from one pass over its packets (no decoding); None when it has none.

    Packets FFmpeg marks as discarded (before an edit list's start) are not frames of the video. A
    packet's duration gives the last frame's end; where it is missing, the median frame interval.
    """
    pts, keyframes = array("q"), array("q")
    count, last_pts, last_duration, untimed = 0, None, 0, False
    for packet in container.demux(stream):
        if packet.size == 0 or packet.is_discard:
            continue
        count += 1
        if packet.pts is None:
            untimed = True
            continue
        pts.append(packet.pts)
        if packet.is_keyframe:
            keyframes.append(packet.pts)
        if last_pts is None or packet.pts > last_pts:
            last_pts, last_duration = packet.pts, packet.duration or 0
    rate = stream.guessed_rate or stream.average_rate  # a raw stream's average rate is FFmpeg's 25 fps guess
    if count == 0:
        return None
    if untimed:
        if not rate:
            return None
        return Timeline(np.arange(count, dtype=np.int64), [0], 1 / Fraction(rate), count, True)
    by_order = container.format.name == "avi"
    frames = np.unique(np.frombuffer(pts, dtype=np.int64))
    step = last_duration
    if step <= 0 and len(frames) > 1:
        step = int(np.median(np.diff(frames)))
    if step <= 0 and rate:
        step = max(1, round(1 / (Fraction(rate) * stream.time_base)))
    starts = sorted(set(keyframes)) or [int(frames[0])]  # no keyframe flags: start from the first frame
    return Timeline(frames, starts, stream.time_base, int(frames[-1]) + step, by_order)


def open_decoder(stream, stored_hw: tuple[int, int], fit_hw: tuple[int, int], threads: int = 0) -> None:
    """Open the stream's decoder with `threads` threads (0: one per core), and at a reduced size where the
    codec can and the sampled size allows. Opened here, before any skip_frame is set: libdav1d reads
    skip_frame only when opened, so opening it lazily under "NONREF" would lose every non-reference AV1
    frame for good. FFmpeg's decoders give the same pixels whatever the thread count."""
    context = stream.codec_context
    context.thread_type = "AUTO"  # frame and slice threads
    context.thread_count = threads
    if context.codec.name in _LOWRES_DECODERS:
        halvings = 0
        while (
            halvings < _MAX_LOWRES
            and stored_hw[0] >> (halvings + 1) >= fit_hw[0]
            and stored_hw[1] >> (halvings + 1) >= fit_hw[1]
        ):
            halvings += 1
        if halvings:
            context.options = {**(context.options or {}), "lowres": str(halvings)}
    context.open(strict=False)


def decode_planned(container, stream, timeline: Timeline, wanted: list[int], convert) -> tuple[dict, dict]:
    """({pts asked: (pts shown, frame, decoded (width, height))} for the frames at `wanted` pts,
    {"frames_decoded": frames the decoder gave, "seeks": seeks made}).

    The container must be freshly opened (at the first frame). Before each sampled frame: seek to its
    keyframe when that keyframe lies SEEK_AHEAD_FRAMES or more past the last decoded frame, else decode
    on. A seek that lands past its target (a demuxer whose index disagrees with the packets) is retried
    from up to 4 earlier keyframes, then raises SeekMissed, as do a seek after which nothing decodes, a
    frame whose pts the timeline does not hold (MPEG-PS interpolates missing times differently after a
    seek), and sampled frames still missing at the end after a seek; a target no frame matches takes the
    next frame shown.
    """
    targets = sorted(set(wanted))
    keyframes = timeline.keyframes
    # Frames known by their place in the output cannot skip any: a skipped frame would shift the count.
    skippable = None if timeline.by_order else set(targets)
    taken: dict[int, tuple] = {}
    work = {"frames_decoded": 0, "seeks": 0, "in_order": False}
    # position: pts of the last frame decoded, None right after a seek; at the start, just before the first.
    # counted: the ordinal the next frame out has, when frames are known by their place.
    frames = _frames_from_here(container, stream, skippable)
    index, position, back, counted = 0, int(timeline.pts[0]) - 1, 0, 0
    while index < len(targets):
        # A target before every keyframe (leading frames of an open GOP) is decodable only from the start.
        key_index = bisect_right(keyframes, targets[index]) - 1 - back
        if back and (key_index < 0 or back > 4):
            raise SeekMissed(f"no keyframe at or before pts {targets[index]} decodes to it")
        key = keyframes[max(0, key_index)]
        if frames is None or _seek_pays(timeline, position, key):
            container.seek(key, stream=stream, backward=True)
            frames, position = _frames_from_here(container, stream, skippable), None
            counted = int(np.searchsorted(timeline.pts, key))
            work["seeks"] += 1
        for frame in frames:
            work["frames_decoded"] += 1
            if timeline.by_order:
                shown, counted = int(timeline.pts[min(counted, len(timeline.pts) - 1)]), counted + 1
            elif frame.pts is None:  # the packets had times and the frames lost them: nothing to match
                raise ValueError("a decoded frame has no timestamp")
            else:
                shown = frame.pts
            if not _in_timeline(timeline, shown):
                raise SeekMissed(f"a frame decoded at pts {shown}, a time the packets did not give")
            if position is None and shown > targets[index]:
                back, frames = back + 1, None
                break
            position = shown
            while index < len(targets) and shown >= targets[index]:
                taken[targets[index]] = (shown, convert(frame), (frame.width, frame.height))
                index, back = index + 1, 0
            if index == len(targets):
                break
            next_key = keyframes[max(0, bisect_right(keyframes, targets[index]) - 1)]
            if _seek_pays(timeline, position, next_key):
                break
        else:  # the end of the file
            if position is None or work["seeks"]:
                raise SeekMissed(f"sampled frames from pts {targets[index]} on never came after seeking")
            break
    return taken, work


def decode_in_order(container, stream, timeline: Timeline, wanted: list[int], convert) -> tuple[dict, dict]:
    """decode_planned's answer from decoding every frame from the start (a freshly opened container),
    nothing skipped or sought: where seeking missed, and as the reference the planned decode is tested
    against."""
    targets = sorted(set(wanted))
    taken: dict[int, tuple] = {}
    index, ordinal = 0, 0
    for ordinal, frame in enumerate(_frames_from_here(container, stream, None), start=1):
        shown = int(timeline.pts[min(ordinal - 1, len(timeline.pts) - 1)]) if timeline.by_order else frame.pts
        while index < len(targets) and shown >= targets[index]:
            taken[targets[index]] = (shown, convert(frame), (frame.width, frame.height))
            index += 1
        if index == len(targets):
            break
    return taken, {"frames_decoded": ordinal, "seeks": 0, "in_order": True}


def decode_everything(path: str, frame_indices: list[int], fit_hw: tuple[int, int]) -> tuple[np.ndarray, dict]:
    """((N, H, W, 3) uint8 frames, work) at the given frame ordinals, decoded one after another from the
    first with nothing skipped or sought, scaled to fit_hw as stored: what the planned decode must give
    (tests/test_video_decoding.py) and what it saves (bench/decoding.py). The file is opened in full, probe
    and all, both times: the reference takes none of the planned decode's shortcuts."""
    with av.open(path) as container:
        stream = video_stream(container)
        timeline = read_timeline(container, stream)
        stored_hw = (stream.codec_context.height, stream.codec_context.width)
    wanted = [int(timeline.pts[i]) for i in frame_indices]
    with av.open(path) as container:
        stream = video_stream(container)
        open_decoder(stream, stored_hw, fit_hw)
        taken, work = decode_in_order(container, stream, timeline, wanted, rgb_converter(*fit_hw))
    return np.stack([taken[pts][1] for pts in wanted]), work


def _in_timeline(timeline: Timeline, pts: int) -> bool:
    at = int(np.searchsorted(timeline.pts, pts))
    return at < len(timeline.pts) and int(timeline.pts[at]) == pts


def _seek_pays(timeline: Timeline, position: int | None, keyframe: int) -> bool:
    """Whether seeking to `keyframe` beats decoding on from the frame at `position` (None: just sought)."""
    if position is None or keyframe <= position:
        return False
    between = np.searchsorted(timeline.pts, keyframe) - np.searchsorted(timeline.pts, position, side="right")
    return int(between) >= SEEK_AHEAD_FRAMES


def _frames_from_here(container, stream, wanted: set[int] | None):
    """Decoded frames from the demuxer's position on, in presentation order. Frames no other frame refers
    to are skipped unless their pts is in `wanted` (None: nothing skipped). A packet the decoder rejects
    is passed over: one damaged frame should not lose a long video."""
    context = stream.codec_context
    for packet in container.demux(stream):
        if packet.size == 0:  # the demuxer's end: drain the frames still in the decoder
            context.skip_frame = "DEFAULT"
            yield from context.decode(None)
            return
        if wanted is not None:
            context.skip_frame = "DEFAULT" if packet.pts in wanted else "NONREF"
        try:
            decoded = context.decode(packet)
        except av.InvalidDataError:
            continue
        yield from decoded


def rgb_converter(fit_h: int, fit_w: int):
    """frame -> (H, W, 3) uint8 RGB scaled to fit_h x fit_w as stored, then turned upright by the display
    matrix (a portrait phone clip is stored landscape with a 90 or 270 degree rotation)."""

    def convert(frame) -> np.ndarray:
        rgb = frame.to_ndarray(format="rgb24", width=fit_w, height=fit_h)
        quarter_turns = round((frame.rotation or 0) / 90) % 4  # counter-clockwise, as np.rot90 turns
        return np.rot90(rgb, quarter_turns) if quarter_turns else rgb

    return convert
