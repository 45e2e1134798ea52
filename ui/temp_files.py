"""Bounded temporary files: uploads and generated images older than an age are deleted on a schedule, and past a
total size the oldest go first, whatever their age (checked more often: an upload is up to the upload limit).

Gradio's own `delete_cache` removes only the files it tracks (uploads, files returned as paths); the
images it writes for a gr.Gallery of arrays (our frame pictures, one per temporal group per answer) are
never tracked, so they would pile up forever. TempFileCleaner cleans the whole folder instead; the app
gives Gradio a folder of its own (GRADIO_TEMP_DIR) so no other program's files are in it.
"""

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import gradio as gr

log = logging.getLogger(__name__)
# How often the folder's total size is checked, when bounded: uploads of the upload limit each could otherwise
# fill a disk between two cleanings by age.
TRIM_EVERY_S = 10.0


def files_to_keep(demo: gr.Blocks) -> set[str]:
    """Files Gradio keeps for the app's lifetime (the example clips' cached copies), as absolute paths."""
    return {os.path.abspath(path) for block in demo.blocks.values() for path in getattr(block, "keep_in_cache", ())}


def _is_old(path: str, older_than_s: float, now_s: float) -> bool:
    return now_s - os.lstat(path).st_ctime > older_than_s


def clean_folder(folder: Path, older_than_s: float, keep: set[str], now_s: float | None = None) -> int:
    """Delete the files under `folder` last changed more than `older_than_s` seconds ago, except `keep`
    (absolute paths), then the old folders left empty; returns how many files went. ctime, as Gradio ages
    its files: it touches a cached copy when it hands it out again. A young empty folder stays: Gradio makes
    the folder first and writes the file into it a moment later."""
    now_s = time.time() if now_s is None else now_s
    deleted = 0
    for root, dirs, files in os.walk(os.path.abspath(folder), topdown=False):
        for name in files:
            path = os.path.join(root, name)
            try:
                if path not in keep and _is_old(path, older_than_s, now_s):
                    os.remove(path)
                    deleted += 1
            except FileNotFoundError:
                continue  # deleted meanwhile (by Gradio's own delete_cache, or a request that finished)
        for name in dirs:
            path = os.path.join(root, name)
            try:
                if _is_old(path, older_than_s, now_s):
                    os.rmdir(path)  # only succeeds when empty
            except OSError:
                pass
    return deleted


def trim_folder(folder: Path, max_bytes: int, keep: set[str]) -> int:
    """Delete the files under `folder` oldest first (by ctime, as clean_folder ages them) until the rest hold at
    most `max_bytes`, except `keep` (absolute paths, which count all the same); returns how many went."""
    found = []
    for root, _dirs, files in os.walk(os.path.abspath(folder)):
        for name in files:
            path = os.path.join(root, name)
            try:
                status = os.lstat(path)
            except FileNotFoundError:
                continue
            found.append((status.st_ctime, status.st_size, path))
    total = sum(size for _, size, _ in found)
    deleted = 0
    for _, size, path in sorted(found):
        if total <= max_bytes:
            break
        if path in keep:
            continue
        try:
            os.remove(path)
            deleted += 1
        except FileNotFoundError:
            pass  # gone meanwhile: its bytes are free all the same
        total -= size
    return deleted


class TempFileCleaner:
    """Runs clean_folder(folder, older_than_s, keep()) every `every_s` seconds on a daemon thread until stop(), and
    with max_bytes, trim_folder(folder, max_bytes, keep()) every `trim_every_s` seconds (at most every_s)."""

    def __init__(
        self,
        folder: Path,
        every_s: float,
        older_than_s: float,
        keep: Callable[[], set[str]],
        max_bytes: int | None = None,
        trim_every_s: float = TRIM_EVERY_S,
    ):
        self.folder, self.every_s, self.older_than_s, self.keep = Path(folder), every_s, older_than_s, keep
        self.max_bytes, self.trim_every_s = max_bytes, min(trim_every_s, every_s)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="evs-temp-cleaner", daemon=True)

    def start(self) -> "TempFileCleaner":
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the cleaning and delete every file the app made (the example clips stay), as Gradio does
        with the files it tracks when the server stops."""
        self._stopped.set()
        self._thread.join(timeout=5)
        clean_folder(self.folder, -1.0, self.keep())

    def _run(self) -> None:
        wake_s = self.every_s if self.max_bytes is None else self.trim_every_s
        last_clean = time.monotonic()
        while not self._stopped.wait(wake_s):
            try:
                if time.monotonic() - last_clean >= self.every_s - wake_s / 2:
                    last_clean = time.monotonic()
                    if deleted := clean_folder(self.folder, self.older_than_s, self.keep()):
                        log.info("deleted %d temporary files older than %d s", deleted, self.older_than_s)
                if self.max_bytes is not None and (deleted := trim_folder(self.folder, self.max_bytes, self.keep())):
                    log.info("deleted the %d oldest temporary files: they held over %d bytes", deleted, self.max_bytes)
            except Exception:  # a full disk or a Gradio internals change must not end the cleaning for good
                log.exception("cleaning the temp files of %s failed", self.folder)


def start_cleaner(
    demo: gr.Blocks, every_s: float, older_than_s: float, max_bytes: int | None = None
) -> TempFileCleaner:
    """Clean Gradio's temp folder (GRADIO_TEMP_DIR) for `demo` on a schedule, keeping its example clips; with
    max_bytes, the oldest files go whenever the folder holds more."""
    folder = Path(gr.utils.get_upload_folder())
    log.info(
        "temporary files in %s are deleted %d s after they were made (checked every %d s)%s",
        folder,
        older_than_s,
        every_s,
        "" if max_bytes is None else f", the oldest first past {max_bytes / (1 << 20):.0f} MB",
    )
    return TempFileCleaner(folder, every_s, older_than_s, lambda: files_to_keep(demo), max_bytes).start()
