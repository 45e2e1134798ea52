"""The Video tab's latest pruning pictures, per browser tab: what the choice of video shows again when the reader
switches between the videos of an answer about several.

Not a `gr.State`: Gradio keeps a closed tab's state for an hour, and these hold every sampled frame of the answer's
videos. The page's unload event (the tab closed or reloaded) drops the tab's pictures at once, as ui/live_feeds.py
ends the Live tab's sessions, and the whole store is bounded in bytes (the least recently answered tab's go first),
for tabs whose unload never comes.
"""

import threading

import gradio as gr

from engine.lru import ByteLRU
from engine.stream import EvsPicture

MAX_BYTES = 256 << 20


def picture_bytes(pictures: dict[int, EvsPicture]) -> int:
    """What an answer's pictures hold: every video's frames, kept mask and dissimilarity."""
    return sum(p.frames.nbytes + p.kept_mask.nbytes + p.dissimilarity.nbytes for p in pictures.values())


class TabPictures:
    """The latest answer's pruning pictures of each open tab, by Gradio's session hash."""

    def __init__(self, max_bytes: int = MAX_BYTES):
        self._lru = ByteLRU(max_bytes)
        self._lock = threading.Lock()  # handlers run on the event loop, the unload event on a worker thread

    def put(self, tab: str, pictures: dict[int, EvsPicture]) -> None:
        """The tab's answer has its pictures (by the video's place among the uploads); its earlier ones go."""
        with self._lock:
            self._lru.put(tab, dict(pictures), picture_bytes(pictures))

    def get(self, tab: str) -> dict[int, EvsPicture]:
        """The tab's latest pictures ({} when it has none, or they were dropped)."""
        with self._lock:
            return self._lru.get(tab) or {}

    def drop(self, tab: str) -> None:
        with self._lock:
            self._lru.pop(tab)

    def close_tab(self, request: gr.Request) -> None:
        """The page's unload event: the tab is gone, and its pictures with it."""
        self.drop(request.session_hash)

    def tabs(self) -> set[str]:
        """The session hashes of the tabs whose pictures are held."""
        with self._lock:
            return set(self._lru.keys())
