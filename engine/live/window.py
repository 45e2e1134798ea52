"""What of a live stream a question sees: the window, the last groups the checkpoint can read, opened by a key group.

A session holds at most `groups` temporal groups: the checkpoint's trained span when it declares one (the offline
models learned 8-s clips: 8 groups at 2 fps), else as many whole groups, their text counted with their video, as
`EngineConfig.live_window_tokens` holds after the prefix (LiveLayout.window), so that a session costs what one
request's video does and a still screen, whose groups keep no video but each bring their text, is bounded too.
Past it the window slides, `key_every` groups at a time, and always starts at a key group (index a multiple of
`key_every`) that the model sees whole, as it sees an upload's first group: causal EVS kept only what changed of
it, and over a still scene that is nothing, so a slid window would otherwise hold no picture of what is in view
(docs/live.md, "The window", has the figures). The key group's whole features are kept from its arrival until it
can no longer open a window.

A slide rebuilds the window's state: the prefix, the key group whole, then the other groups as causal EVS kept
them, at positions from the prefix on (the window laid out as an upload of its frames), their text carrying
their times from the stream's start. So the state is exactly a cold prefill of the window, the positions stay
bounded however long the stream runs, and a slide costs one prefill of the window every `key_every` groups.
"""

import math
from dataclasses import dataclass

# A window slides this share of itself at a time: a rebuild prefills the window's kept tokens once per slide, so
# the window's prefill costs about KEY_SLIDES times a group's, and the model sees from (1 - 1/KEY_SLIDES) of the
# window to all of it. An 8-group window (the offline models') slides one group at a time.
KEY_SLIDES = 8


@dataclass(frozen=True)
class LiveWindow:
    """groups: the most temporal groups a session holds; key_every: how far the window slides at once, the key
    groups' spacing."""

    groups: int
    key_every: int

    @classmethod
    def of(cls, span_groups: int | None, window_tokens: int, tokens_per_group: int) -> "LiveWindow":
        """The window for a checkpoint that reads span_groups groups (None: no span declared) and a session whose
        groups may hold window_tokens tokens, each group being at most tokens_per_group of them (its h*w video
        tokens whole, and its text: engine/worker/live.py's session_window)."""
        groups = max(1, window_tokens // max(1, tokens_per_group))
        if span_groups is not None:
            groups = min(groups, max(1, span_groups))
        return cls(groups, max(1, groups // KEY_SLIDES))

    def start(self, groups: int) -> int:
        """The index of the window's first group (a key group) once `groups` groups of the stream are in it."""
        if groups <= self.groups:
            return 0
        return self.key_every * math.ceil((groups - self.groups) / self.key_every)

    def is_key(self, index: int) -> bool:
        """Whether group `index` may open a window (its whole features are kept while it may)."""
        return index % self.key_every == 0


def span_groups(span_s: float | None, fps: float, temporal_patch: int) -> int | None:
    """Temporal groups in span_s seconds of a stream sampled at fps (None for no span): 8 s at 2 fps, 2 frames a
    group, is 8."""
    if span_s is None:
        return None
    return max(1, math.floor(span_s * fps / temporal_patch + 1e-9))
