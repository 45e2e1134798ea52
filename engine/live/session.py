"""The live session a caller holds: frames in (`push`), questions out (`ask`), its stats, `close`.

Frames are checked and sampled on the caller's thread; each temporal group's pixels are made there too (the HF
processor on its frames), so the worker only encodes them. Everything past that is the worker's
(engine/worker/live.py): the group's vision forward with everyone else's, causal EVS, its prefill into the
session's state. The two sides share this object's counters and queue under its lock.
"""

import collections
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.config import FrameSampling, GenerationParams
from engine.errors import InputError, SessionEnded
from engine.families.base import Family
from engine.stream import EvsPicture, Stream

from .frames import CaptureClock, check_frame, check_time
from .group import LiveGroup, group_of
from .watch import Watch

# Groups formed and not yet in the session's state: past this many the engine is behind, and due frames are
# dropped instead of queued (4 s of video at 2 fps; a group's pixels are a few MB at the GPU's frame size).
MAX_GROUPS_BEHIND = 4
LAG_WINDOW_S = 60.0  # lag_s is over the groups that entered the state in the last minute
# The pruning picture (`recent_picture`) shows this many of the newest decided groups: enough to watch a change
# arrive, and a few hundred KB per session at the GPU's frame size (one frame per group kept).
RECENT_GROUPS = 4
CLOSED = "This live session is closed; open a new one to go on."
FAILED = "The live session failed on the server; please open a new one."

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LiveQuestion:
    """What a question asked of a live session carries to the worker (Request.live): its session, how many of
    the stream's groups had been formed when it was asked (it is forked once they are all in the state), its
    tail: the video's close, the earlier turns, the question and the answer's opening, as token ids (T,); and
    for a watch's ask, the watch (such an ask runs below users' questions and is dropped rather than queued)."""

    session_id: int
    groups: int
    tail_ids: torch.Tensor
    watch: Watch | None = None

    @property
    def tail_tokens(self) -> int:
        return self.tail_ids.numel()


@dataclass
class _Counts:
    frames_received: int = 0
    frames_sampled: int = 0
    frames_dropped: int = 0
    groups_formed: int = 0
    groups_in_state: int = 0
    video_tokens_total: int = 0
    video_tokens_kept: int = 0
    video_tokens_held: int = 0
    vision_patches_total: int = 0
    vision_patches_encoded: int = 0
    kv_tokens_held: int = 0
    lags: collections.deque = field(default_factory=collections.deque)  # (entered state at, lag in s)


