"""A live stream (RTSP, RTMP, SRT, HLS, MPEG-TS over HTTP) read with PyAV in a reader process
(engine/reading/reader_process.py's "stream" op): one connection, its frames sampled by capture time as
they are decoded, resized as uploads are, each sent on as soon as it is taken.

Capture times are the stream's presentation times in seconds from its first frame. A stream whose times
jump back (a server restarting its clock mid-stream) is rebased so they keep increasing. FFmpeg may
only use the protocols the URL's scheme needs (`protocol_whitelist`): an HLS playlist cannot make it open a
local file.
"""

from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import av
import numpy as np

from ..frame_sampling import fit_pixels, next_due_s
from .pyav_video import rgb_converter, video_stream

# What FFmpeg may open for each scheme (an HLS playlist's segments come through http(s) and crypto).
PROTOCOLS = {
    "rtsp": "rtsp,rtp,udp,tcp",
    "rtsps": "rtsp,rtp,udp,tcp,tls",
    "rtmp": "rtmp,tcp",
    "rtmps": "rtmps,rtmp,tcp,tls",
    "srt": "srt,udp",
    "http": "http,tcp,hls,crypto",
    "https": "https,http,tcp,tls,hls,crypto",
}
# A recording played as live (LiveStream.of_file) is the one file: URL; no scheme a person may name reads files.
FILE_PROTOCOLS = "file"
# A time going back by more than this is a new clock (the server restarted its stream), not jitter.
CLOCK_RESET_S = 1.0


def open_options(url: str) -> dict:
    """FFmpeg's options for opening `url`: its scheme's protocols only, RTSP over TCP (UDP loses packets
    through NATs and on busy hosts)."""
    scheme = urlsplit(url).scheme.lower()
    options = {"protocol_whitelist": FILE_PROTOCOLS if scheme == "file" else PROTOCOLS[scheme]}
    if scheme.startswith("rtsp"):
        options["rtsp_transport"] = "tcp"
    return options


def open_failure(error: Exception) -> str:
    """Why opening a stream failed, as the reader's "reason": "unsupported" (this FFmpeg lacks the
    protocol), "refused", "timed_out", "not_found" or "unreadable"."""
    if isinstance(error, av.ProtocolNotFoundError):
        return "unsupported"
    if isinstance(error, ConnectionRefusedError):
        return "refused"
    if isinstance(error, (TimeoutError, av.ExitError)):
        return "timed_out"
    if isinstance(error, (FileNotFoundError, av.HTTPNotFoundError)):
        return "not_found"
    return "unreadable"


def stream_frames(
    url: str,
    fps: float,
    max_pixels_per_frame: int,
    max_source_pixels: int,
    timeout_s: float,
    send: Callable[[dict, np.ndarray], None],
    threads: int = 0,
) -> dict:
    """Read `url` until it ends, calling send({"status": "frame", "t_s", "shape"}, (H, W, 3) uint8 RGB) for
    each frame taken at `fps`; returns the last header: {"status": "ended", "frames"} when the stream ends
    or breaks off after it opened, {"status": "open_failed", "reason"}, {"status": "unreadable"} (no video
    stream), or {"status": "too_many_pixels", "size"}. MemoryError (FFmpeg's too) is raised: the reader's
    memory cap answers it.

    timeout_s: how long opening, and then each read, may wait for the server (FFmpeg's own timeouts; the
    engine also kills a reader that sends nothing for longer).
    """
    try:
        container = av.open(url, options=open_options(url), timeout=(timeout_s, timeout_s))
    except MemoryError:  # FFmpeg's ENOMEM too (av.error.MemoryError): the memory cap, not the stream
        raise
    except (av.FFmpegError, OSError) as error:
        return {"status": "open_failed", "reason": open_failure(error)}
    sent = 0
    with container:
        stream = video_stream(container)
        if stream is None:
            return {"status": "unreadable"}
        stream.codec_context.thread_type = "AUTO"
        stream.codec_context.thread_count = threads
        convert, stored_hw = None, None
        first_s, shift_s, last_s, due_s = None, 0.0, None, 0.0
        for frame in _decoded(container, stream):
            if frame.time is None:
                continue
            if stored_hw != (frame.height, frame.width):  # the first frame, or the stream changed size
                stored_hw = (frame.height, frame.width)
                if frame.height * frame.width > max_source_pixels:
                    return {"status": "too_many_pixels", "size": [frame.width, frame.height]}
                convert = rgb_converter(*fit_pixels(*stored_hw, max_pixels_per_frame))
            first_s = frame.time if first_s is None else first_s
            t_s = frame.time - first_s + shift_s
            if last_s is not None and t_s < last_s - CLOCK_RESET_S:
                shift_s += last_s - t_s  # a new clock: carry on from the last time seen
                t_s = last_s
            last_s = max(t_s, last_s if last_s is not None else t_s)
            if t_s < due_s:
                continue
            rgb = convert(frame)
            send({"status": "frame", "t_s": t_s, "shape": list(rgb.shape)}, rgb)
            sent += 1
            due_s = next_due_s(t_s, fps)
    return {"status": "ended", "frames": sent}


def _decoded(container, stream) -> Iterator[av.VideoFrame]:
    """The stream's frames as they are decoded, to its end or until the connection breaks off (PyAV's own
    errors, the network's among them; a pipe the engine closed is not one): then the frames the decoder still
    holds (a frame-threaded decoder holds one per thread), which a clean end would have flushed too."""
    try:
        yield from container.decode(stream)
    except MemoryError:
        raise
    except av.FFmpegError:
        try:
            for frame in stream.codec_context.decode(None):
                frame.time_base = stream.time_base  # the codec's own frames carry none: their times would be NaN
                yield frame
        except MemoryError:
            raise
        except av.FFmpegError:
            pass
