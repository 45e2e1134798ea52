"""A live stream's prompt, written a temporal group at a time: token ids and unpruned positions exactly as the
upload of the same frames would have them (the HF processor writes the upload's), so that the kept tokens keep
the positions an upload's keep, and text after the video continues from the unpruned maximum + 1.

The stream's sequence is [system + the first user turn's opening (+ the video's opening marker)] then each
group as the processor writes it (Qwen3-VL: `<t seconds><|vision_start|>` + pads + `<|vision_end|>`; Qwen2.5-VL:
pads inside one `<|vision_start|>`...`<|vision_end|>`; Nemotron-H Omni: its frame labels + `<img>` + pads +
`</img>`, newline-joined). A question appends the tail: the video's close, then the rest of the chat text as an
upload with that question and history would write it after the video (engine/prompt/unpruned.py chat_text), so
earlier turns follow the video so far (docs/live.md, "Questions and follow-ups").
"""

from dataclasses import dataclass

import torch

from engine.families.base import Family, VideoFeatures, VideoInputs
from engine.prompt.pruned import PrunedPrompt
from engine.prompt.unpruned import chat_text

from .frames import MAX_TIME_S
from .window import LiveWindow


@dataclass
class GroupTokens:
    """One group's tokens as the upload's prompt has them: ids (n,) long; is_video (n,) bool, the h*w pads in
    raster order; positions (3, n) long, unpruned MRoPE t/h/w (each token's index for a family without rotary
    positions)."""

    ids: torch.Tensor
    is_video: torch.Tensor
    positions: torch.Tensor

    def kept(self, retention: torch.Tensor) -> "GroupTokens":
        """The tokens left when only the video tokens where retention (h*w,) bool is True are kept: every text
        token stays, and every token keeps its position."""
        keep = ~self.is_video
        keep[self.is_video] = retention.to(torch.bool).cpu()
        return GroupTokens(self.ids[keep], self.is_video[keep], self.positions[:, keep])


