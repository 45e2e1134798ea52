"""The page in a real browser: Debian's Chromium driven by Playwright (no browser download)."""

from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from playwright.sync_api import sync_playwright

from app_harness import wait_until
from assets.make_examples import example_questions
from engine.errors import NO_VIDEO
from ui.runs import METHOD_LABELS

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
TIMEOUT_MS = 90_000
PHONE = dict(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)  # an iPhone 12-15's width

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


def upload(page, *files: Path) -> None:
    """Upload files at once into the strip, as a drop of several files does, and wait until it shows them."""
    page.set_input_files("#evs-media input[type=file]", [str(file) for file in files])
    page.wait_for_function(
        "n => document.querySelectorAll('#evs-media video, #evs-media img').length === n",
        arg=len(files),
        timeout=TIMEOUT_MS,
    )


def ask(page, question: str) -> None:
    page.fill("#evs-question textarea", question)
    page.click("#evs-ask")


def status_text(page) -> str:
    return page.locator("#evs-status").inner_text()


def sweep_and_wait(page, rates: int = 5) -> None:
    """Press Sweep and wait until every rate's card shows its numbers, the plot and the table."""
    page.click("#evs-sweep-button")
    page.wait_for_function(
        "n => { const cards = [...document.querySelectorAll('#evs-sweep-answers .evs-answer-numbers')];"
        " return cards.length === n && cards.every(card => card.innerText.includes('TTFT')); }",
        arg=rates,
        timeout=TIMEOUT_MS,
    )
    page.wait_for_selector("#evs-sweep-plot .js-plotly-plot .bars")
    page.wait_for_function("document.querySelector('#evs-sweep-table').innerText.includes('0.9')", timeout=TIMEOUT_MS)


def horizontal_extent(page, selector: str) -> tuple[float, float]:
    box = page.locator(selector).first.bounding_box()
    assert box is not None and box["width"] > 0, selector
    return box["x"], box["x"] + box["width"]


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
    page.wait_for_function(
        "document.querySelector('#evs-compare-summary').innerText.includes('shorter')", timeout=TIMEOUT_MS
    )
    assert page.locator('#evs-chat [data-testid="user"]').count() == 2
    cards = page.locator("#evs-compare-cards .evs-answer-card")
    assert cards.count() == 2 and "q = 0 · all tokens" in cards.first.inner_text()
    assert "TTFT" in cards.last.inner_text()

    # the methods side by side: VidCom2 chosen, EVS and uniform beside it at the same q, a picture each
    page.uncheck("#evs-compare input[type=checkbox]")
    page.check("#evs-compare-methods input[type=checkbox]")
    page.click("#evs-pruning-method input")
    page.get_by_role("option", name=METHOD_LABELS["vidcom2"]).click()
    ask(page, "Which parts are kept?")
    page.wait_for_function(
        "() => { const cards = [...document.querySelectorAll('#evs-compare-cards .evs-answer-numbers')];"
        " return cards.length === 3 && cards.every(card => card.innerText.includes('TTFT')); }",
        timeout=TIMEOUT_MS,
    )
    titles = page.locator("#evs-compare-cards .evs-answer-title").all_inner_texts()
    assert titles == ["evs · q = 0.5", "uniform · q = 0.5", "vidcom2 · q = 0.5"]
    page.wait_for_function("document.querySelectorAll('#evs-compare-pictures img').length === 3", timeout=TIMEOUT_MS)
    # the stats panel is its own output, drawn after the cards on a busy machine
    page.wait_for_function("document.querySelector('#evs-stats').innerText.includes('by vidcom2')", timeout=TIMEOUT_MS)

    # the sweep: five answers side by side (one row of cards), the plot and the per-rate table
    sweep_and_wait(page)
    cards = page.locator("#evs-sweep-answers .evs-answer-card").all()
    tops = {round(box["y"]) for box in (card.bounding_box() for card in cards)}
    assert len(tops) == 1
    table = page.locator("#evs-sweep-table").inner_text()
    assert all(q in table for q in ("0.3", "0.5", "0.7", "0.9"))

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "screenshot.png"
    page.screenshot(path=str(shot), full_page=True)
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000


