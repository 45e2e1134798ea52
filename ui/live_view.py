"""What the Live tab shows of a feed's live session as it happens (docs/live.md, "The Live tab"): one line of its
numbers (tokens held against the window, lag, the last answer's TTFT), kept tokens per second as a plot over
time, and the newest groups with their dropped patches dimmed (ui/overlays.py, as the Video tab's frames)."""

import collections

import gradio as gr

from engine.stream import EvsPicture
from ui import figures, frame_files, overlays

# The plot's points: one a status update (about a second), five minutes of them.
HISTORY_POINTS = 300
# Tokens per second are counted over this many seconds before each point: a group enters about once a second at
# the default 2 fps, so a one-second count would jump between 0 and a group's tokens.
RATE_WINDOW_S = 5.0


class LiveView:
    """One session's numbers over time, as the tab's status updates sample them.

    history: (seconds since the session opened, kept video tokens per second, video tokens per second before
    pruning), one point per update that saw a change; ttft_s: the last answer's time to first token."""

    def __init__(self, opened_s: float):
        self.opened_s = opened_s  # time.monotonic() when the session opened
        self.history: collections.deque[tuple[float, float, float]] = collections.deque(maxlen=HISTORY_POINTS)
        self.ttft_s: float | None = None
        # (time.monotonic(), kept, total) at the samples of the last RATE_WINDOW_S
        self._samples: collections.deque[tuple[float, int, int]] = collections.deque()
        self._shown: tuple | None = None  # the picture's times and kept tokens, when last sent

    def sample(self, stats: dict, now_s: float) -> None:
        """Add a point of tokens per second over the last RATE_WINDOW_S (none at the first sample: it has nothing
        before)."""
        kept, total = stats["video_tokens_kept"], stats["video_tokens_total"]
        while len(self._samples) > 1 and self._samples[1][0] <= now_s - RATE_WINDOW_S:
            self._samples.popleft()
        if self._samples and now_s > self._samples[0][0]:
            then_s, kept_then, total_then = self._samples[0]
            seconds = now_s - then_s
            self.history.append((now_s - self.opened_s, (kept - kept_then) / seconds, (total - total_then) / seconds))
        self._samples.append((now_s, kept, total))

    def figure(self):
        """The kept tokens per second plot, or gr.skip() before its first point."""
        if not self.history:
            return gr.skip()
        times, kept, total = zip(*self.history)
        return figures.live_tokens_figure(list(times), list(kept), list(total))

    def gallery(self, picture: EvsPicture | None):
        """The newest groups, dropped patches dimmed, as gallery files; gr.skip() when they have not changed."""
        if picture is None:
            return gr.skip()
        shown = (tuple(picture.timestamps_s), picture.kept_mask.tobytes())
        if shown == self._shown:
            return gr.skip()
        self._shown = shown
        return frame_files.saved(overlays.frame_gallery(picture))


def stats_line(stats: dict, ttft_s: float | None) -> str:
    """The session's numbers in one line: its q, tokens held against the window (and the video tokens of them),
    the share kept, lag p50/p95, frames dropped, the last answer's TTFT."""
    held, window, video = stats["kv_tokens_held"], stats["window_tokens"], stats["video_tokens_held"]
    parts = [
        f"q = {stats['pruning_rate']:g}",
        f"held {held:,} of {window:,} tokens ({100 * held / window:.0f}% of the window; {video:,} video)"
        if window
        else f"held {held:,} tokens ({video:,} video)",
    ]
    if stats["video_tokens_total"]:
        parts.append(f"kept {stats['video_tokens_kept']:,} of {stats['video_tokens_total']:,}")
    lag = stats["lag_s"]
    if lag["p50"] is not None:
        parts.append(f"lag p50 {lag['p50']:.2f} s, p95 {lag['p95']:.2f} s")
    if stats["frames_dropped"]:
        parts.append(f"{stats['frames_dropped']} frames dropped (the server was behind)")
    if ttft_s is not None:
        parts.append(f"last answer's TTFT {ttft_s:.2f} s")
    return " · ".join(parts)
