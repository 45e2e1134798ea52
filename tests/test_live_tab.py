"""The Live tab in a real browser: Debian's Chromium with a fake camera (a Y4M that Debian's ffmpeg makes from a
shapes clip) and its fake screen, streaming frames to the launched app's handler."""

import re
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from app_harness import wait_until
from assets.shapes import held_out_seeds, write_shape_clip
from test_browser import CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS

CAMERA_SIZE = (320, 240)

pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (apt-get install chromium)"),
    pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="needs Debian's ffmpeg (apt-get install ffmpeg)"),
]


@pytest.fixture(scope="module")
def camera(tmp_path_factory) -> Path:
    """A held-out shapes clip as Chromium's fake camera: 320x240 at its own 8 fps."""
    folder = tmp_path_factory.mktemp("camera")
    clip = write_shape_clip(folder / "shapes.mp4", held_out_seeds(1, 1)[0])
    y4m = folder / "camera.y4m"
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
            f"scale={height}:{height}:flags=neighbor,pad={width}:{height}:(ow-iw)/2:0",
            "-pix_fmt",
            "yuv420p",
            str(y4m),
        ],
        check=True,
    )
    return y4m


@contextmanager
def camera_browser(camera: Path):
    """Chromium whose fake camera plays the Y4M `camera` (looping), sharing a fake screen when asked."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            args=[
                *CHROMIUM_ARGS,
                "--use-fake-device-for-media-stream",
                "--use-fake-ui-for-media-stream",
                f"--use-file-for-fake-video-capture={camera}",
            ],
        )
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def browser(camera):
    with camera_browser(camera) as browser:
        yield browser


def open_live_tab(page, url: str) -> None:
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(url)
    page.click("#evs-tabs button[role=tab]:has-text('Live')")
    page.wait_for_selector("#evs-live-status")


def stream_until(page, source: str, frames: int) -> str:
    """Allow the source, press Record, and wait until the status counts `frames`; the status then."""
    box = f"#evs-live-{source}"
    page.click(f"{box} [title='grant webcam access'] button")
    page.click(f"{box} button[aria-label='capture photo']")  # Gradio's label for its Record button
    page.wait_for_function(
        "n => { const m = document.querySelector('#evs-live-status').innerText.match(/(\\d+) frames/);"
        " return m && Number(m[1]) >= n; }",
        arg=frames,
        timeout=TIMEOUT_MS,
    )
    return page.locator("#evs-live-status").inner_text()


def test_the_camera_streams_frames_to_the_server(browser, app):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    try:
        open_live_tab(page, app.url)
        # the app was started without --live-urls: no Stream URL source
        assert page.locator("#evs-live-source label").all_inner_texts() == ["Camera", "Screen"]
        status = stream_until(page, "camera", 12)
        assert re.search(r"\d+ frames · \d+\.\d per second · 320×240", status), status
        rate = float(re.search(r"(\d+\.\d) per second", status).group(1))
        assert 3 <= rate <= 11  # a frame every 0.1 s at most (STREAM_EVERY_S), on a busy 2-core host fewer
    finally:
        page.close()


def test_a_closed_tab_closes_its_feed_and_frees_its_live_session(browser, app):
    """Gradio's unload event, when the tab's connection ends, closes the tab's feed and its live session at once
    (a gr.State would outlive a closed tab by an hour): the engine's worker drops the session's state."""
    feeds = app.demo.live_feeds
    earlier = set(feeds.open_feeds())  # an earlier test's tab, closed, may wait for its unload a while yet
    page = browser.new_page()
    open_live_tab(page, app.url)
    stream_until(page, "camera", 3)
    (feed,) = set(feeds.open_feeds()) - earlier
    assert not feed.closed
    streams = app.spy.engine._worker.runner.live.streams  # the worker's state of each open session
    assert wait_until(lambda: feed.live is not None)
    live = feed.live
    assert wait_until(lambda: live.id in streams) and not live.stats()["closed"]
    page.close()
    assert wait_until(lambda: feed not in feeds.open_feeds(), timeout_s=60)
    assert feed.closed and feed.live is None and live.stats()["closed"]
    assert wait_until(lambda: live.id not in streams)  # woken by the close, the worker let its state go


def test_a_shared_screen_streams_through_the_same_input(browser, app):
    """Chromium's fake screen answers getDisplayMedia (headless, it shows the page itself): with Screen chosen,
    the page's script asks for it instead of the camera, whose frames are 320x240."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    try:
        open_live_tab(page, app.url)
        page.click("#evs-live-source label:has-text('Screen')")
        page.wait_for_selector("#evs-live-screen [title='grant webcam access'] button")
        status = stream_until(page, "screen", 5)
        width, height = map(int, re.search(r"(\d+)×(\d+)", status).groups())
        assert (width, height) != CAMERA_SIZE and width > height >= 480, status
    finally:
        page.close()