def test_a_phone_gets_one_column_and_never_scrolls_sideways(browser, app, clip):
    context = browser.new_context(**PHONE)
    phone = context.new_page()
    phone.set_default_timeout(TIMEOUT_MS)
    try:
        phone.goto(app.url)
        phone.wait_for_selector("#evs-ask")
        width = PHONE["viewport"]["width"]

        def page_width() -> int:
            return phone.evaluate("document.documentElement.scrollWidth")

        assert page_width() <= width  # 1286 before the phone layout
        upload(phone, clip("moving_object", seconds=3.0))
        phone.click("#evs-advanced button")
        set_slider(phone, "evs-max-new-tokens", 8)
        ask(phone, "What moves in this clip?")
        phone.wait_for_function("document.querySelector('#evs-status').innerText.includes('done')", timeout=TIMEOUT_MS)
        phone.wait_for_selector("#evs-bars .js-plotly-plot .bars")
        sweep_and_wait(phone)

        assert page_width() <= width
        for selector in (
            "#evs-ask",
            '#evs-chat [data-testid="bot"]',
            "#evs-stats",
            "#evs-bars",
            "#evs-heatmap",
            "#evs-gallery",
            "#evs-sweep-answers",
            "#evs-sweep-plot",
            "#evs-sweep-table",
        ):
            left, right = horizontal_extent(phone, selector)
            assert 0 <= left and right <= width, (selector, left, right)
        # the columns stack: the conversation is below the inputs, not beside them
        assert horizontal_extent(phone, "#evs-chat")[0] == horizontal_extent(phone, "#evs-media")[0]
        assert phone.locator("#evs-chat").bounding_box()["y"] > phone.locator("#evs-ask").bounding_box()["y"]

        phone.locator("#evs-gallery").scroll_into_view_if_needed()  # its frames load lazily
        phone.wait_for_function("[...document.querySelectorAll('#evs-gallery img')].every(img => img.complete)")
        ARTIFACTS.mkdir(exist_ok=True)
        shot = ARTIFACTS / "screenshot-phone.png"
        phone.screenshot(path=str(shot), full_page=True)
        assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    finally:
        context.close()


def test_the_fallback_banner_fits_a_phone(browser, fallback_app):
    """The app as a user starts it when its checkpoint cannot be fetched: the banner says why in words, and a
    model id wider than the screen wraps instead of widening the page."""
    context = browser.new_context(**PHONE)
    phone = context.new_page()
    phone.set_default_timeout(TIMEOUT_MS)
    try:
        phone.goto(fallback_app.url)
        phone.wait_for_selector("#evs-ask")
        banner = phone.locator("#evs-banner").inner_text()
        assert "could not be downloaded: no network connection, and no copy on this machine" in banner
        assert "This app runs tiny-trained instead" in banner and "http" not in banner
        width = PHONE["viewport"]["width"]
        assert phone.evaluate("document.documentElement.scrollWidth") <= width
        left, right = horizontal_extent(phone, "#evs-banner")
        assert 0 <= left and right <= width, (left, right)
    finally:
        context.close()


def test_clicking_an_example_fills_the_inputs(page):
    examples = page.locator("#evs-examples")
    if not examples.count():
        pytest.skip("the example clips in assets/examples are not there")
    examples.locator('[data-testid="dataset-cell-1-1"]').click()  # the second example's question
    _, question, rate = example_questions()[1]
    page.wait_for_selector("#evs-media video")
    assert page.locator("#evs-question textarea").input_value() == question
    assert float(page.locator("#evs-pruning-rate input[type=number]").input_value()) == pytest.approx(rate)


def test_asking_without_a_video_shows_an_error_toast(page):
    ask(page, "What moves?")
    toast = page.locator(".toast-body").filter(has_text=NO_VIDEO)
    toast.wait_for()
    assert "Traceback" not in toast.inner_text()