class LiveSession:
    """A live stream the engine prepares for questions as it arrives. Made by `Engine.open_live`; also a context
    manager that closes it.

        with engine.open_live(GenerationParams(pruning_rate=0.7)) as live:
            live.push(frame, t_s)                 # (H, W, 3) uint8 RGB, its capture time in seconds
            answer = live.ask("What moves?").result()
            watch = live.watch("Is there a red shape?")   # asked again as the stream changes: watch.poll()

    session_id: the engine's number for it. params: its pruning rate, frame sampling and the defaults of its
    questions. window_tokens: most tokens its state holds, text and video (EngineConfig.live_window_tokens);
    span_groups: the most groups the checkpoint reads (its declared span; None: no span); noise_floor: the
    dissimilarity at or below which a token counts as unchanged for its watches (none is asked again for it);
    evs_floor: the one at or below which causal EVS keeps no token (LiveSessions.evs_floor).
    ask(session, question, history, params, groups): the engine's side of `ask`; watch(session,
    question, params): the engine's side of `watch`; wake(): tells the worker there is work; on_end(why): told once,
    when the session ends (why: CLOSED when its user closed it, else the server's sentence).
    """

    def __init__(
        self,
        session_id: int,
        loaded,
        family: Family,
        params: GenerationParams,
        sampling: FrameSampling,
        max_source_pixels: int,
        window_tokens: int,
        ask: Callable,
        wake: Callable,
        on_end: Callable[[str], None] | None = None,
        span_groups: int | None = None,
        noise_floor: float = 0.0,
        evs_floor: float = 0.0,
        watch: Callable | None = None,
    ):
        self.id, self.params, self.sampling = session_id, params, sampling
        self.window_tokens, self.span_groups, self.noise_floor = window_tokens, span_groups, noise_floor
        self.evs_floor = evs_floor
        self._watch = watch
        self._watches: list[Watch] = []
        self._loaded, self._family = loaded, family
        self._max_source_pixels = max_source_pixels
        self._min_side = family.token_side(loaded.processor)
        self._ask, self._wake, self._on_end = ask, wake, on_end
        self._lock = threading.Lock()
        self._in_state = threading.Condition(self._lock)  # notified as groups enter the state
        self._clock = CaptureClock(sampling.fps)
        self._last_s: float | None = None
        self._shape: tuple[int, ...] | None = None
        self._frames: list[tuple[np.ndarray, float]] = []  # sampled frames of the group being formed
        # Groups formed and not yet taken by the worker, by index: two pushers' groups may be made in either order
        # (each outside the lock), and the worker takes them in the stream's order only (take_pending).
        self._pending: dict[int, LiveGroup] = {}
        self._next_taken = 0  # the index of the next group the worker takes
        self._counts = _Counts()
        # The newest decided groups' (picture, centre time in s, kept (h, w) bool, dissimilarity (h, w) float16,
        # index): numpy copies, so that nothing here holds a group's features.
        self._recent: collections.deque[tuple] = collections.deque(maxlen=RECENT_GROUPS)
        self._ended: str | None = None  # why the session ended (CLOSED, or the server's sentence)
        self._freed = threading.Event()  # the worker has dropped the session's state (it counts until then)

    # --- the caller's side ---------------------------------------------------------------------------------
    def push(self, frame, t_s: float) -> None:
        """Give the session the frame captured at t_s seconds (any origin; later than the frame before). Returns
        at once: a frame is sampled by its capture time at the session's fps, or not, and when the engine is
        behind a due frame is dropped (stats: frames_dropped). InputError for a frame or time that is wrong, or
        a session that has ended."""
        pushed_at = time.perf_counter()  # the lag's start: the processor below is part of what a group waits for
        frame = check_frame(frame, self._max_source_pixels, self._min_side)
        with self._lock:
            if self._ended:
                raise SessionEnded(self._ended)
            t_s = check_time(t_s, self._last_s)
            if self._shape is not None and frame.shape != self._shape:
                raise InputError(
                    f"The frame is {frame.shape[1]}x{frame.shape[0]}, but this live session's frames are "
                    f"{self._shape[1]}x{self._shape[0]}; open a new session for another size."
                )
            self._shape, self._last_s = frame.shape, t_s
            counts = self._counts
            counts.frames_received += 1
            if not self._clock.due(t_s):
                return
            if counts.groups_formed - counts.groups_in_state >= MAX_GROUPS_BEHIND:
                counts.frames_dropped += 1
                return
            counts.frames_sampled += 1
            self._frames.append((frame, t_s - self._clock.start_s))
            if len(self._frames) < self._family.temporal_patch:
                return
            frames, self._frames = self._frames, []
            index = counts.groups_formed
            counts.groups_formed += 1
        try:  # the processor, outside the lock: the worker may read meanwhile
            group = self._group(index, frames, pushed_at)
        except Exception:
            log.exception("live session %d: preparing group %d failed", self.id, index)
            self.end(FAILED)
            raise RuntimeError(FAILED) from None
        with self._lock:
            if self._ended:
                return
            self._pending[index] = group
        self._wake()

    def _group(self, index: int, frames: list[tuple[np.ndarray, float]], pushed_at: float) -> LiveGroup:
        """The group's pixels, made by the HF processor as an upload's are (sized by the session's sampling)."""
        return group_of(self._loaded, self._family, self.sampling, index, frames, pushed_at)

    def ask(self, question: str, history=(), params: GenerationParams | None = None) -> Stream:
        """A question about the stream up to now (every group whose frames were pushed), answered in a Stream
        as `Engine.submit` answers; the stream goes on meanwhile. history: earlier (question, answer) turns,
        written after the video (docs/live.md). params: the answer's settings (max_new_tokens, temperature,
        thinking, ...); the rate and frame sampling are the session's. InputError as `submit`, and for a
        session that has no whole group yet; SessionEnded (an InputError) once it has ended."""
        with self._lock:
            groups = self._counts.groups_formed
        return self._ask(self, question, history, params or self.params, groups)

    def check_askable(self, groups: int) -> None:
        """SessionEnded once the session has ended, InputError while it has no whole group (`groups` is 0). The
        engine's side of `ask` checks it, so that the refusal is counted with the others."""
        if self._ended:
            raise SessionEnded(self._ended)
        if groups == 0:
            raise InputError(
                f"The live stream has no video yet: push at least {self._family.temporal_patch} frames "
                f"{1 / self.sampling.fps:g} s apart before asking."
            )

    def watch(self, question: str, params: GenerationParams | None = None) -> Watch:
        """A standing question: asked again each time something in view changed (at most once per temporal group),
        an event each time its answer changes (docs/live.md, "Watches"). params: its answers' settings, as ask's.
        InputError for a bad question or settings, a session that has ended, or more watches than the engine
        takes per session (EngineConfig.max_watches_per_session)."""
        watch = self._watch(self, question, params or self.params)
        self._wake()
        return watch

    def add_watch(self, watch: Watch, most: int) -> None:
        """Hold a new watch, unless `most` are open (InputError; the engine's side of `watch`)."""
        with self._lock:
            if self._ended:
                raise SessionEnded(self._ended)
            self._watches = [w for w in self._watches if not w.ended]
            if len(self._watches) >= most:
                raise InputError(
                    f"This live session already has {most} watches, as many as it takes; close one to add another."
                )
            self._watches.append(watch)

    def watches(self) -> list[Watch]:
        """The open watches, oldest first."""
        with self._lock:
            return [watch for watch in self._watches if not watch.ended]

    def forget_watch(self, watch: Watch) -> None:
        """A watch was closed."""
        with self._lock:
            self._watches = [w for w in self._watches if w is not watch and not w.ended]

    def group_picture(self, index: int) -> EvsPicture | None:
        """The pruning picture of group `index` alone while it is among the newest decided groups, else None."""
        with self._lock:
            recent = [entry for entry in self._recent if entry[4] == index]
        if not recent:
            return None
        picture, time_s, kept, dissimilarity, _ = recent[0]
        return EvsPicture(
            frames=picture[None],
            timestamps_s=[time_s],
            grid_thw=(1, *kept.shape),
            kept_mask=kept[None],
            dissimilarity=dissimilarity[None],
        )

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until every group formed so far is in the session's state (or the session has ended), at most
        timeout_s; True when it is. For a caller that plays a recording faster than real time and would rather
        wait than have frames dropped."""
        with self._lock:
            return self._in_state.wait_for(
                lambda: self._ended is not None or self._counts.groups_in_state >= self._counts.groups_formed, timeout_s
            )

    def stats(self) -> dict:
        """frames_received, frames_sampled, frames_dropped; video_tokens_total and video_tokens_kept (every group
        decided so far, before and after causal EVS); kv_tokens_held (every token in the state now: the prefix, each
        held group's text and kept video), video_tokens_held (the kept video tokens of them) and window_tokens (the
        most kv_tokens_held may be, but for a newest group larger than it alone); vision_patches_total and
        vision_patches_encoded (every group decided so far: its vision patches, and those the vision tower ran, not
        counting exact repeats of the group before and skipped still units); lag_s: {"p50", "p95"} seconds
        from the `push` call of a group's last frame (the HF processor's time on the pushing thread included) to the
        group in the state, over the last minute (None before any); pruning_rate; closed."""
        with self._lock:
            counts = self._counts
            self._forget_old_lags(time.perf_counter())
            lags = sorted(lag for _, lag in counts.lags)
            return {
                "frames_received": counts.frames_received,
                "frames_sampled": counts.frames_sampled,
                "frames_dropped": counts.frames_dropped,
                "video_tokens_total": counts.video_tokens_total,
                "video_tokens_kept": counts.video_tokens_kept,
                "video_tokens_held": counts.video_tokens_held,
                "kv_tokens_held": counts.kv_tokens_held,
                "vision_patches_total": counts.vision_patches_total,
                "vision_patches_encoded": counts.vision_patches_encoded,
                "window_tokens": self.window_tokens,
                "lag_s": {"p50": _percentile(lags, 0.5), "p95": _percentile(lags, 0.95)},
                "pruning_rate": float(self.params.pruning_rate),
                "closed": self._ended is not None,
            }

    def recent_picture(self) -> EvsPicture | None:
        """The pruning picture of the newest decided groups (at most RECENT_GROUPS, oldest first): each one's first
        frame as the model sees it, its centre time in seconds after the stream's first frame, and what causal EVS
        kept of it; None before any group is decided. The picture an upload's answer sends, of a stream's tail."""
        with self._lock:
            recent = list(self._recent)
        if not recent:
            return None
        pictures, times_s, kept, dissimilarity, _ = zip(*recent)
        return EvsPicture(
            frames=np.stack(pictures),
            timestamps_s=list(times_s),
            grid_thw=(len(recent), *kept[-1].shape),
            kept_mask=np.stack(kept),
            dissimilarity=np.stack(dissimilarity),
        )

    def close(self) -> None:
        """End the session: its state is freed at the worker's next step (answers already forked go on). Pushing
        or asking after it is an InputError. Closing twice is harmless."""
        self.end(CLOSED)

    def __enter__(self) -> "LiveSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- the engine's side -----------------------------------------------------------------------------------
    @property
    def ended(self) -> str | None:
        """Why the session ended (a sentence), or None while it runs."""
        return self._ended

    def end(self, why: str) -> bool:
        """End the session with `why`, the sentence push and ask raise from now on (SessionEnded: the engine's
        shutdown, a fault); True when this call ended it."""
        with self._lock:
            if self._ended:
                return False
            self._ended = why
            self._pending.clear()
            self._frames = []
            self._recent.clear()
            self._in_state.notify_all()
            watches, self._watches = self._watches, []
        for watch in watches:
            watch.end(why)
        self._wake()
        if self._on_end is not None:
            self._on_end(why)
        return True

    def take_pending(self) -> list[LiveGroup]:
        """The groups made since the worker last asked that come next in the stream, in order: a group made
        before an earlier one (by another pusher) waits for it (the worker's)."""
        with self._lock:
            groups = []
            while self._next_taken in self._pending:
                groups.append(self._pending.pop(self._next_taken))
                self._next_taken += 1
            return groups

    def freed(self) -> None:
        """The worker has dropped the ended session's state: it no longer counts against max_live_sessions."""
        self._freed.set()

    @property
    def state_freed(self) -> bool:
        return self._freed.is_set()

    def wait_freed(self, timeout_s: float) -> bool:
        """Block until the worker has dropped the session's state, at most timeout_s; True when it has."""
        return self._freed.wait(timeout_s)

    def decided(self, group: LiveGroup) -> None:
        """Causal EVS has decided the group (the worker's; nothing once the session has ended, so that its
        picture stays cleared)."""
        with self._lock:
            if self._ended:
                return
            self._counts.video_tokens_total += group.retention.numel()
            self._counts.video_tokens_kept += int(group.retention.sum())
            patches_per_unit = group.pixel_values.shape[0] // group.retention.numel()
            self._counts.vision_patches_total += group.pixel_values.shape[0]
            self._counts.vision_patches_encoded += int(group.encoded.sum()) * patches_per_unit
            self._recent.append(
                (
                    group.picture,
                    (group.times_s[0] + group.times_s[-1]) / 2,
                    group.retention.reshape(group.grid_hw).numpy(),
                    group.dissimilarity.numpy().astype(np.float16),
                    group.index,
                )
            )
        group.picture = None  # the copy above is the one kept

    def entered_state(self, group: LiveGroup, video_tokens: int, kv_tokens: int, now: float) -> None:
        """The group is in the session's state, which now holds kv_tokens tokens, video_tokens of them kept video
        tokens (the worker's)."""
        with self._lock:
            if self._ended:
                return
            counts = self._counts
            counts.groups_in_state = group.index + 1
            counts.video_tokens_held, counts.kv_tokens_held = video_tokens, kv_tokens
            counts.lags.append((now, now - group.pushed_at))
            self._forget_old_lags(now)
            self._in_state.notify_all()

    @property
    def groups_in_state(self) -> int:
        return self._counts.groups_in_state

    def _forget_old_lags(self, now: float) -> None:
        lags = self._counts.lags
        while lags and lags[0][0] < now - LAG_WINDOW_S:
            lags.popleft()


def _percentile(values: list[float], share: float) -> float | None:
    """The nearest-rank percentile of sorted values, None when there are none."""
    if not values:
        return None
    return values[max(0, math.ceil(share * len(values)) - 1)]
