"""How the child decodes (engine/reading/decoders/pyav_video.py): seeking to keyframes, skipping frames nothing refers
to, decoding at a reduced size. Each shortcut must give the frames decoding everything from the start gives,
to the bit, and must actually save work. Run in this process (no child) on files made with PyAV.
"""

from fractions import Fraction

import av
import numpy as np
import pytest

from engine.config import FrameSampling
from engine.reading.decoders.pyav_video import (
    decode_everything,
    decode_planned,
    open_unprobed,
    plan_file,
    read_file,
    read_targets,
    read_timeline,
    with_fresh_decoder,
)
from engine.reading.video import read_video
from test_video_formats import CONSTANT_8FPS, CORPUS, picture, write_video

FRAME_SAMPLING = FrameSampling(fps=2.0, max_frames=16, max_pixels_per_frame=96 * 72)
SIX_SECONDS = [Fraction(i, 30) for i in range(180)]  # 30 fps
GOP = {"g": "45", "keyint_min": "45"}  # a keyframe every 1.5 s: 4 of them, 12 samples


def read(path, sampling=FRAME_SAMPLING) -> tuple[dict, np.ndarray]:
    header, frames = read_file(str(path), sampling, max_seconds=600.0, temporal_patch=2, max_source_pixels=10**8)
    assert header["status"] == "ok", header
    return header, frames


# (name, container, codec, encoder options): long GOPs with B-frames (H.264, HEVC), hidden frames (VP9),
# libdav1d (AV1, which reads skip_frame only when opened), a demuxer that seeks by bisection (MPEG-TS).
LONG_GOP = [
    ("h264.mp4", "mp4", "libx264", {**GOP, "sc_threshold": "0", "bf": "3", "preset": "fast"}),
    ("h264.ts", "mpegts", "libx264", {**GOP, "sc_threshold": "0", "bf": "3", "preset": "fast"}),
    ("hevc.mkv", "matroska", "libx265", {"x265-params": "keyint=45:min-keyint=45:scenecut=0:bframes=4:log-level=none"}),
    ("vp9.webm", "webm", "libvpx-vp9", {**GOP, "deadline": "realtime", "cpu-used": "8"}),
    ("av1.mp4", "mp4", "libsvtav1", {"g": "45", "preset": "10", "crf": "20"}),
    # AVI keeps no presentation times: frames are counted from the keyframe sought, nothing skipped.
    ("h264.avi", "avi", "libx264", {**GOP, "sc_threshold": "0", "bf": "3", "preset": "fast"}),
]
INTENDED = [int(i) for i in np.linspace(0, 179, 12).round()]  # 12 times evenly spaced over 180 frames


@pytest.mark.parametrize("name, container_format, codec, options", LONG_GOP, ids=[row[0] for row in LONG_GOP])
def test_planned_decoding_gives_the_frames_decoding_everything_gives(tmp_path, name, container_format, codec, options):
    path = write_video(tmp_path / name, container_format, codec, SIX_SECONDS, options=options)
    header, frames = read(path)
    assert header["frame_indices"] == INTENDED  # each sampled frame itself, none a neighbour standing in
    reference, work = decode_everything(str(path), INTENDED, frames.shape[1:3])
    assert frames.shape == reference.shape == (12, 72, 96, 3)
    assert np.array_equal(frames, reference), np.abs(frames.astype(int) - reference.astype(int)).max()
    assert header["timestamps_s"] == pytest.approx([i / 30 for i in header["frame_indices"]], abs=1e-3)
    assert not header["in_order"]
    # Less decoded than everything up to the last sample: the skips and seeks did something.
    assert header["frames_decoded"] < work["frames_decoded"], (header, work)


