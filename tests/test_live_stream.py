"""Stream URLs read as live feeds (engine/reading/live_stream.py) from a stream Debian's ffmpeg serves on the
loopback, the checks a URL passes before the server connects (ui/live_urls.py), and the Live tab's Stream
URL source (ui/live_tab.py)."""

import asyncio
import shutil
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import av
import gradio as gr
import numpy as np
import pytest

from app_harness import SubmitSpy
from assets.shapes import QUESTIONS, shape_clip, write_shape_clip
from engine import Engine
from engine.config import EngineConfig, FrameSampling
from engine.errors import InputError
from engine.reading.decoders.pyav_stream import PROTOCOLS, stream_frames
from engine.reading.frame_sampling import next_due_s
from engine.reading.live_stream import (
    NOT_A_STREAM_URL,
    STREAM_ENDED,
    STREAM_SCHEMES,
    LiveFrame,
    LiveStream,
    check_stream_url,
)
from live_helpers import replayed_answer
from ui.live_feeds import LiveFeeds
from ui.live_tab import StreamWatch
from ui.live_urls import NO_LIVE_URLS, checked_stream_url
from ui.video_inputs import VideoPolicy

FFMPEG = shutil.which("ffmpeg")
SEED = 1_000_003  # a held-out shapes clip: 8 s at 8 fps, 64x64
SAMPLING = FrameSampling(fps=2.0, max_frames=32, max_pixels_per_frame=32 * 32)
CAPS = dict(timeout_s=5.0, memory_bytes=2 << 30, max_source_pixels=4096 * 2160, max_seconds=3600.0)

