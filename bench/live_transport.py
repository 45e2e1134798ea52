"""The Live tab's transport, measured: how late a browser's frame reaches the server's handler, and how
many arrive per second, through Gradio's streaming image input (the Live tab's own input and event,
ui/live_tab.py) at several `stream_every`, and through WebRTC with fastrtc.

    python -m bench.live_transport [--seconds 20] [--every 0.5,0.1,0.033] [--keep DIR]

Headless Debian Chromium (Playwright) with a fake camera: a Y4M made by Debian's ffmpeg from a shapes clip
(assets/shapes.py), 640x480 at 30 fps. A script injected into the page puts each camera frame on a canvas
with the page's clock (Date.now(), milliseconds, its low 24 bits as 16-pixel black and white squares along
the top) and hands the canvas's stream to whoever asked for the camera, so both transports carry stamped
frames; the handler reads the stamp back from the pixels and subtracts it from its own clock (the same
machine, the same clock). The lag so measured runs from a frame reaching the page to the handler starting
on it: capture, encoding (JPEG or VP8), the network and the server's decoding.

fastrtc's Gradio component does not load under Gradio 6 (its compiled front end asks for Gradio 5's Svelte
runtime), so the WebRTC row uses fastrtc's own `Stream` mounted on a FastAPI app, with a page that offers
the camera's track to its `/webrtc/offer` route itself. fastrtc is not in requirements.txt (it requires
gradio<6); the row needs it importable, in an environment of its own (docs/live.md says how), and is
skipped with a note otherwise.
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # `python bench/live_transport.py`: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from assets.shapes import held_out_seeds, write_shape_clip  # noqa: E402

try:
    from .markdown import cell, table
except ImportError:
    from bench.markdown import cell, table

CHROMIUM = Path("/usr/bin/chromium")
CAMERA_SIZE = (640, 480)
CAMERA_FPS = 30
STAMP_BITS = 24
STAMP_BLOCK_PX = 16
WARM_UP_S = 2.0  # frames in the first seconds of a run are not counted: the page and the encoder start up
# Each camera frame is redrawn with the page's clock in its top row, and the canvas's stream goes to whoever
# asked for the camera.
STAMP_SCRIPT = """
(() => {
  const BITS = STAMP_BITS, BLOCK = STAMP_BLOCK_PX;
  const devices = navigator.mediaDevices;
  const askCamera = devices.getUserMedia.bind(devices);
  devices.getUserMedia = async (constraints) => {
    const camera = await askCamera(constraints);
    const video = document.createElement("video");
    video.muted = true; video.playsInline = true; video.srcObject = camera;
    await video.play();
    const canvas = document.createElement("canvas");
    canvas.width = video.videoWidth; canvas.height = video.videoHeight;
    const context = canvas.getContext("2d");
    const draw = () => {
      context.drawImage(video, 0, 0);
      const stamp = Date.now() % (1 << BITS);
      for (let bit = 0; bit < BITS; bit++) {
        context.fillStyle = (stamp >> (BITS - 1 - bit)) & 1 ? "#ffffff" : "#000000";
        context.fillRect(bit * BLOCK, 0, BLOCK, BLOCK);
      }
      video.requestVideoFrameCallback(draw);
    };
    video.requestVideoFrameCallback(draw);
    return canvas.captureStream();
  };
})();
""".replace("STAMP_BITS", str(STAMP_BITS)).replace("STAMP_BLOCK_PX", str(STAMP_BLOCK_PX))
# The WebRTC page: the camera's track offered to fastrtc's route, with the data channel fastrtc waits for.
WEBRTC_PAGE = """<!doctype html><title>webrtc</title><button id="start">start</button><script>
document.getElementById("start").onclick = async () => {
  const camera = await navigator.mediaDevices.getUserMedia({video: {width: %(width)d, height: %(height)d}});
  const peer = new RTCPeerConnection({iceServers: []});
  camera.getTracks().forEach(track => peer.addTrack(track, camera));
  peer.createDataChannel("text");
  await peer.setLocalDescription(await peer.createOffer());
  await new Promise(done => peer.iceGatheringState === "complete" ? done()
    : peer.addEventListener("icegatheringstatechange", () => peer.iceGatheringState === "complete" && done()));
  const answer = await fetch("/webrtc/offer", {method: "POST", headers: {"Content-Type": "application/json"},
    body: JSON.stringify({sdp: peer.localDescription.sdp, type: "offer", webrtc_id: "%(id)s"})});
  await peer.setRemoteDescription(await answer.json());
  window.peer = peer;
};
</script>"""


def read_stamp(frame: np.ndarray) -> int | None:
    """The page's clock stamped into an (H, W, 3) frame's top row (ms modulo 2**STAMP_BITS), or None where a
    square is neither clearly black nor clearly white (a frame encoded too coarsely to read)."""
    half = STAMP_BLOCK_PX // 4
    value = 0
    for bit in range(STAMP_BITS):
        left = bit * STAMP_BLOCK_PX
        level = float(frame[half : STAMP_BLOCK_PX - half, left + half : left + STAMP_BLOCK_PX - half].mean())
        if 64 < level < 192:
            return None
        value = value << 1 | (level >= 128)
    return value


def lag_ms(stamp: int, now_ms: float) -> float:
    """Milliseconds from the stamped time to now_ms (time.time() * 1000), the stamp being its low bits."""
    return (now_ms - stamp) % (1 << STAMP_BITS)


@dataclass
class Arrivals:
    """Frames as a handler sees them: (time.time() on arrival, lag in ms or None when unreadable)."""

    seen: list[tuple[float, float | None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def frame(self, frame: np.ndarray) -> None:
        now_s = time.time()
        stamp = read_stamp(frame)
        with self.lock:
            self.seen.append((now_s, None if stamp is None else lag_ms(stamp, now_s * 1000)))

    def summary(self) -> dict:
        """frames counted after the warm-up, their rate, lag p50, p95 and max (ms), unreadable stamps."""
        with self.lock:
            seen = list(self.seen)
        if not seen:
            return {"frames": 0}
        start = seen[0][0] + WARM_UP_S
        counted = [(at, lag) for at, lag in seen if at >= start]
        lags = sorted(lag for _, lag in counted if lag is not None)
        span = counted[-1][0] - counted[0][0] if len(counted) > 1 else 0.0
        return {
            "frames": len(counted),
            "fps": (len(counted) - 1) / span if span > 0 else None,
            "lag_p50_ms": statistics.median(lags) if lags else None,
            "lag_p95_ms": lags[int(0.95 * (len(lags) - 1))] if lags else None,
            "lag_max_ms": lags[-1] if lags else None,
            "unreadable": sum(lag is None for _, lag in counted),
        }


def fake_camera(folder: Path) -> Path:
    """A Y4M for Chromium's fake camera: a held-out shapes clip scaled to CAMERA_SIZE at CAMERA_FPS."""
    clip = write_shape_clip(folder / "shapes.mp4", held_out_seeds(0, 1)[0])
    camera = folder / "camera.y4m"
    width, height = CAMERA_SIZE
    subprocess.run(
        [
            "ffmpeg",
            "-loglevel",
            "error",
            "-y",
            "-i",
            str(clip),
            "-vf",
            f"scale={height}:{height}:flags=neighbor,pad={width}:{height}:(ow-iw)/2:0:0x464646,fps={CAMERA_FPS}",
            "-pix_fmt",
            "yuv420p",
            str(camera),
        ],
        check=True,
    )
    return camera


