"""Apply EVS to one prepared prompt: the retention mask, the pruned token layout and its positions. EVS prunes
video tokens only: text and audio tokens are all kept."""

from dataclasses import dataclass

import torch

import evs
from engine.families.base import VideoFeatures

from .unpruned import UnprunedPrompt


@dataclass
class PrunedPrompt:
    """What the language model receives for one request.

    input_ids: (L',) long. positions: (4, L') long; row 0 = arange(L'), rows 1-3 the unpruned MRoPE
    positions of the kept tokens. video_mask: (L',) bool where kept video features go. audio_mask: (L',) bool
    where the audio features go, one token per row of features.audio (none when the soundtrack was not heard).
    features: the kept rows of every feature level, and every audio row (None for a question asked of a live
    session: its video is already in the state it forks, engine/worker/live.py). prefix_len: kept tokens of
    [system + video (+ soundtrack)]. reply_start:
    kept tokens before the answer's opening (UnprunedPrompt.reply_start; all of it is text, so all kept).
    next_position: MRoPE position of the first generated token (unpruned maximum + 1).
    retention: (T*h*w,) bool EVS mask. dissimilarity: (T, h, w) float32.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    video_mask: torch.Tensor
    audio_mask: torch.Tensor
    features: VideoFeatures | None
    prefix_len: int
    reply_start: int
    next_position: int
    retention: torch.Tensor
    dissimilarity: torch.Tensor

    @property
    def tokens_kept_per_group(self) -> list[int]:
        T = self.dissimilarity.shape[0]
        return evs.tokens_kept_per_group(self.retention, (T, *self.dissimilarity.shape[1:])).tolist()


def prune_prompt(prompt: UnprunedPrompt, features: VideoFeatures, q: float) -> PrunedPrompt:
    """Keep the EVS-selected video tokens of prompt at rate q; every text and audio token stays."""
    dissimilarity = evs.frame_dissimilarity(features.embeds, prompt.grid_thw)
    return pruned_with(prompt, features, evs.retention_mask_from_dissimilarity(dissimilarity, q), dissimilarity)


def pruned_with(prompt: UnprunedPrompt, features: VideoFeatures, retention: torch.Tensor,
                dissimilarity: torch.Tensor) -> PrunedPrompt:
    """The pruned prompt that keeps the video tokens where retention (T*h*w,) bool is True, whichever rule chose
    them (the global EVS mask, or the causal one a live stream is pruned with: evs/causal.py); dissimilarity:
    (T, h, w), as the EVS picture shows it."""
    retention = retention.cpu()
    keep = evs.prompt_keep_mask(prompt.is_video, retention)
    full_rows = torch.cat([torch.arange(prompt.input_ids.numel())[None], prompt.positions])
    return PrunedPrompt(
        input_ids=prompt.input_ids[keep],
        positions=evs.select_positions(full_rows, keep),
        video_mask=prompt.is_video[keep],
        audio_mask=prompt.is_audio[keep],
        features=features.select(retention.to(features.embeds.device)),
        prefix_len=int(keep[: prompt.prefix_len].sum()),
        reply_start=int(keep[: prompt.reply_start].sum()),
        next_position=int(prompt.positions.max()) + 1,
        retention=retention,
        dissimilarity=dissimilarity.cpu(),
    )
