"""Causal EVS for live video: each temporal group's tokens are chosen when the group arrives, never revised.

The offline rule (pruning/evs.py) keeps the K most changed tokens of the whole video, which needs the whole video.
A live stream has no end, so each group is judged against the recent past only (docs/live.md, "Causal EVS",
has the rules measured against each other):

- The session's first group is kept whole (it has no predecessor: dissimilarity +inf, as offline).
- Group t (t >= 1) keeps those of its tokens that the offline rule would keep if the video were only the
  trailing window: the last `window_groups` groups up to and including t (the first group left out, since it
  is kept whole anyway), with K = floor(n * h*w * (1 - q)) for a window of n groups, ranked by dissimilarity,
  ties to the earlier group and raster index, as offline.
- A token that did not change beyond the noise floor (dissimilarity at most `floor`: 0, exactly unchanged, unless
  the stream gives one) is not kept unless q = 0: it repeats the token before it, up to a camera's sensor and
  codec noise, and spending the rate on it starves the groups that do change when a still stretch ends.
- q = 0 keeps every token.

Over a stretch whose changes are spread (a real camera's noise), the window's top share is 1 - q of it, so the
kept fraction tracks 1 - q; a stretch of exactly unchanged tokens keeps less. The rule has no latency: a
group is decided from itself and the groups before it.
"""

import math
from fractions import Fraction

import torch

from pruning.evs import frame_dissimilarity
from pruning.inputs import parse_grid, validate_pruning_rate

WINDOW_GROUPS = 8  # the trailing window: 8 s at the default 2 fps, the length of clip the shapes models learned


def _check_window(window_groups) -> int:
    if isinstance(window_groups, bool) or not isinstance(window_groups, int) or window_groups < 1:
        raise ValueError(f"window_groups must be a positive integer; got {window_groups!r}.")
    return window_groups


def newest_group_mask(window: torch.Tensor, q: float, floor: float = 0.0) -> torch.Tensor:
    """The tokens of the window's last group that the rule keeps.

    window: (n, h*w) float32 dissimilarities of the trailing window's groups, oldest first, the group being
    decided last (never the session's first group). floor: the noise floor, a dissimilarity at or below which a
    token counts as unchanged. Returns (h*w,) bool on window's device.
    """
    n, tokens = window.shape
    if q == 0.0:
        return torch.ones(tokens, dtype=torch.bool, device=window.device)
    kept_in_window = math.floor(n * tokens * (1 - Fraction(repr(q))))
    # A stable descending sort keeps equal values in window order: ties go to the earlier group and raster index.
    order = torch.sort(window.reshape(-1), descending=True, stable=True).indices[:kept_in_window]
    newest = order[order >= (n - 1) * tokens] - (n - 1) * tokens
    mask = torch.zeros(tokens, dtype=torch.bool, device=window.device)
    mask[newest] = True
    return mask & (window[-1] > floor)


def causal_retention_mask_from_dissimilarity(
    dissimilarity: torch.Tensor, q, window_groups: int = WINDOW_GROUPS, floor: float = 0.0
) -> torch.Tensor:
    """The causal rule over a whole stream at once: (T, h, w) dissimilarity (group 0: the session's first) ->
    (T*h*w,) bool in raster order. Row block t depends on groups 0..t only, so it equals what `CausalEVS` decided
    when group t arrived."""
    q = validate_pruning_rate(q)
    window_groups = _check_window(window_groups)
    t, h, w = dissimilarity.shape
    flat = dissimilarity.to(torch.float32).reshape(t, h * w)
    mask = torch.ones(t, h * w, dtype=torch.bool, device=dissimilarity.device)
    for group in range(1, t):
        mask[group] = newest_group_mask(flat[max(1, group - window_groups + 1) : group + 1], q, floor)
    return mask.reshape(-1)


def causal_retention_mask(
    features: torch.Tensor, grid_thw, q, window_groups: int = WINDOW_GROUPS, floor: float = 0.0
) -> torch.Tensor:
    """The causal rule over a whole stream's features: (T*h*w, D) rows in (t, h, w) raster order -> (T*h*w,)
    bool. What a live session keeps of the same groups, computed offline (tests, and a cold request that is to
    see what a live session saw)."""
    return causal_retention_mask_from_dissimilarity(
        frame_dissimilarity(features, parse_grid(grid_thw)), q, window_groups, floor
    )


class CausalEVS:
    """The causal rule for one live stream, a group at a time. Holds the previous group's features and the
    trailing window's dissimilarities: (window_groups - 1) * h*w floats and h*w * D features, whatever the
    stream's length.

    q: the stream's pruning rate, in [0, 1) (ValueError otherwise). floor: the noise floor (newest_group_mask).
    """

    def __init__(self, q, window_groups: int = WINDOW_GROUPS, floor: float = 0.0):
        self.q = validate_pruning_rate(q)
        self.window_groups = _check_window(window_groups)
        self.floor = float(floor)
        self._previous: torch.Tensor | None = None  # (h*w, D) the last group's features
        self._window: torch.Tensor | None = None  # (n, h*w) the last groups' dissimilarities, the first group never

    def add(self, features: torch.Tensor, grid_hw) -> tuple[torch.Tensor, torch.Tensor]:
        """Decide the next group: features (h*w, D) in raster order, grid_hw (h, w) in LLM tokens, the same for
        every group of the stream (ValueError otherwise). Returns ((h*w,) bool kept, (h, w) float32
        dissimilarity to the group before, +inf for the first)."""
        h, w = grid_hw
        if self._previous is not None and self._previous.shape != features.shape:
            raise ValueError(
                f"a group of {tuple(features.shape)} features follows one of "
                f"{tuple(self._previous.shape)}; every group of a stream has the same grid."
            )
        if self._previous is None:
            dissimilarity = frame_dissimilarity(features, (1, h, w))[0]
            self._previous = features
            return torch.ones(h * w, dtype=torch.bool, device=features.device), dissimilarity
        dissimilarity = frame_dissimilarity(torch.cat([self._previous, features]), (2, h, w))[1]
        newest = dissimilarity.reshape(1, h * w)
        window = newest if self._window is None else torch.cat([self._window, newest])
        self._window = window[-(self.window_groups - 1) :] if self.window_groups > 1 else None
        self._previous = features
        return newest_group_mask(window, self.q, self.floor), dissimilarity