needs_ffmpeg = pytest.mark.skipif(FFMPEG is None, reason="needs Debian's ffmpeg (apt-get install ffmpeg)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def shapes_file(tmp_path_factory) -> Path:
    return write_shape_clip(tmp_path_factory.mktemp("live") / "shapes.mp4", SEED)


def listening(port: int) -> bool:
    """Whether a socket listens on the loopback's `port`, read from /proc/net/tcp: connecting to find out
    would take the one client an ffmpeg server with -listen 1 serves."""
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return any(row.split()[1].endswith(f":{port:04X}") and row.split()[3] == "0A" for row in rows)  # 0A: LISTEN


def serve(clip: Path, port: int, *options: str) -> subprocess.Popen:
    """ffmpeg serving `clip` as MPEG-TS over HTTP on the loopback to one client, at its own pace (-re) unless
    `options` say otherwise; returned once it listens."""
    server = subprocess.Popen(
        [
            FFMPEG,
            "-loglevel",
            "error",
            *(options or ("-re",)),
            "-i",
            str(clip),
            "-c",
            "copy",
            "-f",
            "mpegts",
            "-listen",
            "1",
            f"http://127.0.0.1:{port}/live.ts",
        ]
    )
    deadline = time.monotonic() + 30
    while not listening(port) and server.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return server


def read_all(stream: LiveStream) -> list:
    with stream:
        return list(stream)


@needs_ffmpeg
def test_a_stream_is_read_by_capture_time_and_resized_as_uploads_are(shapes_file):
    port = free_port()
    server = serve(shapes_file, port)
    try:
        items = read_all(LiveStream(f"http://127.0.0.1:{port}/live.ts", SAMPLING, reconnects=0, **CAPS))
    finally:
        server.kill()
        server.wait()
    frames = [item for item in items if isinstance(item, LiveFrame)]
    # 8 s at 2 fps: one frame every half second from the first, at the stream's own times
    assert [frame.t_s for frame in frames] == pytest.approx([0.5 * i for i in range(16)], abs=1e-6)
    assert all(frame.frame.shape == (32, 32, 3) and frame.frame.dtype == np.uint8 for frame in frames)
    # the pixels are the clip's at those times: frame 4 * i of the 8 fps clip, halved in each side
    truth = shape_clip(SEED).frames[::4, ::2, ::2].astype(int)
    seen = np.stack([frame.frame for frame in frames]).astype(int)
    assert np.abs(seen.mean(axis=(1, 2)) - truth.mean(axis=(1, 2))).max() < 6
    # the stream ended with the clip, and a feed that does not reconnect says so in a sentence
    assert items[-1] == STREAM_ENDED and sum(isinstance(item, str) for item in items) == 1


@needs_ffmpeg
def test_a_stream_that_stops_midway_gets_a_status_line_and_the_feed_goes_on(shapes_file, tmp_path):
    """The server stops after 3 s and comes back: the feed reconnects with a status line, and its times keep
    increasing across the gap; once the server is gone for good, one sentence ends it."""
    first = tmp_path / "first.ts"
    subprocess.run(
        [FFMPEG, "-loglevel", "error", "-i", str(shapes_file), "-t", "3", "-c", "copy", str(first)], check=True
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}/live.ts"
    server = serve(first, port)
    stream = LiveStream(url, SAMPLING, reconnects=2, retry_s=0.5, **CAPS)
    items, restarted = [], False
    try:
        for item in stream:
            items.append(item)
            if isinstance(item, str) and not restarted:
                server.wait()
                server, restarted = serve(shapes_file, port), True
    finally:
        stream.close()
        server.kill()
        server.wait()
    lines = [item for item in items if isinstance(item, str)]
    assert lines[0] == "The stream dropped; reconnecting (try 1 of 2)."
    assert lines[-1] == "The stream dropped and could not be reached again in 2 tries."
    times = [item.t_s for item in items if isinstance(item, LiveFrame)]
    assert len(times) > 6 + 12 and all(later > earlier for earlier, later in zip(times, times[1:]))
    before = items.index(lines[0])
    assert times[before] >= times[before - 1] + 0.5  # the second connection starts after the first's last frame


@needs_ffmpeg
def test_a_stream_that_stalls_is_cut_off_by_its_timeout(shapes_file):
    """A server that accepts and then sends nothing: the first connection ends in a sentence after the
    timeout, not a hang."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        started = time.monotonic()
        items = read_all(
            LiveStream(f"http://127.0.0.1:{port}/live.ts", SAMPLING, reconnects=0, **{**CAPS, "timeout_s": 1.0})
        )
    assert items == ["The stream at 127.0.0.1 did not answer within 1 second."]
    assert time.monotonic() - started < 120  # a hang, not a speed: the sentence says the 1 s timeout fired


def test_a_refused_connection_is_one_sentence():
    port = free_port()  # nothing listens there
    items = read_all(LiveStream(f"rtsp://127.0.0.1:{port}/cam", SAMPLING, reconnects=3, **CAPS))
    assert items == ["The stream at 127.0.0.1 refused the connection."]


def test_a_scheme_this_ffmpeg_lacks_is_one_sentence():
    """PyAV's wheel has no libsrt: srt:// is a scheme a feed reads, but not on this build."""
    items = read_all(LiveStream("srt://127.0.0.1:9000", SAMPLING, **CAPS))
    assert items == ["This server cannot read srt:// streams."]


@pytest.mark.parametrize(
    "url",
    [
        "",
        "   ",
        "camera",
        "ftp://example.com/live",
        "file:///etc/passwd",
        "rtsp://",
        "rtsp:///path",
        "http://exa mple.com/x.ts",
        "rtsp://host:port/x",
        None,
        7,
        "data:video/mp4;base64,AAAA",
    ],
)
def test_a_malformed_url_or_unsupported_scheme_is_one_sentence(url):
    with pytest.raises(InputError) as refused:
        check_stream_url(url)
    assert str(refused.value) == NOT_A_STREAM_URL


def test_every_scheme_a_feed_takes_has_protocols_for_ffmpeg():
    assert set(STREAM_SCHEMES) == set(PROTOCOLS)
    assert all("file" not in PROTOCOLS[scheme].split(",") for scheme in PROTOCOLS)


def test_sampling_by_capture_time_takes_the_first_frame_of_each_slot():
    times = np.arange(0, 4, 1 / 30)  # a 30 fps feed, sampled at 2 fps
    taken, due = [], 0.0
    for t_s in times:
        if t_s >= due - 1e-9:
            taken.append(t_s)
            due = next_due_s(t_s, 2.0)
    assert taken == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5])
    assert next_due_s(0.74, 2.0) == 1.0  # a late frame does not push the next one later
    assert next_due_s(3.0, 0.5) == 4.0


def policy(tmp_path, *, live_urls: bool, anywhere: bool = False) -> VideoPolicy:
    extra = {"address_allowed": lambda _: True} if anywhere else {}
    return VideoPolicy(tmp_path, 1 << 20, live_urls=live_urls, **extra)


def test_stream_urls_are_refused_unless_the_operator_turned_them_on(tmp_path):
    with pytest.raises(InputError) as refused:
        asyncio.run(checked_stream_url("rtsp://203.0.113.7/cam", policy(tmp_path, live_urls=False)))
    assert str(refused.value) == NO_LIVE_URLS