class LiveLayout:
    """The token layout of one live stream's window (engine/live/window.py). `prefix` and `tail` are pure (any
    thread); `group` advances the window's positions, so it is called in order, once per group, by the worker as
    each group is prefilled, and `restart` begins a new window (a key group first): its positions start again
    right after the prefix, as an upload's video does, while each group's text keeps its time from the stream's
    start.

    family: the model's; tokenizer: its processor's; video_token: the text the processor expands into the video
    (processor.video_token); video_token_id: the pad each video token is (Family.video_token_id); system: the
    system prompt; second_per_group: seconds of video per temporal group (temporal patch / fps; Qwen2.5-VL's
    temporal scale).
    """

    def __init__(
        self, family: Family, tokenizer, video_token: str, video_token_id: int, system: str, second_per_group: float
    ):
        self.family, self.tokenizer, self.system = family, tokenizer, system
        self.video_token_id, self.second_per_group = video_token_id, second_per_group
        before, _ = self._split(chat_text(family, system, "", []))
        self.opening, self.close = family.video_placeholder().split(video_token)
        self.prefix_ids = self._ids(before + self.opening)
        # Families whose groups share one run of positions (Qwen2.5-VL) place group g at the run's start plus its
        # temporal offset; the others start each group's run where the text before it ends.
        self._shared_run = len(family.video_runs((2, 1, 1))) == 1
        self.restart(0)

    def restart(self, start: int) -> None:
        """Begin a window whose first group is group `start` of the stream: positions go on from the prefix."""
        self._start = start
        self._text_position = self.prefix_ids.numel()  # the next text token's position (0..prefix is text)
        self._run_max = self._text_position - 1  # the largest position the shared run used so far

    @classmethod
    def of(cls, loaded, family: Family, system: str, fps: float) -> "LiveLayout":
        """The layout of a stream sampled at fps for the loaded model (its processor's tokenizer and video token),
        with the system prompt the engine serves it with."""
        processor = loaded.processor
        return cls(
            family,
            processor.tokenizer,
            processor.video_token,
            family.video_token_id(loaded.model.config),
            system,
            family.temporal_patch / fps,
        )

    def _split(self, text: str) -> tuple[str, str]:
        """The chat text before and after the video's placeholder."""
        before, placeholder, after = text.partition(self.family.video_placeholder())
        assert placeholder, "the chat text holds the video placeholder"
        return before, after

    def _ids(self, text: str) -> torch.Tensor:
        return torch.tensor(self.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)

    @property
    def prefix_positions(self) -> torch.Tensor:
        """(3, P): the prefix is text, its positions its indices."""
        return torch.arange(self.prefix_ids.numel()).expand(3, -1).clone()

    @property
    def prefix(self) -> GroupTokens:
        """The stream's prefix (system turn and the user turn's opening) as tokens: all text."""
        ids = self.prefix_ids
        return GroupTokens(ids, torch.zeros(ids.numel(), dtype=torch.bool), self.prefix_positions)

    def group(self, index: int, times_s: list[float], grid_hw: tuple[int, int]) -> GroupTokens:
        """Group `index` of the stream (its frames captured times_s seconds after the stream's first frame; h*w
        tokens) with its unpruned positions in the window; the window's positions move past it. Its text is the
        family's for that group of the stream (times from the stream's start), written as a video's first group
        when it opens the window."""
        h, w = grid_hw
        in_window = index - self._start
        before, after = self.family.live_group_text(index, times_s, first=in_window == 0)
        before_ids, after_ids = self._ids(before), self._ids(after)
        ids = torch.cat([before_ids, torch.full((h * w,), self.video_token_id, dtype=torch.long), after_ids])
        is_video = torch.zeros(ids.numel(), dtype=torch.bool)
        is_video[before_ids.numel() : before_ids.numel() + h * w] = True
        # The family's own positions of this group alone, then moved to where the group sits in the stream.
        group_alone = VideoInputs(torch.zeros(0), torch.zeros(3), (1, h, w), self.second_per_group)
        positions = self.family.full_positions(is_video, [group_alone])
        if self._shared_run:
            positions = positions + self.prefix_ids.numel()
            positions[0] += self.family.temporal_offsets(in_window + 1, self.second_per_group)[in_window]
            self._run_max = max(self._run_max, int(positions.max()))
        else:
            positions = positions + self._text_position
            self._text_position = int(positions.max()) + 1
        return GroupTokens(ids, is_video, positions)

    def window(self, span_groups: int | None, window_tokens: int, grid_hw: tuple[int, int]) -> LiveWindow:
        """The window of a stream of groups of h*w tokens, for a checkpoint that reads span_groups groups (None: no
        span) and a state of at most window_tokens tokens counted whole: the prefix, then each group at the most it
        may take (every video token, and its text written at the latest time a stream can reach: MAX_TIME_S each
        side of the first frame, the most digits), so that the state never holds more, a still screen's groups,
        which keep no video yet each bring their text, included."""
        latest_s = 2 * MAX_TIME_S
        times = [latest_s] * self.family.temporal_patch
        before, after = self.family.live_group_text(int(latest_s / self.second_per_group), times, first=False)
        most = self._ids(before).numel() + grid_hw[0] * grid_hw[1] + self._ids(after).numel()
        return LiveWindow.of(span_groups, window_tokens - self.prefix_ids.numel(), most)

    def tail(self, question: str, history: list[tuple[str, str]], thinking: bool) -> torch.Tensor:
        """(T,) ids of what a question appends to the stream: the video's close, the earlier turns and the
        question, and the opening of the answer (thinking: the chat template's enable_thinking)."""
        _, after = self._split(chat_text(self.family, self.system, question, history, thinking))
        return self._ids(self.close + after)

    def tail_positions(self, tokens: int) -> torch.Tensor:
        """(3, tokens): the tail's positions, the text after the video, from the unpruned maximum + 1."""
        start = self._run_max + 1 if self._shared_run else self._text_position
        return (torch.arange(tokens) + start).expand(3, -1).clone()

    def tail_tokens(self, tail_ids: torch.Tensor) -> GroupTokens:
        """A question's tail (`tail`'s ids) as tokens after the window laid out so far: all text."""
        return GroupTokens(
            tail_ids, torch.zeros(tail_ids.numel(), dtype=torch.bool), self.tail_positions(tail_ids.numel())
        )


def window_prompt(
    parts: list[GroupTokens],
    state_tokens: int,
    retention: torch.Tensor,
    dissimilarity: torch.Tensor,
    features: VideoFeatures | None = None,
) -> PrunedPrompt:
    """A question about a live window as the language model receives it: parts, the prefix, the window's groups
    (as kept) and the question's tail, in order; state_tokens of them are in the session's state already (the
    prefix and the groups), so a question forks there. retention (T*h*w,) bool and dissimilarity (T, h, w): the
    window's groups' (its key group all kept). features: the kept video features, for a caller that prefills the
    whole prompt (training, a cold question); None when the state holds them (engine/worker/live.py)."""
    ids = torch.cat([part.ids for part in parts])
    rows = torch.cat([part.positions for part in parts], dim=1)
    return PrunedPrompt(
        input_ids=ids,
        positions=torch.cat([torch.arange(ids.numel())[None], rows]),
        visual_mask=torch.cat([part.is_video for part in parts]),
        audio_mask=torch.zeros(ids.numel(), dtype=torch.bool),
        features=features,
        prefix_len=state_tokens,
        reply_start=ids.numel(),  # nothing is stored for a follow-up: it forks the stream anew
        next_position=int(rows[:, -1].max()) + 1,
        retention=[retention],
        dissimilarity=[dissimilarity],
    )