def chromium_args(camera: Path) -> list[str]:
    return [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--use-fake-device-for-media-stream",
        "--use-fake-ui-for-media-stream",
        f"--use-file-for-fake-video-capture={camera}",
    ]


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_gradio(browser, every_s: float, seconds: float) -> dict:
    """The Live tab's input and stream event (ui/live_tab.py) at `every_s`, its handler only reading stamps."""
    import gradio as gr

    from ui.live_tab import live_input, stream_frames

    arrivals = Arrivals()

    def handler(frame):
        if frame is not None:
            arrivals.frame(frame)

    with gr.Blocks() as demo:
        image = live_input("Camera")
        stream_frames(image, handler, inputs=[image], outputs=[], every_s=every_s)
    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=free_port(), quiet=True)
    page = browser.new_page()
    try:
        page.add_init_script(STAMP_SCRIPT)
        page.goto(url)
        page.click("#evs-live-camera [title='grant webcam access'] button")
        page.click("#evs-live-camera button[aria-label='capture photo']")  # Gradio's label for Record
        page.wait_for_timeout(seconds * 1000)
    finally:
        page.close()
        demo.close()
    return arrivals.summary()


def run_webrtc(browser, seconds: float) -> dict | str:
    """fastrtc's Stream (video, send only) on a FastAPI app; a note instead where fastrtc is not installed."""
    try:
        from fastrtc import Stream
    except ImportError:
        return "fastrtc is not installed here (docs/live.md: a side environment for this row)"
    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import HTMLResponse

    arrivals = Arrivals()

    def handler(frame):
        arrivals.frame(frame)

    stream = Stream(handler, mode="send", modality="video", time_limit=seconds + 30)
    app = FastAPI()
    stream.mount(app)
    connection = uuid.uuid4().hex
    page_html = WEBRTC_PAGE % {"width": CAMERA_SIZE[0], "height": CAMERA_SIZE[1], "id": connection}
    app.get("/")(lambda: HTMLResponse(page_html))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    page = browser.new_page()
    try:
        page.add_init_script(STAMP_SCRIPT)
        page.goto(f"http://127.0.0.1:{port}/")
        page.click("#start")
        deadline = time.monotonic() + 30
        while not stream.connections.get(connection) and time.monotonic() < deadline:
            time.sleep(0.05)
        # fastrtc calls the handler only once a connection's inputs are set; the first is the frame's place
        stream.set_input(connection, None)
        page.wait_for_timeout(seconds * 1000)
    finally:
        page.close()
        server.should_exit = True
        thread.join(timeout=10)
    return arrivals.summary()