@pytest.mark.parametrize("host", ["127.0.0.1", "10.1.2.3", "192.168.0.9", "169.254.169.254", "localhost", "[::1]"])
def test_with_live_urls_on_a_private_address_is_refused(tmp_path, host):
    with pytest.raises(InputError) as refused:
        asyncio.run(checked_stream_url(f"rtsp://{host}:8554/cam", policy(tmp_path, live_urls=True)))
    assert str(refused.value) == "This server only reads streams from public internet addresses."


def test_with_live_urls_on_a_malformed_url_is_one_sentence(tmp_path):
    with pytest.raises(InputError) as refused:
        asyncio.run(checked_stream_url("gopher://example.com/x", policy(tmp_path, live_urls=True)))
    assert str(refused.value) == NOT_A_STREAM_URL


@needs_ffmpeg
def test_with_live_urls_on_and_the_loopback_allowed_the_stream_is_read(tmp_path, shapes_file):
    """The test's own allowance (address_allowed) lets the loopback through, as the fetch tests do."""
    port = free_port()
    server = serve(shapes_file, port)
    try:
        url = asyncio.run(
            checked_stream_url(f" http://127.0.0.1:{port}/live.ts ", policy(tmp_path, live_urls=True, anywhere=True))
        )
        with LiveStream(url, SAMPLING, reconnects=0, **CAPS) as stream:
            first = next(iter(stream))
    finally:
        server.kill()
        server.wait()
    assert isinstance(first, LiveFrame) and first.t_s == 0.0 and first.frame.shape == (32, 32, 3)


async def statuses_until(updates, last_wanted: str) -> list[str]:
    """The Watch handler's status lines (the first of the tab's outputs) up to the first that holds `last_wanted`;
    then the handler is closed, as Gradio closes it on Stop."""
    seen = []
    try:
        async for status, *_ in updates:
            seen.append(status)
            if last_wanted in status:
                break
    finally:
        await updates.aclose()
    return seen


async def answer_of(answering) -> str:
    """The Ask handler's last update: the answer and its TTFT line."""
    return [update async for update in answering][-1]


@pytest.fixture(scope="module")
def trained(tiny_cache_dir):
    with Engine(EngineConfig(model="tiny-trained", device="cpu", cache_dir=tiny_cache_dir)) as engine:
        yield engine


@needs_ffmpeg
def test_the_live_tab_answers_about_a_stream_url_and_stop_ends_it(tmp_path, shapes_file, trained):
    """Watch feeds the tab's live session the stream's frames (the engine's sampling: 64x64, 2 fps); asked while
    the stream goes on, the tab shows the answer the engine gives for the frames the session had been given (how
    many depends on how busy the machine is: they are replayed into a fresh session); the stream's end is a status
    line."""
    port = free_port()
    server = serve(shapes_file, port)
    spy = SubmitSpy(trained, record_live=True)
    feeds = LiveFeeds(spy)
    tab = gr.Request(session_hash="tab")
    watch = StreamWatch(
        feeds,
        policy(tmp_path, live_urls=True, anywhere=True),
        trained.default_frame_sampling,
        EngineConfig(read_timeout_s=5.0),
    )

    async def watch_and_ask() -> tuple[list[str], str]:
        """Ask once 4 frames are in, the stream going on meanwhile (its reader reads in the background); then the
        status lines until the server stops, and Stop."""
        seen, answer = [], None
        watching = watch.watch(f"http://127.0.0.1:{port}/live.ts", 0.5, tab)
        try:
            async for status, *_ in watching:
                seen.append(status)
                if answer is None and int(status.split()[0]) >= 4:
                    answer = await answer_of(feeds.ask(QUESTIONS["colour"], tab))
                if "reconnecting" in status:
                    break
        finally:
            await watching.aclose()
        return seen, answer

    try:
        seen, answer = asyncio.run(watch_and_ask())
    finally:
        server.kill()
        server.wait()
    (recorded,) = spy.live_sessions
    assert answer.startswith(f"{replayed_answer(trained, recorded).text}\n\n<small>TTFT "), answer
    assert seen[-1].endswith("The stream dropped; reconnecting (try 1 of 3).") and " · 64×64 · " in seen[-1]
    (feed,) = feeds.open_feeds()
    stats = feed.live.stats()  # one session took every frame the feed took, at the tab's rate
    assert stats["pruning_rate"] == 0.5 and stats["frames_received"] == feed.frames >= 12
    feeds.close_session(tab)
    assert feed.closed and feed.live is None


def test_the_live_tab_refuses_stream_urls_unless_they_are_on(tmp_path):
    watch = StreamWatch(None, policy(tmp_path, live_urls=False), SAMPLING, EngineConfig())
    with pytest.raises(gr.Error) as refused:
        asyncio.run(statuses_until(watch.watch("rtsp://203.0.113.7/cam", 0.5, gr.Request(session_hash="tab")), ""))
    assert refused.value.message == NO_LIVE_URLS


