"""The worker's side of live sessions: each session's groups through the shared vision forward, causal EVS, and
prefill into the session's own state between everyone else's work; the oldest groups leaving the state past its
window; a question forking the state at the stream's current end (docs/live.md).

Only the worker thread calls it, as the runner. Sessions arrive from callers' threads through a queue and tell
their groups through their own lock (engine/live/session.py).
"""

import collections
import functools
import logging
import queue
import time
from dataclasses import dataclass

import torch

import pruning
from engine.families.base import Family, VideoFeatures, VideoInputs
from engine.live.layout import GroupTokens, LiveLayout
from engine.live.session import FAILED, MAX_GROUPS_BEHIND, LiveGroup, LiveSession
from engine.prompt.pruned import PrunedPrompt
from engine.scheduling.request import Request
from engine.state.lm_state import cache_of, drop_slots, new_cache, state_of

from .lm import LMInput, embed_prompt, lm_logits

log = logging.getLogger(__name__)

# A group's text tokens, as the prefill budget counts them before the group is laid out (Qwen3-VL's
# `<t seconds>` and markers are about 10, Nemotron-H Omni's frame labels about 40: the budget is approximate).
GROUP_TEXT_TOKENS = 16


@dataclass
class HeldGroup:
    """A group in a session's state: its kept tokens (ids, positions) and what EVS decided for it."""

    tokens: GroupTokens
    retention: torch.Tensor  # (h*w,) bool
    dissimilarity: torch.Tensor  # (h, w) float32
    time_s: float  # the group's centre, seconds after the stream's first frame (as an upload's timestamps_s)

    @functools.cached_property
    def video_tokens(self) -> int:
        return int(self.tokens.is_video.sum())


