"""What a request's stream receives as it is served: status lines, the EVS picture, thinking and answer text,
and the done event with its final stats. No forwards here; the worker calls these at each stage."""

import time

import numpy as np
import torch

from engine.scheduling.request import Request
from engine.stream import Event, EvsPicture


def vision_started(served: list[Request], temporal_patch: int) -> None:
    """Tell each request in a vision forward how many frames it encodes (and whether its soundtrack) and with
    how many others."""
    for request in served:
        others = len(served) - 1
        frames = request.prompt.grid_thw[0] * temporal_patch
        sound = " and the soundtrack" if request.prompt.audio is not None else ""
        tail = f" (batched with {others} other request{'s' if others != 1 else ''})" if others else ""
        request.stream.push(Event("status", f"encoding {frames} frames{sound}{tail}"))


def pruned(request: Request, temporal_patch: int) -> None:
    """The EVS picture (what the model sees of the video), sent once before the first token."""
    T, h, w = request.prompt.grid_thw
    picture = EvsPicture(
        frames=request.video.frames[::temporal_patch][:T],
        timestamps_s=request.prompt.timestamps_s,
        grid_thw=(T, h, w),
        kept_mask=request.pruned.retention.reshape(T, h, w).numpy(),
        dissimilarity=request.pruned.dissimilarity.numpy().astype(np.float16),
    )
    request.stream.push(Event("evs", evs=picture))
    request.stream.push(Event("status", "prefill"))


def token(request: Request, token_id: int, logits: torch.Tensor, eos_ids: set[int]) -> bool:
    """Record one generated token (logits: (V,) float32 it was chosen from) and stream its text, as thinking
    or answer; returns True when the answer is complete (end of sequence or the token limit)."""
    now = time.perf_counter()
    if request.first_token_at is None:
        request.first_token_at = now
        request.stats.ttft_s = now - request.submitted_at
    if request.params.return_logits:
        request.logits.append(logits.detach().float().cpu())
    is_eos = token_id in eos_ids and not request.params.ignore_eos
    if not is_eos:
        kind, piece = request.detokenizer.add(token_id)
        if piece:
            request.stream.push(Event(kind, piece))
    request.last_token = token_id
    return is_eos or request.generated >= request.params.max_new_tokens


def done(request: Request) -> None:
    """The last event of an answered or cancelled request: the rest of its text, then its stats."""
    if request.detokenizer is not None:
        kind, tail = request.detokenizer.flush()
        if tail:
            request.stream.push(Event(kind, tail))
    now = time.perf_counter()
    stats = request.stats
    stats.generated_tokens = request.generated
    stats.thinking_tokens = request.detokenizer.thinking_tokens if request.detokenizer else 0
    stats.answer_tokens = stats.generated_tokens - stats.thinking_tokens
    stats.total_s = now - request.submitted_at
    stats.decode_s = now - request.first_token_at if request.first_token_at else 0.0
    if request.pruned is not None:
        stats.video_tokens_kept = int(request.pruned.retention.sum())
        stats.tokens_kept_per_frame = request.pruned.tokens_kept_per_group
        stats.prompt_tokens = int(request.pruned.input_ids.numel())
    token_ids = tuple(request.detokenizer.token_ids) if request.detokenizer else ()
    logits = torch.stack(request.logits).numpy() if request.logits else None
    request.stream.push(Event("done", stats=stats.as_dict(), token_ids=token_ids, logits=logits))
