"""What a request's stream receives as it is served: status lines, the EVS picture, thinking and answer text,
and the done event with its final stats. No forwards here; the worker calls these at each stage."""

import time

import numpy as np
import torch

from engine.scheduling.request import Request
from engine.stream import Event, EvsPicture


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'s' if number != 1 else ''}"


def vision_started(served: dict[Request, list[int]], temporal_patch: int) -> None:
    """Tell each request in a vision forward (served: the indices of its media the forward encodes; the others'
    features are cached) how many frames and pictures it encodes (and whether soundtracks; how many of their
    patches when some are left out as unchanged) and with how many others."""
    for request, indices in served.items():
        others = len(served) - 1
        media = [request.prompt.media[index] for index in indices]
        frames = sum(medium.grid_thw[0] for medium in media if not medium.is_image) * temporal_patch
        images = sum(medium.is_image for medium in media)
        what = " and ".join([_count(frames, "frame")] * bool(frames) + [_count(images, "picture")] * bool(images))
        sound = " and the soundtrack" if any(medium.audio is not None for medium in media) else ""
        total = sum(medium.pixel_values.shape[0] for medium in media)
        encoded = sum(request.plans[index].patches for index in indices)
        patches = f", {encoded:,} of {total:,} patches: the rest unchanged" if encoded < total else ""
        tail = f" (batched with {_count(others, 'other request')})" if others else ""
        request.stream.push(Event("status", f"encoding {what}{sound}{patches}{tail}"))


def pruned(request: Request, temporal_patch: int) -> None:
    """The EVS picture of each video (what the model sees of it), sent once before the first token: one "evs"
    event per video, in order, its `medium` the video's place among the request's media."""
    for index, (medium, part) in enumerate(zip(request.media, request.prompt.media)):
        if part.is_image:
            continue
        T, h, w = part.grid_thw
        picture = EvsPicture(
            frames=medium.frames[::temporal_patch][:T],
            timestamps_s=part.timestamps_s,
            grid_thw=(T, h, w),
            kept_mask=request.pruned.retention[index].reshape(T, h, w).numpy(),
            dissimilarity=request.pruned.dissimilarity[index].numpy().astype(np.float16),
            medium=index,
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
        for index, entry in enumerate(stats.media):
            entry["tokens_kept"] = int(request.pruned.retention[index].sum())
            if entry["kind"] == "video":
                entry["tokens_kept_per_frame"] = request.pruned.tokens_kept_per_group(index)
        videos = [entry for entry in stats.media if entry["kind"] == "video"]
        stats.video_tokens_kept = sum(entry["tokens_kept"] for entry in videos)
        stats.tokens_kept_per_frame = videos[0]["tokens_kept_per_frame"] if videos else None
        stats.prompt_tokens = int(request.pruned.input_ids.numel())
    token_ids = tuple(request.detokenizer.token_ids) if request.detokenizer else ()
    logits = torch.stack(request.logits).numpy() if request.logits else None
    request.stream.push(Event("done", stats=stats.as_dict(), token_ids=token_ids, logits=logits))
