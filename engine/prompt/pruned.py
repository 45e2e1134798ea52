"""Prune one prepared prompt: the retention mask of the request's method, the pruned token layout and its
positions. Each video is pruned on its own, as if it were asked about alone (EVS: its first temporal group kept
whole, its K from its own token count); a still image's tokens, the text and the audio tokens are all kept."""

from dataclasses import dataclass

import torch

import pruning
from engine.families.base import VideoFeatures

from .unpruned import MediumPrompt, UnprunedPrompt


@dataclass
class PrunedPrompt:
    """What the language model receives for one request.

    input_ids: (L',) long. positions: (4, L') long; row 0 = arange(L'), rows 1-3 the unpruned MRoPE
    positions of the kept tokens. visual_mask: (L',) bool where the kept media features go. audio_mask: (L',)
    bool where the audio features go, one token per row of features.audio (none when no soundtrack was heard).
    features: the kept rows of every medium (every feature level) in order, and every audio row (None for a
    question asked of a live session: its video is already in the state it forks, engine/worker/live.py).
    prefix_len: kept tokens of [system + media (+ soundtracks)]. reply_start: kept tokens before the answer's
    opening (UnprunedPrompt.reply_start; all of it is text, so all kept).
    next_position: MRoPE position of the first generated token (unpruned maximum + 1).
    retention: per medium, (T*h*w,) bool mask of the pruning method (all True for an image). dissimilarity: per
    medium, (T, h, w) float32, EVS's change since the previous group (shown in the pruning picture whichever
    method chose the tokens; None for an image).
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    visual_mask: torch.Tensor
    audio_mask: torch.Tensor
    features: VideoFeatures | None
    prefix_len: int
    reply_start: int
    next_position: int
    retention: list[torch.Tensor]
    dissimilarity: list[torch.Tensor | None]

    def tokens_kept_per_group(self, medium: int) -> list[int]:
        """Kept tokens in each temporal group of the medium at that index (an image: one group, all kept)."""
        dissimilarity = self.dissimilarity[medium]
        if dissimilarity is None:
            return [int(self.retention[medium].sum())]
        return pruning.tokens_kept_per_group(self.retention[medium], tuple(dissimilarity.shape)).tolist()


def retention(
    medium: MediumPrompt, features: VideoFeatures, q: float, method: str, candidates: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(retention mask, dissimilarity) of one medium alone: a video's mask of `method` at rate q among candidates
    ((T*h*w,) bool, the tokens still in the prompt; None: all), an image kept whole. A token the vision tower did
    not encode has the features of the last encoded one at its place, so its dissimilarity is 0, and an encoded
    token's compares it with the last encoded feature at its place."""
    if medium.is_image:
        return torch.ones(medium.tokens, dtype=torch.bool), None
    dissimilarity = pruning.frame_dissimilarity(features.embeds, medium.grid_thw)
    mask = pruning.retention_mask(features.embeds, medium.grid_thw, q, method, dissimilarity, candidates)
    return mask.cpu(), dissimilarity.cpu()


def prune_prompt(
    prompt: UnprunedPrompt,
    features: list[VideoFeatures],
    q: float,
    method: str,
    candidates: list[torch.Tensor | None] | None = None,
) -> PrunedPrompt:
    """Keep the video tokens `method` (one of pruning.PRUNING_METHODS) selects in each video of prompt at rate q
    (features: one per medium, in order), among each one's candidates (EncodePlan.candidates: the tokens whose
    unit was encoded, when still units were skipped; None: all); every image, text and audio token stays."""
    candidates = candidates or [None] * len(prompt.media)
    masks, dissimilarities = zip(
        *(
            retention(medium, feats, q, method, allowed)
            for medium, feats, allowed in zip(prompt.media, features, candidates)
        )
    )
    return pruned_with(prompt, features, list(masks), list(dissimilarities))


def pruned_with(
    prompt: UnprunedPrompt,
    features: list[VideoFeatures],
    masks: list[torch.Tensor],
    dissimilarities: list[torch.Tensor | None],
) -> PrunedPrompt:
    """The pruned prompt that keeps each medium's tokens where its mask (T*h*w,) bool is True, whichever rule chose
    them (a request's pruning method, or the causal EVS a live stream is pruned with: pruning/causal.py);
    dissimilarities: each medium's (T, h, w), as the EVS picture shows it (None for an image)."""
    masks = [mask.cpu() for mask in masks]
    keep = pruning.prompt_keep_mask(prompt.is_visual, torch.cat(masks))
    full_rows = torch.cat([torch.arange(prompt.input_ids.numel())[None], prompt.positions])
    return PrunedPrompt(
        input_ids=prompt.input_ids[keep],
        positions=pruning.select_positions(full_rows, keep),
        visual_mask=prompt.is_visual[keep],
        audio_mask=prompt.is_audio[keep],
        features=VideoFeatures.joined([f.select(m.to(f.embeds.device)) for f, m in zip(features, masks)]),
        prefix_len=int(keep[: prompt.prefix_len].sum()),
        reply_start=int(keep[: prompt.reply_start].sum()),
        next_position=int(prompt.positions.max()) + 1,
        retention=list(masks),
        dissimilarity=list(dissimilarities),
    )