def test_stop_and_closing_the_tab_cancel_the_engine_request(browser, app, clip):
    def start_long_answer(tab):
        upload(tab, clip("moving_object"))
        tab.click("#evs-advanced button")
        set_slider(tab, "evs-max-new-tokens", 1024)
        ask(tab, "Talk for a long time.")
        tab.wait_for_selector('#evs-chat [data-testid="bot"]')  # the first token arrived
        return app.spy.streams[-1]

    def cancelled_by(stop) -> bool:
        """Whether `stop` cancels a long answer. The tiny model writes 1,024 tokens in about 1.5 s, so on a
        host busy with other work the whole answer can be out before the click reaches the server: that
        try proves nothing either way and is made again, up to three times."""
        for _ in range(3):
            tab = new_tab()
            stream = start_long_answer(tab)
            stop(tab)
            assert wait_until(lambda stream=stream: stream.finished, timeout_s=30)
            if not tab.is_closed():
                tab.close()
            if stream.cancelled:
                assert stream.result().stats["generated_tokens"] < 1024
                return True
            assert stream.result().stats["generated_tokens"] == 1024, "ended early without being cancelled"
        return False

    def new_tab():
        tab = browser.new_page()
        tab.set_default_timeout(TIMEOUT_MS)
        tab.goto(app.url)
        return tab

    assert cancelled_by(lambda tab: tab.click("#evs-stop"))
    assert cancelled_by(lambda tab: tab.close())


@pytest.mark.parametrize("viewport", ["desktop", "phone"])
def test_two_videos_and_a_picture_are_answered_with_a_pruning_picture_per_video(browser, app, clip, tmp_path, viewport):
    """Three files dropped at once show as a strip; the answer's pruning picture is the first video's, the choice
    above it switches to the other video's (its own frames and kept counts), and the stats say each upload's
    tokens. On a phone all of it fits the screen's width."""
    context = browser.new_context(**(PHONE if viewport == "phone" else {"viewport": {"width": 1400, "height": 900}}))
    tab = context.new_page()
    tab.set_default_timeout(TIMEOUT_MS)
    picture = tmp_path / "picture.png"
    Image.fromarray(np.random.default_rng(2).integers(0, 255, (96, 128, 3), np.uint8)).save(picture)
    try:
        tab.goto(app.url)
        tab.wait_for_selector("#evs-ask")
        upload(tab, clip("moving_object", seconds=3.0), picture, clip("pan", seconds=2.0))
        tab.click("#evs-advanced button")
        set_slider(tab, "evs-max-new-tokens", 4)
        ask(tab, "What differs between the two clips?")
        tab.wait_for_function("document.querySelector('#evs-status').innerText.includes('done')", timeout=TIMEOUT_MS)
        choice = tab.locator("#evs-video-choice")
        tab.wait_for_function("document.querySelectorAll('#evs-video-choice label').length === 2")
        assert choice.locator("label").all_inner_texts() == ["Video 1", "Video 3"]
        assert "2 videos, 1 picture" in tab.locator("#evs-stats").inner_text()
        tab.wait_for_function("document.querySelectorAll('#evs-gallery img').length === 3")  # 3 s: 3 groups
        first = tab.locator("#evs-gallery").inner_text()
        choice.locator("label", has_text="Video 3").click()
        tab.wait_for_function("document.querySelectorAll('#evs-gallery img').length === 2")  # 2 s: 2 groups
        assert tab.locator("#evs-gallery").inner_text() != first
        tab.wait_for_selector("#evs-bars .js-plotly-plot .bars")
        if viewport == "phone":
            width = PHONE["viewport"]["width"]
            assert tab.evaluate("document.documentElement.scrollWidth") <= width
            for selector in ("#evs-media", "#evs-video-choice", "#evs-stats", "#evs-gallery"):
                left, right = horizontal_extent(tab, selector)
                assert 0 <= left and right <= width, (selector, left, right)
        ARTIFACTS.mkdir(exist_ok=True)
        tab.screenshot(path=str(ARTIFACTS / f"screenshot-media-{viewport}.png"), full_page=True)
    finally:
        context.close()
