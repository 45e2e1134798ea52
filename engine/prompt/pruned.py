"""Prune one prepared prompt: the retention mask of the request's method, the pruned token layout and its
positions. Only video tokens are pruned: text and audio tokens are all kept."""

from dataclasses import dataclass

import torch

import pruning
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
    retention: (T*h*w,) bool mask of the pruning method. dissimilarity: (T, h, w) float32, EVS's change since the
    previous group (shown in the pruning picture whichever method chose the tokens).
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
        return pruning.tokens_kept_per_group(self.retention, (T, *self.dissimilarity.shape[1:])).tolist()


def prune_prompt(prompt: UnprunedPrompt, features: VideoFeatures, q: float, method: str) -> PrunedPrompt:
    """Keep the video tokens `method` (one of pruning.PRUNING_METHODS) selects at rate q; every text and audio
    token stays."""
    dissimilarity = pruning.frame_dissimilarity(features.embeds, prompt.grid_thw)
    retention = pruning.retention_mask(features.embeds, prompt.grid_thw, q, method, dissimilarity)
    return pruned_with(prompt, features, retention, dissimilarity)


def pruned_with(prompt: UnprunedPrompt, features: VideoFeatures, retention: torch.Tensor,
                dissimilarity: torch.Tensor) -> PrunedPrompt:
    """The pruned prompt that keeps the video tokens where retention (T*h*w,) bool is True, whichever rule chose
    them (a request's pruning method, or the causal EVS a live stream is pruned with: pruning/causal.py);
    dissimilarity: (T, h, w), as the EVS picture shows it."""
    retention = retention.cpu()
    keep = pruning.prompt_keep_mask(prompt.is_video, retention)
    full_rows = torch.cat([torch.arange(prompt.input_ids.numel())[None], prompt.positions])
    return PrunedPrompt(
        input_ids=prompt.input_ids[keep],
        positions=pruning.select_positions(full_rows, keep),
        video_mask=prompt.is_video[keep],
        audio_mask=prompt.is_audio[keep],
        features=features.select(retention.to(features.embeds.device)),
        prefix_len=int(keep[: prompt.prefix_len].sum()),
        reply_start=int(keep[: prompt.reply_start].sum()),
        next_position=int(prompt.positions.max()) + 1,
        retention=retention,
        dissimilarity=dissimilarity.cpu(),
    )
