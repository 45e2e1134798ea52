"""The page in a real browser: Debian's Chromium driven by Playwright (no browser download)."""

from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from app_harness import wait_until
from assets.make_examples import example_questions

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
TIMEOUT_MS = 90_000

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (apt-get install chromium)")


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, app):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(app.url)
    page.wait_for_selector("#evs-ask")
    yield page
    if not page.is_closed():
        page.close()


def set_slider(page, elem_id: str, value: float) -> None:
    """Move a Gradio slider the way a drag does: set the range input, which fires its input event.

    A slider that has just been shown (an accordion opening) can still reset itself once mounted, so the
    move is repeated until its number box shows the value.
    """
    slider = page.locator(f"#{elem_id} input[type=range]")
    number = page.locator(f"#{elem_id} input[type=number]")

    def moved() -> bool:
        slider.fill(str(value))
        page.wait_for_timeout(100)
        return float(number.input_value()) == pytest.approx(value)

    assert wait_until(moved, timeout_s=10), number.input_value()


def upload(page, video: Path) -> None:
    page.set_input_files("#evs-video input[type=file]", str(video))
    page.wait_for_selector("#evs-video video")


def ask(page, question: str) -> None:
    page.fill("#evs-question textarea", question)
    page.click("#evs-ask")


def status_text(page) -> str:
    return page.locator("#evs-status").inner_text()


def test_upload_ask_and_see_answer_numbers_and_pictures(page, clip):
    assert "the words are random" in page.locator("#evs-banner").inner_text()

    upload(page, clip("moving_object", seconds=3.0))
    set_slider(page, "evs-pruning-rate", 0.5)
    page.click("#evs-advanced button")
    set_slider(page, "evs-fps", 4)  # 12 frames: 6 temporal groups in the pictures
    set_slider(page, "evs-max-new-tokens", 8)
    ask(page, "What moves in this clip?")

    page.wait_for_function("document.querySelector('#evs-status').innerText.includes('done')", timeout=TIMEOUT_MS)
    assert page.locator('#evs-chat [data-testid="bot"]').inner_text().strip()
    page.wait_for_selector("#evs-bars .js-plotly-plot .bars")
    page.wait_for_selector("#evs-heatmap .js-plotly-plot")
    assert page.locator("#evs-gallery img").count() == 6
    assert "kept" in page.locator("#evs-gallery").inner_text()
    assert "at q=0.50" in page.locator("#evs-stats").inner_text()  # the slider's value reached the engine

    # a follow-up in compare mode keeps the conversation and shows both answers side by side
    page.check("#evs-compare input[type=checkbox]")
    ask(page, "And what happens next?")
    page.wait_for_function("document.querySelector('#evs-compare-summary').innerText.includes('shorter')",
                           timeout=TIMEOUT_MS)
    assert page.locator('#evs-chat [data-testid="user"]').count() == 2
    assert "q = 0 · all tokens" in page.locator("#evs-compare-full").inner_text()
    assert "TTFT" in page.locator("#evs-compare-pruned").inner_text()

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "screenshot.png"
    page.screenshot(path=str(shot), full_page=True)
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000


def test_clicking_an_example_fills_the_inputs(page):
    examples = page.locator("#evs-examples")
    if not examples.count():
        pytest.skip("the example clips in assets/examples are not there")
    examples.locator('[data-testid="dataset-cell-1-1"]').click()  # the second example's question
    _, question, rate = example_questions()[1]
    page.wait_for_selector("#evs-video video")
    assert page.locator("#evs-question textarea").input_value() == question
    assert float(page.locator("#evs-pruning-rate input[type=number]").input_value()) == pytest.approx(rate)


def test_asking_without_a_video_shows_an_error_toast(page):
    ask(page, "What moves?")
    toast = page.locator(".toast-body").filter(has_text="Please upload a video first.")
    toast.wait_for()
    assert "Traceback" not in toast.inner_text()


def test_stop_and_closing_the_tab_cancel_the_engine_request(page, browser, app, clip):
    def start_long_answer(tab):
        upload(tab, clip("moving_object"))
        tab.click("#evs-advanced button")
        set_slider(tab, "evs-max-new-tokens", 1024)
        ask(tab, "Talk for a long time.")
        tab.wait_for_selector('#evs-chat [data-testid="bot"]')  # the first token arrived
        return app.spy.streams[-1]

    stream = start_long_answer(page)
    page.click("#evs-stop")
    assert wait_until(lambda: stream.finished) and stream.cancelled

    tab = browser.new_page()
    tab.set_default_timeout(TIMEOUT_MS)
    tab.goto(app.url)
    stream = start_long_answer(tab)
    tab.close()
    assert wait_until(lambda: stream.finished, timeout_s=30) and stream.cancelled
    assert stream.result().stats["generated_tokens"] < 1024