@needs_ffmpeg
def test_a_consumer_that_falls_behind_loses_the_oldest_frames_not_memory(shapes_file):
    """Served as fast as ffmpeg can (no -re), the whole clip arrives while nothing is taken from the feed: it
    holds queue_frames frames, the newest, and counts the rest as dropped."""
    port = free_port()
    server = serve(shapes_file, port, "-nostdin")  # no -re: as fast as it can
    try:
        stream = LiveStream(f"http://127.0.0.1:{port}/live.ts", SAMPLING, reconnects=0, queue_frames=4, **CAPS)
        stream._thread.join(timeout=60)  # read to its end before anything is taken
        items = read_all(stream)
    finally:
        server.kill()
        server.wait()
    frames = [item for item in items if isinstance(item, LiveFrame)]
    assert [frame.t_s for frame in frames] == pytest.approx([6.0, 6.5, 7.0, 7.5])
    assert stream.frames_dropped == 12 and items[-1] == STREAM_ENDED


@needs_ffmpeg
def test_frames_larger_than_the_uploads_cap_end_the_feed_with_its_sentence(shapes_file):
    port = free_port()
    server = serve(shapes_file, port)
    try:
        items = read_all(
            LiveStream(
                f"http://127.0.0.1:{port}/live.ts", SAMPLING, reconnects=3, **{**CAPS, "max_source_pixels": 32 * 32}
            )
        )
    finally:
        server.kill()
        server.wait()
    assert items == ["The stream's frames are 64x64 (0.1 megapixels); the limit is 0 megapixels."]


@needs_ffmpeg
def test_the_stream_reader_runs_under_the_uploads_memory_cap(shapes_file):
    """While frames flow, the reader's heap limit (RLIMIT_DATA's soft limit, what an upload's reader runs
    under) is the feed's memory_bytes."""
    port = free_port()
    server = serve(shapes_file, port)
    memory_bytes = 3 << 30
    try:
        with LiveStream(
            f"http://127.0.0.1:{port}/live.ts", SAMPLING, reconnects=0, **{**CAPS, "memory_bytes": memory_bytes}
        ) as stream:
            next(iter(stream))
            reader = stream._reader  # the connection's reader, alive while its frames flow
            limits = Path(f"/proc/{reader.pid}/limits").read_text()
    finally:
        server.kill()
        server.wait()
    soft = next(line.split()[3] for line in limits.splitlines() if line.startswith("Max data size"))
    assert int(soft) == memory_bytes


def serve_bytes_once(data: bytes, port: int) -> threading.Thread:
    """One HTTP client on the loopback's `port` gets `data` as an MPEG-TS body, then the connection is reset, as
    by a server that breaks off."""
    listener = socket.create_server(("127.0.0.1", port))

    def answer() -> None:
        with listener:
            client, _ = listener.accept()
            client.recv(65536)  # the request
            client.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: video/mp2t\r\nConnection: close\r\n\r\n" + data)
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close sends RST
            client.close()

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return thread


@needs_ffmpeg
def test_a_stream_that_breaks_off_keeps_the_frames_its_decoder_held(shapes_file, tmp_path):
    """A connection reset mid-stream ends the read with PyAV's error; the frames a frame-threaded decoder still
    held then (one per thread) are flushed, so the stream gives every frame its bytes hold, as a file cut at the
    same byte gives them."""
    ts = tmp_path / "shapes.ts"
    subprocess.run(
        [FFMPEG, "-loglevel", "error", "-i", str(shapes_file), "-c", "copy", "-f", "mpegts", str(ts)], check=True
    )
    cut = ts.read_bytes()[: ts.stat().st_size * 3 // 5 // 188 * 188]  # whole TS packets, about 3/5 of the clip
    (tmp_path / "cut.ts").write_bytes(cut)
    with av.open(str(tmp_path / "cut.ts")) as container:
        times = [frame.time for frame in container.decode(video=0)]
    port = free_port()
    server = serve_bytes_once(cut, port)
    taken = []
    last = stream_frames(
        f"http://127.0.0.1:{port}/live.ts",
        8.0,
        64 * 64,
        4096 * 2160,
        5.0,
        lambda header, frame: taken.append(header["t_s"]),
        threads=4,
    )
    server.join(timeout=10)
    assert 16 < len(times) < 64  # a part of the clip's 64 frames at 8 fps, each one taken
    assert last == {"status": "ended", "frames": len(times)}
    assert taken == pytest.approx([time_s - times[0] for time_s in times])
