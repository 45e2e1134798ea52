"""Uploads and generated images are deleted on a schedule, and the app keeps answering afterwards.

`python app.py` is launched with a 3-second age, cleaning every second, and its own GRADIO_TEMP_DIR, so the
files a request leaves behind can be listed and watched disappear.
"""

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from gradio_client import Client, handle_file

from app_harness import wait_until
from assets.make_examples import example_questions
from test_app_startup import ROOT, free_port, offline_env, stop, wait_for_health
from ui.temp_files import TempFileCleaner, trim_folder

MAX_AGE_S = 8  # long enough that an upload outlives a request on 2 loaded cores
CLEAN_S = 1
QUESTION = dict(question="What moves?", pruning_rate=0.7, max_new_tokens=4, api_name="/ask")


def files_under(folder: Path) -> set[Path]:
    return {path for path in folder.rglob("*") if path.is_file()}


@pytest.fixture(scope="module")
def short_lived_app(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    temp_dir = home / "gradio-temp"
    port = free_port()
    env = offline_env(
        home, GRADIO_TEMP_DIR=str(temp_dir), EVS_TEMP_MAX_AGE_S=str(MAX_AGE_S), EVS_TEMP_CLEAN_S=str(CLEAN_S)
    )
    with open(home / "app.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "app.py", "--model", "tiny-random", "--device", "cpu", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for_health(proc, port)
            yield Client(f"http://127.0.0.1:{port}/", verbose=False), temp_dir
        finally:
            stop(proc)


def test_uploads_and_frame_images_are_deleted_after_their_age(short_lived_app, clip):
    client, temp_dir = short_lived_app
    video = clip("moving_object")
    before = files_under(temp_dir)
    answer, stats, _, frames = client.predict(handle_file(str(video)), **QUESTION)
    assert answer and stats["generated_tokens"] == 4
    made = files_under(temp_dir) - before
    uploads = {path for path in made if path.name == video.name}
    images = {path for path in made if path.suffix == ".webp"}
    assert len(uploads) == 1, "the upload is kept under GRADIO_TEMP_DIR"
    assert len(images) == len(frames) == stats["grid_thw"][0], "one picture per temporal group"
    named = {name for names, _, _ in example_questions() for name in names}
    examples = {path for path in files_under(temp_dir) if path.name in named}

    deadline = time.monotonic() + MAX_AGE_S + 4 * CLEAN_S + 10
    while files_under(temp_dir) & (uploads | images) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not files_under(temp_dir) & (uploads | images), "files older than EVS_TEMP_MAX_AGE_S must be gone"
    assert examples and all(path.exists() for path in examples), "the example clips stay"

    # The app still answers a new upload of the same video.
    answer, stats, _, _ = client.predict(handle_file(str(video)), **QUESTION)
    assert answer and stats["generated_tokens"] == 4


def test_a_follow_up_on_a_deleted_upload_asks_for_it_again(short_lived_app, clip):
    client, temp_dir = short_lived_app
    job = client.submit(handle_file(str(clip("moving_object"))), **QUESTION)
    answer, _, _, _ = job.result(timeout=120)
    uploaded = next(path for path in files_under(temp_dir) if path.name == clip("moving_object").name)
    deadline = time.monotonic() + MAX_AGE_S + 4 * CLEAN_S + 10
    while uploaded.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not uploaded.exists()

    # What a browser tab sends for the video it still shows: the server path of the deleted upload
    # (gradio_client would try to upload it again, so the call goes over Gradio's plain HTTP API).
    stale = {"path": str(uploaded), "meta": {"_type": "gradio.FileData"}, "orig_name": uploaded.name}
    data = [
        stale,
        "Where does it go next?",
        0.7,
        2.0,
        32,
        224 * 224,
        4,
        0.0,
        False,
        [["What moves?", answer]],
        False,
        False,
        "evs",
        False,
        None,
        False,
    ]
    base = client.src.rstrip("/")
    event_id = httpx.post(f"{base}/gradio_api/call/ask", json={"data": data}, timeout=30).json()["event_id"]
    events = httpx.get(f"{base}/gradio_api/call/ask/{event_id}", timeout=60).text
    assert "event: error" in events
    assert "no longer on the server" in events and "upload it again" in events


# --- bounded in bytes ------------------------------------------------------------------------


def files_in_order(folder: Path, sizes: list[int]) -> list[Path]:
    """Files of `sizes` bytes made one after another (each a later ctime than the one before)."""
    made = []
    for number, size in enumerate(sizes):
        path = folder / f"sub{number % 2}" / f"file{number}.bin"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(bytes(size))
        made.append(path)
        time.sleep(0.01)
    return made


def test_past_its_size_the_folder_loses_its_oldest_files_first(tmp_path):
    """Six files of 100 bytes under a bound of 350: the three oldest go, except a kept one, which counts all the
    same (so the fourth oldest goes in its place); whatever their age."""
    made = files_in_order(tmp_path, [100] * 6)
    deleted = trim_folder(tmp_path, 350, keep={str(made[1])})
    assert deleted == 3
    assert sorted(files_under(tmp_path)) == sorted([made[1], made[4], made[5]])
    assert trim_folder(tmp_path, 350, keep=set()) == 0  # within the bound: nothing more goes


def test_the_cleaner_keeps_the_folder_within_its_bytes_between_age_cleanings(tmp_path):
    """An hour's age and an hour between cleanings, as a server runs, but 250 bytes at most: uploads past the bound
    are trimmed within seconds, the newest kept."""
    cleaner = TempFileCleaner(tmp_path, 3600, 3600, keep=set, max_bytes=250, trim_every_s=0.1).start()
    try:
        made = files_in_order(tmp_path, [100] * 5)
        assert wait_until(lambda: files_under(tmp_path) == set(made[-2:]), timeout_s=10), files_under(tmp_path)
    finally:
        cleaner.stop()