class LiveStream:
    """One session as the worker holds it: its groups waiting for the vision forward (`waiting`) and for prefill
    (`decided`), its causal EVS, its layout, and its state: the prefix, then the groups `held` in the KV, in order.
    """

    def __init__(self, session: LiveSession, layout: LiveLayout, still: pruning.CausalStill | None):
        self.session, self.layout = session, layout
        self.rule = pruning.CausalEVS(session.params.pruning_rate)
        self.still = still  # the still-unit rule when the session skips still patches
        self.previous_pixels = None  # the last group's pixel values, against which an exact repeat is found
        self.previous: VideoFeatures | None = None  # the last group's features, every unit's
        self.waiting: collections.deque[LiveGroup] = collections.deque()
        self.decided: collections.deque[LiveGroup] = collections.deque()
        self.held: collections.deque[HeldGroup] = collections.deque()
        self.cache = None  # the session's Cache once its first group is in
        self.held_video_tokens = 0
        self.held_group_tokens = 0  # every held group's tokens, its text with its kept video

    @property
    def tokens(self) -> int:
        """Tokens in the state (its KV slots): the prefix and every held group's."""
        return self.layout.prefix_ids.numel() + self.held_group_tokens


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
            group.retention, group.dissimilarity = retention.cpu(), dissimilarity.cpu()
            group.kept, group.features = features.select(retention), None
            stream.decided.append(group)
            stream.session.decided(group)

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

    def _within(self, stream: LiveStream, budget: int, first: bool) -> list[LiveGroup]:
        """The stream's oldest decided groups whose tokens fit budget (at least one when first)."""
        groups, tokens = [], 0 if stream.cache is not None else stream.layout.prefix_ids.numel()
        for group in stream.decided:
            tokens += int(group.retention.sum()) + GROUP_TEXT_TOKENS
            if tokens > budget and (groups or not first):
                break
            groups.append(group)
        return groups

    def _prefill_groups(self, stream: LiveStream, groups: list[LiveGroup]) -> int:
        """One forward of the stream's next groups (with its prefix, the first time) into its state; the oldest
        groups leave it past the window. Returns the tokens prefilled."""
        layout = stream.layout
        parts = [layout.group(g.index, g.times_s, g.grid_hw).kept(g.retention) for g in groups]
        begin = stream.tokens if stream.cache is not None else 0  # the KV slot of the first token fed now
        if stream.cache is None:
            stream.cache = new_cache(self.layer_kinds)
            parts.insert(0, self._prefix(layout))
        ids = torch.cat([part.ids for part in parts])
        video_mask = torch.cat([part.is_video for part in parts])
        rows = torch.cat([part.positions for part in parts], dim=1)
        positions = torch.cat([torch.arange(begin, begin + ids.numel())[None], rows])[:, None].to(self.model.device)
        kept = [g.kept for g in groups]
        features = VideoFeatures(
            torch.cat([k.embeds for k in kept]), [torch.cat(levels) for levels in zip(*(k.deepstack for k in kept))]
        )
        if ids.numel():  # Qwen2.5-VL's groups have no text of their own: one that keeps no token has nothing
            embeds = embed_prompt(self.model, ids, video_mask, features)
            batch = LMInput(embeds[None], positions, None, video_mask[None].to(self.model.device), features.deepstack)
            lm_logits(self.model, self.family, batch, stream.cache)
        now = time.perf_counter()
        for group, part in zip(groups, parts[-len(groups) :]):
            stream.decided.popleft()
            held = HeldGroup(part, group.retention, group.dissimilarity, (group.times_s[0] + group.times_s[-1]) / 2)
            stream.held.append(held)
            stream.held_video_tokens += held.video_tokens
            stream.held_group_tokens += held.tokens.ids.numel()
            self._evict(stream)
            stream.session.entered_state(group, stream.held_video_tokens, stream.tokens, now)
        return ids.numel()

    def _evict(self, stream: LiveStream) -> None:
        """Past the session's window, which counts every token of the state (the prefix, each group's text and
        kept video), groups leave the KV: first the oldest that kept no video token (its time and markers alone),
        then the oldest. The rest keep their positions, and recurrent layers keep the state that has folded the
        groups in. Counting the text bounds a still screen, whose groups after the first keep no video token yet
        each bring a `<t seconds>`; taking those first keeps the last picture of it that was kept. The newest group
        always stays, and no more groups than the window has tokens: a Qwen2.5-VL group has no text, so one that
        keeps no video holds nothing in the KV, yet its bookkeeping here would pile up."""
        window, held = stream.session.window_tokens, stream.held
        while (stream.tokens > window or len(held) > window) and len(held) > 1:
            index = next((i for i in range(len(held) - 1) if not held[i].video_tokens), 0)
            start = stream.layout.prefix_ids.numel() + sum(held[i].tokens.ids.numel() for i in range(index))
            leaving = held[index]
            del held[index]
            drop_slots(stream.cache, start, start + leaving.tokens.ids.numel())
            stream.held_video_tokens -= leaving.video_tokens
            stream.held_group_tokens -= leaving.tokens.ids.numel()

    @staticmethod
    def _prefix(layout: LiveLayout) -> GroupTokens:
        """The stream's prefix (system turn and the user turn's opening) as tokens: all text."""
        ids = layout.prefix_ids
        return GroupTokens(ids, torch.zeros(ids.numel(), dtype=torch.bool), layout.prefix_positions)

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
        layout, question = stream.layout, request.live
        begin = stream.tokens
        parts = [self._prefix(layout), *(held.tokens for held in stream.held)]
        tail = question.tail_ids
        parts.append(
            GroupTokens(tail, torch.zeros(tail.numel(), dtype=torch.bool), layout.tail_positions(tail.numel()))
        )
        ids = torch.cat([part.ids for part in parts])
        rows = torch.cat([part.positions for part in parts], dim=1)
        held = list(stream.held)
        h, w = held[-1].dissimilarity.shape
        request.pruned = PrunedPrompt(
            input_ids=ids,
            positions=torch.cat([torch.arange(ids.numel())[None], rows]),
            visual_mask=torch.cat([part.is_video for part in parts]),
            audio_mask=torch.zeros(ids.numel(), dtype=torch.bool),
            features=None,
            prefix_len=begin,
            reply_start=ids.numel(),  # nothing is stored for a follow-up: it forks the stream anew
            next_position=int(rows[:, -1].max()) + 1,
            retention=[torch.cat([group.retention for group in held])],
            dissimilarity=[torch.stack([group.dissimilarity for group in held])],
        )
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
            {
                "kind": "video",
                "tokens_total": stats.video_tokens_total,
                "tokens_kept": None,
                "grid_thw": stats.grid_thw,
                "frames_sampled": stats.frames_sampled,
                "sampled_fps": stats.sampled_fps,
                "timestamps_s": [held_group.time_s for held_group in held],
                "tokens_kept_per_frame": None,
                "soundtrack": stats.soundtrack,
                "audio_tokens": 0,
                "audio_seconds": 0.0,
            }
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