@pytest.mark.parametrize("name, container_format, codec, options", LONG_GOP[:3], ids=[row[0] for row in LONG_GOP[:3]])
def test_the_decoder_thread_count_changes_no_pixel(tmp_path, name, container_format, codec, options):
    """The pool gives readers fewer decoder threads when they share the cores (engine/reading/pool.py): one
    thread, frame threads and the default must give the same frames."""
    path = write_video(tmp_path / name, container_format, codec, SIX_SECONDS, options=options)
    _, plan = plan_file(str(path), FRAME_SAMPLING, 600.0, 2, 10**8)
    targets = sorted(set(plan.wanted))
    entries, frames, _ = read_targets(str(path), plan, targets, threads=0)
    for threads in (1, 3):
        other_entries, other_frames, _ = read_targets(str(path), plan, targets, threads=threads)
        assert other_entries == entries
        assert np.array_equal(other_frames, frames), threads


@pytest.mark.parametrize("name, container_format, codec, extra", CORPUS, ids=[row[0] for row in CORPUS])
def test_a_file_opened_without_probing_reads_as_after_a_full_open(tmp_path, name, container_format, codec, extra):
    """open_unprobed skips decoding frames while probing where it can: the frame size, every frame's time
    and keyframe, and the decoded frames (read_targets, planned) must come out as after full opens
    (decode_everything opens in full; LONG_GOP's files are checked against it above)."""
    path = write_video(tmp_path / name, container_format, codec, CONSTANT_8FPS, **extra)

    def described(container):
        stream = container.streams.video[0]
        timeline = read_timeline(container, stream)
        return (
            container.format.name,
            stream.codec_context.width,
            stream.codec_context.height,
            timeline.pts.tolist(),
            timeline.keyframes,
            timeline.end,
            timeline.time_base,
            timeline.by_order,
        )

    with open_unprobed(str(path), decoding=False) as quick, av.open(str(path)) as full:
        assert described(quick) == described(full)
    header, frames = read(path)
    reference, _ = decode_everything(str(path), header["frame_indices"], frames.shape[1:3])
    assert np.array_equal(frames, reference)


def test_program_stream_times_after_a_seek_disagree_so_it_is_decoded_from_the_start(tmp_path):
    """MPEG-PS stamps some packets and FFmpeg fills in the rest, differently after a seek than from the
    start: frames come out at times the timeline does not hold, and the decode starts over in order."""
    path = write_video(tmp_path / "mpeg2.mpg", "mpeg", "mpeg2video", SIX_SECONDS, options={"g": "15", "bf": "2"})
    header, frames = read(path)
    assert header["in_order"] and header["frame_indices"] == INTENDED
    assert np.array_equal(frames, decode_everything(str(path), INTENDED, frames.shape[1:3])[0])


def test_av1_frames_nothing_refers_to_still_decode_when_sampled(tmp_path):
    """libdav1d reads skip_frame once, when opened: opened lazily at a packet skipped as "NONREF", it would
    drop every non-reference frame for good, sampled or not. Samples that leave out the first frame."""
    path = write_video(tmp_path / "av1.mp4", "mp4", "libsvtav1", SIX_SECONDS, options={"g": "45", "preset": "10"})
    with av.open(str(path)) as container:
        timeline = read_timeline(container, container.streams.video[0])
    ordinals = list(range(5, 180, 7))
    wanted = [int(timeline.pts[i]) for i in ordinals]

    def planned(container, stream, convert):
        return decode_planned(container, stream, timeline, wanted, convert)

    taken, _ = with_fresh_decoder(str(path), (120, 160), (72, 96), planned)  # write_video's size
    everything, _ = decode_everything(str(path), ordinals, (72, 96))
    assert [taken[pts][0] for pts in wanted] == wanted  # each sampled frame itself, none a substitute
    assert np.array_equal(np.stack([taken[pts][1] for pts in wanted]), everything)


