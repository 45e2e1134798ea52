"""The language-model side of one forward: embeddings with video and audio features scattered in, explicit
positions, DeepStack injection, logits of the last position."""

from dataclasses import dataclass

import torch

from engine.families.base import Family, VideoFeatures


@dataclass
class LMInput:
    """A batch for one language-model forward.

    embeds: (B, L, D). positions: (4, B, L) long; row 0 is each row's contiguous 1-D position, rows 1-3
    MRoPE t/h/w. attention_mask: (B, past + L) long, 0 on left padding; None for a single unpadded row.
    visual_mask: (B, L) bool where media features sit (DeepStack adds there), or None.
    deepstack: per level, (visual_mask.sum(), D), or None.
    """

    embeds: torch.Tensor
    positions: torch.Tensor
    attention_mask: torch.Tensor | None = None
    visual_mask: torch.Tensor | None = None
    deepstack: list[torch.Tensor] | None = None


def embed_prompt(
    model,
    input_ids: torch.Tensor,
    visual_mask: torch.Tensor,
    features: VideoFeatures,
    audio_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """(L,) ids -> (L, D) embeddings with the kept media features in place of the media tokens (visual_mask:
    (L,) bool, one token per row, the media in order), and the audio features (when heard) in place of the audio
    tokens (audio_mask: (L,) bool, one token per row)."""
    embeds = model.get_input_embeddings()(input_ids.to(model.device))
    embeds[visual_mask.to(embeds.device)] = features.embeds.to(embeds.device, embeds.dtype)
    if features.audio is not None:
        embeds[audio_mask.to(embeds.device)] = features.audio.to(embeds.device, embeds.dtype)
    return embeds


def embed_tokens(model, token_ids: torch.Tensor) -> torch.Tensor:
    return model.get_input_embeddings()(token_ids.to(model.device))


def lm_logits(model, family: Family, batch: LMInput, cache) -> torch.Tensor:
    """Run the language model on batch, appending to cache; returns (B, V) float32 logits of the last position."""
    extra = family.language_kwargs(batch.visual_mask, batch.deepstack)
    out = family.text_model(model)(
        inputs_embeds=batch.embeds,
        position_ids=family.language_positions(batch.positions),
        attention_mask=batch.attention_mask,
        cache=cache,
        use_cache=True,
        **extra,
    )
    return family.lm_head(model)(out.last_hidden_state[:, -1]).float()
