"""The worker's side of live sessions: each session's groups through the shared vision forward, causal EVS, and
prefill into the session's own state between everyone else's work; the window sliding past its span, rebuilt
from its key group (engine/live/window.py); a question forking the state at the stream's current end; a watch's
ask made when a group that changed enters the state (docs/live.md).

Only the worker thread calls it, as the runner. Sessions arrive from callers' threads through a queue and tell
their groups through their own lock (engine/live/session.py).
"""

import collections
import logging
import queue
import time
from dataclasses import dataclass

import torch

import pruning
from engine.families.base import Family, VideoFeatures, VideoInputs
from engine.live.group import LiveGroup
from engine.live.layout import GroupTokens, LiveLayout, window_prompt
from engine.live.session import FAILED, MAX_GROUPS_BEHIND, LiveSession
from engine.live.watch import Watch
from engine.live.window import LiveWindow
from engine.scheduling.request import Request
from engine.state.lm_state import cache_of, new_cache, state_of
from engine.stats import video_entry

from .lm import LMInput, embed_prompt, lm_logits

log = logging.getLogger(__name__)

# A group's text tokens, as the prefill budget counts them before the group is laid out (Qwen3-VL's
# `<t seconds>` and markers are about 10, Nemotron-H Omni's frame labels about 40: the budget is approximate).
GROUP_TEXT_TOKENS = 16


@dataclass
class HeldGroup:
    """A group in a session's window: what EVS decided for it, its kept features (to lay the window out again
    when it slides) and, while it may open a window (a key group), its whole features; once laid out in the
    state, its tokens there (ids, positions)."""

    group: LiveGroup  # index, times_s, grid_hw; its pixels and features are let go once it is decided
    retention: torch.Tensor  # (h*w,) bool, as causal EVS decided it
    dissimilarity: torch.Tensor  # (h, w) float32
    kept: VideoFeatures  # the rows of retention
    whole: VideoFeatures | None  # every row, for a key group; None otherwise or once it can no longer open a window
    tokens: GroupTokens | None = None
    opens: bool = False  # it opens the window: laid out whole

    @property
    def index(self) -> int:
        return self.group.index

    @property
    def time_s(self) -> float:
        """The group's centre, seconds after the stream's first frame (as an upload's timestamps_s)."""
        return (self.group.times_s[0] + self.group.times_s[-1]) / 2

    @property
    def shown(self) -> torch.Tensor:
        """(h*w,) bool: the tokens the window shows, all of a group that opens it."""
        return torch.ones_like(self.retention) if self.opens else self.retention

    @property
    def features(self) -> VideoFeatures:
        return self.whole if self.opens else self.kept

    @property
    def video_tokens(self) -> int:
        return int(self.shown.sum())


class LiveStream:
    """One session as the worker holds it: its groups waiting for the vision forward (`waiting`) and for prefill
    (`decided`), its causal EVS, its layout, and its state: the prefix, then the groups `held` in the KV, in order.
    """

    def __init__(self, session: LiveSession, layout: LiveLayout, still: pruning.CausalStill | None):
        self.session, self.layout = session, layout
        self.rule = pruning.CausalEVS(session.params.pruning_rate, floor=session.evs_floor)
        self.still = still  # the still-unit rule when the session skips still patches
        self.previous_pixels = None  # the last group's pixel values, against which an exact repeat is found
        self.previous: VideoFeatures | None = None  # the last group's features, every unit's
        self.waiting: collections.deque[LiveGroup] = collections.deque()
        self.decided: collections.deque[HeldGroup] = collections.deque()
        self.held: collections.deque[HeldGroup] = collections.deque()  # the window, in the state
        self.window: LiveWindow | None = None  # once the first group's grid is known
        self.cache = None  # the session's Cache once its first group is in

    @property
    def tokens(self) -> int:
        """Tokens in the state (its KV slots): the prefix and every held group's, text and video."""
        return self.layout.prefix_ids.numel() + sum(group.tokens.ids.numel() for group in self.held)

    @property
    def held_video_tokens(self) -> int:
        return sum(group.video_tokens for group in self.held)