def test_h264_seeks_and_skips_non_reference_frames(tmp_path):
    """8 samples over 4 GOPs of H.264 with B-frames: a seek into each later GOP, and about half the
    frames left undecoded (the non-reference B-frames between samples, the GOP heads seeking skips)."""
    options = {"g": "90", "keyint_min": "90", "sc_threshold": "0", "bf": "3", "preset": "fast"}
    path = write_video(
        tmp_path / "long_gop.mp4", "mp4", "libx264", [Fraction(i, 30) for i in range(360)], options=options
    )
    header, _ = read(path, FrameSampling(fps=1.0, max_frames=8, max_pixels_per_frame=96 * 72))
    assert header["seeks"] == 3  # into GOPs 2, 3 and 4; the first is decoded from the start
    assert header["frames_decoded"] < 360 * 0.6, header["frames_decoded"]


def test_samples_close_together_are_decoded_through(tmp_path):
    """Samples 4 frames apart in one GOP: no seek (each would restart at the only keyframe)."""
    path = write_video(tmp_path / "one_gop.mp4", "mp4", "libx264", SIX_SECONDS, options={"g": "250", "bf": "3"})
    header, _ = read(path, FrameSampling(fps=8.0, max_frames=64, max_pixels_per_frame=96 * 72))
    assert header["seeks"] == 0 and len(header["frame_indices"]) == 48
    assert header["frames_decoded"] < 180


@pytest.mark.parametrize("codec, pix_fmt", [("mpeg4", "yuv420p"), ("mjpeg", "yuvj420p")])
def test_decodes_at_a_reduced_size_where_the_codec_can(tmp_path, codec, pix_fmt):
    """640x480 MPEG-4 part 2 or MJPEG sampled at 160x120: the decoder itself gives 160x120 (lowres 2),
    no less faithful to the source (averaged over 4x4 pixels) than decoding at full size then scaling."""
    times = [Fraction(i, 8) for i in range(16)]
    path = write_video(
        tmp_path / f"{codec}.avi", "avi", codec, times, size=(640, 480), pix_fmt=pix_fmt, options={"qscale": "2"}
    )
    header, frames = read(path, FrameSampling(fps=4.0, max_frames=32, max_pixels_per_frame=160 * 120))
    assert header["decoded_size"] == [160, 120] and frames.shape == (8, 120, 160, 3)
    with av.open(str(path)) as container:  # the decoder's own defaults: full size
        decoded = list(container.decode(video=0))
    full = np.stack([decoded[i].to_ndarray(format="rgb24", width=160, height=120) for i in header["frame_indices"]])
    source = np.stack(
        [
            picture(float(times[i]), 15 / 8, size=(640, 480)).reshape(120, 4, 160, 4, 3).mean(axis=(1, 3))
            for i in header["frame_indices"]
        ]
    )
    reduced_error, full_error = (float(np.abs(f.astype(np.float64) - source).mean()) for f in (frames, full))
    assert reduced_error < full_error + 0.5 and reduced_error < 7, (reduced_error, full_error)


def test_h264_is_decoded_at_full_size_then_scaled(tmp_path):
    """H.264 has no reduced-size decoding: the decoder gives the stored size."""
    path = write_video(tmp_path / "h264.mp4", "mp4", "libx264", [Fraction(i, 8) for i in range(16)], size=(320, 240))
    header, frames = read(path, FrameSampling(fps=4.0, max_frames=32, max_pixels_per_frame=80 * 60))
    assert header["decoded_size"] == [320, 240] and frames.shape == (8, 60, 80, 3)


def test_raw_stream_without_times_is_matched_by_order(tmp_path):
    """An Annex-B .h264 file has no timestamps: frames are counted at the rate its headers give."""
    path = write_video(tmp_path / "raw.h264", "h264", "libx264", [Fraction(i, 8) for i in range(16)])
    video = read_video(path, FrameSampling(fps=4.0), max_seconds=60, max_bytes=10**8, timeout_s=60)
    assert video.total_frames == 16 and video.duration_s == pytest.approx(2.0)
    assert video.frame_indices == [0, 2, 4, 6, 9, 11, 13, 15]
    assert video.timestamps_s == pytest.approx([i / 8 for i in video.frame_indices])