def measure(seconds: float, every: list[float], folder: Path) -> list[tuple[str, dict | str]]:
    from playwright.sync_api import sync_playwright

    camera = fake_camera(folder)
    rows = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=chromium_args(camera))
        try:
            for every_s in every:
                rows.append(
                    (f"Gradio streaming image, stream_every={every_s:g} s", run_gradio(browser, every_s, seconds))
                )
            rows.append(("WebRTC (fastrtc Stream, VP8)", run_webrtc(browser, seconds)))
        finally:
            browser.close()
    return rows


def report(rows: list[tuple[str, dict | str]]) -> str:
    lines = []
    for name, found in rows:
        if isinstance(found, str):
            lines.append([name, found, "", "", "", "", ""])
            continue
        lines.append(
            [
                name,
                found["frames"],
                cell(found.get("fps"), 1),
                cell(found.get("lag_p50_ms"), 0),
                cell(found.get("lag_p95_ms"), 0),
                cell(found.get("lag_max_ms"), 0),
                found.get("unreadable", 0),
            ]
        )
    return table(
        ["transport", "frames", "frames/s", "lag p50 (ms)", "lag p95 (ms)", "lag max (ms)", "unreadable"], lines
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.live_transport", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="streaming time per transport")
    parser.add_argument("--every", default="0.5,0.1,0.033", help="Gradio's stream_every values, in seconds")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="write the fake camera's files there")
    args = parser.parse_args(argv)
    every = [float(value) for value in args.every.split(",")]
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        rows = measure(args.seconds, every, folder)
    print(report(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