class LiveRunner:
    """Every live session of one engine, on the worker's side.

    model, family: the loaded model's; layer_kinds: its language model's (engine/state/lm_state.py); reuse:
    EngineConfig.vision_reuse; levels: the processor's pixel levels (Family.pixel_levels), for the still rule.
    """

    def __init__(self, model, family: Family, layer_kinds: tuple[str, ...], reuse: bool, levels):
        self.model, self.family, self.layer_kinds = model, family, layer_kinds
        self.reuse, self.levels = reuse, levels
        self.streams: dict[int, LiveStream] = {}
        self._arrivals: queue.SimpleQueue = queue.SimpleQueue()
        self._turn = 0  # where the next prefill round starts among the sessions, so that none waits on the others
        self._due: list[Watch] = []  # watches due an ask, in the order they became due

    # --- from callers' threads ----------------------------------------------------------------------------
    def open(self, session: LiveSession, layout: LiveLayout) -> None:
        skip = session.params.skip_still_patches and self.family.skips_still_patches
        still = pruning.CausalStill(pruning.STILL_THRESHOLD_LEVELS, self.levels) if skip else None
        self._arrivals.put(LiveStream(session, layout, still))

    # --- each iteration ---------------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Take in new sessions and their new groups; drop the state of sessions that ended."""
        while True:
            try:
                stream = self._arrivals.get_nowait()
            except queue.Empty:
                break
            self.streams[stream.session.id] = stream
        for key, stream in list(self.streams.items()):
            if stream.session.ended:
                del self.streams[key]  # its cache and groups go with it
                stream.session.freed()
            else:
                stream.waiting.extend(stream.session.take_pending())
                if stream.held:  # a watch opened on a stream that has video is asked for its first answer
                    groups = stream.held[-1].index + 1
                    self._due += [
                        w for w in stream.session.watches() if w.due and w not in self._due and w.saw(False, groups)
                    ]

    @property
    def busy(self) -> bool:
        """Whether any session has a group to encode or prefill."""
        return any(stream.waiting or stream.decided for stream in self.streams.values())

    def vision_work(self) -> list[LiveGroup]:
        """Groups to encode, oldest first and taking turns among the sessions (each session's in order); a session
        whose decided groups wait for prefill gets no more until they are in, so that features stay bounded."""
        queues = [
            list(stream.waiting)[: max(0, MAX_GROUPS_BEHIND - len(stream.decided))] for stream in self.streams.values()
        ]
        taking_turns = []
        for depth in range(max(map(len, queues), default=0)):
            taking_turns += [waiting[depth] for waiting in queues if depth < len(waiting)]
        return taking_turns

    def plan(self, groups: list[LiveGroup]) -> None:
        """Which units of each group the vision forward encodes (group.encoded), decided causally in each stream's
        order as engine/prompt/units.py decides an upload's: none of an exact repeat of the group before, with
        skipping only those that changed since they were last encoded, else all."""
        for group in groups:
            stream = self._stream_of(group)
            units = group.pixel_values.shape[0] // (group.grid_hw[0] * group.grid_hw[1])
            if stream is not None and stream.still is not None:
                whole = VideoInputs(group.pixel_values, group.grid_thw_patches, (1, *group.grid_hw), 0.0)
                group.encoded = stream.still.add(self.family.unit_pixels(whole)[0])
            elif stream is not None and self.reuse and stream.previous_pixels is not None:
                repeat = torch.equal(group.pixel_values, stream.previous_pixels)
                group.encoded = torch.full((group.pixel_values.shape[0] // units,), not repeat)
            else:
                group.encoded = torch.ones(group.pixel_values.shape[0] // units, dtype=torch.bool)
            if stream is not None:
                stream.previous_pixels = group.pixel_values

    def encoded(self, groups: list[LiveGroup]) -> None:
        """The vision forward gave these groups the features of their encoded units: each unit not encoded takes the
        last encoded one's at its place, and causal EVS decides each group, in each stream's order (among its
        encoded units when skipping still patches)."""
        for group in groups:
            stream = self._stream_of(group)
            if stream is None:
                continue
            stream.waiting.remove(group)
            try:
                stream.previous = features = _carried(stream.previous, group.features, group.encoded)
                retention, dissimilarity = stream.rule.add(features.embeds, group.grid_hw)
                if stream.still is not None:
                    retention = retention & group.encoded.to(retention.device)
            except Exception:
                log.exception("live session %d: EVS failed", stream.session.id)
                self._fail(stream)
                continue
            if stream.window is None:
                session = stream.session
                stream.window = stream.layout.window(session.span_groups, session.window_tokens, group.grid_hw)
            group.retention, group.dissimilarity = retention.cpu(), dissimilarity.cpu()
            whole = features if stream.window.is_key(group.index) else None
            held = HeldGroup(group, group.retention, group.dissimilarity, features.select(retention), whole)
            stream.decided.append(held)
            stream.session.decided(group)  # it counts the group's vision patches: its pixels are let go after
            group.features = group.pixel_values = None  # the features live on in `held`; the pixels are done

    def failed(self, groups: list[LiveGroup]) -> None:
        """The vision forward these groups were in failed: their sessions end with a sentence."""
        for group in groups:
            if (stream := self._stream_of(group)) is not None:
                self._fail(stream)

    def _stream_of(self, group: LiveGroup) -> LiveStream | None:
        return next((s for s in self.streams.values() if group in s.waiting), None)

    def _fail(self, stream: LiveStream) -> None:
        stream.session.end(FAILED)
        self.streams.pop(stream.session.id, None)
        stream.session.freed()

    def prefill(self, budget: int) -> int:
        """Prefill decided groups into their sessions' states, taking turns, until `budget` tokens are spent (at
        least one session's, so that live sessions never starve behind uploads); returns the tokens prefilled."""
        streams = [s for s in self.streams.values() if s.decided]
        if not streams:
            return 0
        self._turn %= len(streams)
        spent = 0
        for stream in streams[self._turn :] + streams[: self._turn]:
            groups = self._within(stream, budget - spent, first=spent == 0)
            if not groups:
                break
            try:
                spent += self._prefill_groups(stream, groups)
            except Exception:
                log.exception("live session %d: prefill failed", stream.session.id)
                self._fail(stream)
        self._turn += 1
        return spent

    def _within(self, stream: LiveStream, budget: int, first: bool) -> list[HeldGroup]:
        """The stream's oldest decided groups whose tokens fit budget (at least one when first); a slide of the
        window counts the window it lays out again."""
        groups, tokens = [], 0 if stream.cache is not None else stream.layout.prefix_ids.numel()
        for held in stream.decided:
            tokens += int(held.retention.sum()) + GROUP_TEXT_TOKENS
            if stream.held and stream.window.start(held.index + 1) > stream.held[0].index:
                tokens += stream.tokens
            if tokens > budget and (groups or not first):
                break
            groups.append(held)
        return groups

    def _prefill_groups(self, stream: LiveStream, groups: list[HeldGroup]) -> int:
        """The stream's next groups into its state: appended to the window in one forward, or, when the window
        slides past its span, the window laid out again from its new key group (whole) and prefilled afresh with
        the prefix, so the state is always exactly a prefill of the window. Returns the tokens prefilled."""
        layout, window = stream.layout, stream.window
        start = window.start(groups[-1].index + 1)
        slides = stream.cache is None or start > stream.held[0].index
        if slides:
            shown = [held for held in [*stream.held, *groups] if held.index >= start]
            for held in shown:
                held.opens = held.index == start
            layout.restart(start)
            stream.cache, begin, fed = new_cache(self.layer_kinds), 0, shown
        else:
            begin, fed = stream.tokens, [held for held in groups if held.index >= start]
        for held in fed:
            held.tokens = layout.group(held.index, held.group.times_s, held.group.grid_hw).kept(held.shown)
        parts = [held.tokens for held in fed]
        if slides:
            parts.insert(0, layout.prefix)
            stream.held = collections.deque(shown)
        else:
            stream.held.extend(fed)
        fed_tokens = self._forward(stream, parts, fed, begin)
        now = time.perf_counter()
        for held in groups:
            stream.decided.popleft()
            stream.session.entered_state(held.group, stream.held_video_tokens, stream.tokens, now)
        self._watch(stream, groups)
        return fed_tokens

    def _watch(self, stream: LiveStream, groups: list[HeldGroup]) -> None:
        """Groups entered the state: each watch of the session learns whether anything in view changed beyond the
        noise floor (the stream's first group counts as a change), and is due an ask if so."""
        floor = stream.session.noise_floor
        changed = any(held.index == 0 or bool((held.dissimilarity > floor).any()) for held in groups)
        for watch in stream.session.watches():
            if watch.saw(changed, groups[-1].index + 1) and watch not in self._due:
                self._due.append(watch)

    def take_due(self) -> list[Watch]:
        """The watches due an ask since the last call (still open)."""
        due, self._due = self._due, []
        return [watch for watch in due if watch.due]

    def _forward(self, stream: LiveStream, parts: list[GroupTokens], fed: list[HeldGroup], begin: int) -> int:
        """One forward of parts (the groups fed, in order, and maybe the prefix first) into the stream's state from
        KV slot begin; returns the tokens fed."""
        ids = torch.cat([part.ids for part in parts])
        if not ids.numel():  # Qwen2.5-VL's groups have no text of their own: one that keeps no token has nothing
            return 0
        video_mask = torch.cat([part.is_video for part in parts])
        rows = torch.cat([part.positions for part in parts], dim=1)
        positions = torch.cat([torch.arange(begin, begin + ids.numel())[None], rows])[:, None].to(self.model.device)
        features = VideoFeatures.joined([held.features for held in fed])
        embeds = embed_prompt(self.model, ids, video_mask, features)
        batch = LMInput(embeds[None], positions, None, video_mask[None].to(self.model.device), features.deepstack)
        lm_logits(self.model, self.family, batch, stream.cache)
        return ids.numel()

    # --- questions --------------------------------------------------------------------------------------------
    def ready(self, request: Request) -> bool:
        """Whether a live question can be forked: every group pushed before it was asked is in its session's
        state (an upload is always ready; so is a question whose session is gone, to be ended)."""
        if request.live is None:
            return True
        stream = self.streams.get(request.live.session_id)
        return stream is None or stream.session.groups_in_state >= request.live.groups

    def gone(self, request: Request) -> bool:
        """Whether request is a live question whose session has ended before it was forked (a forked one has its
        own state, `pruned` among it, and goes on)."""
        return request.live is not None and request.pruned is None and request.live.session_id not in self.streams

    def fork(self, request: Request) -> tuple[object, int]:
        """The question's own state: a copy of its session's at the stream's current end (KV up to it, the
        recurrent layers' state there), and its pruned prompt: the held stream then the question's tail, every
        token at its position. Returns (cache, tokens of the stream in it)."""
        stream = self.streams[request.live.session_id]
        layout, held = stream.layout, list(stream.held)
        begin = stream.tokens
        parts = [layout.prefix, *(group.tokens for group in held), layout.tail_tokens(request.live.tail_ids)]
        retention = torch.cat([group.shown for group in held])
        request.pruned = window_prompt(parts, begin, retention, torch.stack([group.dissimilarity for group in held]))
        request.live_seen = (held[-1].index, held[-1].group.times_s[-1])
        h, w = held[-1].dissimilarity.shape
        stats = request.stats
        stats.frames_sampled = stream.session.groups_in_state * self.family.temporal_patch
        session = stream.session.stats()  # the stream's vision patches so far: the question encoded none itself
        stats.vision_patches_total, stats.vision_patches_encoded = (
            session["vision_patches_total"],
            session["vision_patches_encoded"],
        )
        stats.grid_thw, stats.video_tokens_total = [len(held), h, w], len(held) * h * w
        # The video held in the state, as one medium: its kept tokens are counted when the answer is done.
        stats.media = [
            video_entry(
                stats.video_tokens_total,
                stats.grid_thw,
                stats.frames_sampled,
                stats.sampled_fps,
                [held_group.time_s for held_group in held],
                stats.soundtrack,
            )
        ]
        return cache_of(state_of(stream.cache)), begin


def _carried(
    previous: VideoFeatures | None, encoded_rows: VideoFeatures | None, encoded: torch.Tensor
) -> VideoFeatures:
    """A live group's features, (h*w, D) every level: its encoded units' rows (encoded_rows, in raster order; None
    when it encoded none) where encoded (h*w,) bool, the previous group's features elsewhere (previous is None only
    before the first group, which is encoded whole)."""
    if previous is None or bool(encoded.all()):
        return encoded_rows
    if encoded_rows is None:
        return previous
    both = torch.stack([torch.ones_like(encoded), encoded.cpu()])
    carried = VideoFeatures.joined([previous, encoded_rows]).carried(both)
    return carried.select(torch.arange(2 * encoded.numel(), device=carried.embeds.device) >= encoded.numel())
