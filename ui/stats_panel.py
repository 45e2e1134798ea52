"""Compact HTML for the numbers of one request (stats dict with the docs/architecture.md keys) and for compare mode."""

from html import escape

PLACEHOLDER_HTML = (
    '<div class="evs-stats evs-stats-empty">Token counts, time to first token and stage timings '
    "appear here once a question has been answered.</div>"
)


def format_seconds(seconds: float | None) -> str:
    """'—' when unknown, milliseconds below one second, else seconds with two decimals."""
    if seconds is None:
        return "—"
    if seconds < 1.0:
        return f"{seconds * 1000:.0f} ms" if seconds >= 0.01 else f"{seconds * 1000:.1f} ms"
    return f"{seconds:.2f} s"


def pruned_percent(stats: dict) -> float:
    total = stats["video_tokens_total"]
    return 100.0 * (total - stats["video_tokens_kept"]) / total if total else 0.0


def decode_tokens_per_s(stats: dict) -> float | None:
    """Steady decode speed: tokens after the first one over the time from first token to done."""
    after_first = stats["generated_tokens"] - 1
    if after_first <= 0 or stats["decode_s"] <= 0:
        return None
    return after_first / stats["decode_s"]


def _reading(stats: dict) -> str:
    """ " (read 32 ms, waited 1 ms)": of the video stage, reading the file and waiting for a reader process;
    nothing when the frames came from the cache of recent uploads (both 0) or the stats predate the keys."""
    read, wait = stats.get("read_s"), stats.get("read_wait_s")
    if not read and not wait:
        return ""
    return f" (read {format_seconds(read)}, waited {format_seconds(wait)})"


def _frames(stats: dict) -> str:
    """ "32 frames at 0.05 fps · grid 16 × 7 × 7": the rate says how sparsely a long video was sampled (the first
    video's, with several); "1 picture" for a question about pictures alone."""
    if stats.get("grid_thw") is None:
        pictures = sum(medium["kind"] == "image" for medium in stats.get("media") or [])
        return f"{pictures} picture{'s' if pictures != 1 else ''}"
    rate = stats.get("sampled_fps")
    return (
        f"{stats['frames_sampled']} frames"
        + ("" if rate is None else f" at {rate:.3g} fps")
        + f" · grid {' × '.join(str(n) for n in stats['grid_thw'])}"
    )


def _media(stats: dict) -> tuple[str, str, str] | None:
    """The card of a question about several uploads: each one's tokens, in order (a picture's all kept); None
    for one upload, whose numbers the other cards show."""
    media = stats.get("media") or []
    if len(media) < 2:
        return None
    named = [
        f"{medium['kind'].replace('image', 'picture')} {number} {medium['tokens_total']:,}"
        + ("" if medium["kind"] == "image" else f" → {medium['tokens_kept']:,}")
        for number, medium in enumerate(media, start=1)
    ]
    videos = sum(medium["kind"] == "video" for medium in media)
    return (
        "Uploads",
        f"{videos} video{'s' if videos != 1 else ''}, {len(media) - videos} "
        f"picture{'s' if len(media) - videos != 1 else ''}",
        " · ".join(named) + " tokens; EVS prunes each video on its own, never a picture",
    )


def _prefilled(stats: dict) -> str:
    """How much of the prompt the model read now, and how much it reused from the conversation's KV cache."""
    prefilled, prompt = stats["prefill_tokens"], stats["prompt_tokens"]
    if prefilled >= prompt:
        return f"prefilled all {prompt:,} prompt tokens; none came from the cache"
    return (
        f"prefilled {prefilled:,} of {prompt:,} prompt tokens; the other {prompt - prefilled:,} came from the KV "
        "cache of this conversation"
    )


def stats_html(stats: dict | None) -> str:
    """A grid of small cards; the placeholder when `stats` is None (nothing answered yet)."""
    if stats is None:
        return PLACEHOLDER_HTML
    speed = decode_tokens_per_s(stats)
    vit = "cached" if stats["vit_cache_hit"] else format_seconds(stats["vit_s"])
    cards = [
        (
            "Video tokens",
            f"{stats['video_tokens_total']:,} → {stats['video_tokens_kept']:,}",
            f"{pruned_percent(stats):.0f}% pruned at q={stats['pruning_rate']:.2f} by {stats['pruning_method']}",
        ),
        _patches(stats),
        ("Prompt tokens", f"{stats['prompt_tokens']:,}", _frames(stats)),
        (
            "Generated",
            f"{stats['generated_tokens']:,} tokens",
            " · ".join([*_thinking_and_answer(stats), "—" if speed is None else f"{speed:.1f} tokens/s decode"]),
        ),
        ("Time to first token", format_seconds(stats["ttft_s"]), f"total {format_seconds(stats['total_s'])}"),
        (
            "Stages",
            f"ViT {vit} · pruning {format_seconds(stats['evs_s'])}",
            f"video {format_seconds(stats['read_video_s'])}{_reading(stats)}"
            f" · prefill {format_seconds(stats['prefill_s'])} · decode {format_seconds(stats['decode_s'])}",
        ),
        (
            "Batching",
            f"ViT × {stats['vit_batch_requests']} · decode × {stats['decode_batch_max']}",
            "requests sharing the ViT forward · most in one decode step",
        ),
        (
            "Caches",
            f"features {_hit(stats['vit_cache_hit'])} · prefix {_hit(stats['prefix_cache_hit'])}",
            _prefilled(stats),
        ),
    ]
    if soundtrack := _soundtrack(stats):
        cards.insert(1, soundtrack)
    if media := _media(stats):
        cards.insert(1, media)
    return '<div class="evs-stats">' + "".join(_card(*card) for card in cards) + "</div>"


def compare_summary(full: dict, pruned: dict) -> str:
    """One markdown sentence: what pruning at q saved against q=0."""
    saved_tokens = full["prompt_tokens"] - pruned["prompt_tokens"]
    ratio = full["ttft_s"] / pruned["ttft_s"] if pruned["ttft_s"] > 0 else float("inf")
    pace = f"{ratio:.1f}× faster" if ratio >= 1 else f"{1 / ratio:.1f}× slower"
    return (
        f"At q={pruned['pruning_rate']:.2f} the prompt is **{saved_tokens:,} tokens shorter** "
        f"({pruned['prompt_tokens']:,} vs {full['prompt_tokens']:,}) and the first token came after "
        f"**{format_seconds(pruned['ttft_s'])}** instead of {format_seconds(full['ttft_s'])} ({pace})."
    )


def _thinking_and_answer(stats: dict) -> list[str]:
    """["12 thinking", "30 answer"] for a request that thought, else nothing."""
    if not stats.get("thinking_tokens"):
        return []
    return [f"{stats['thinking_tokens']:,} thinking", f"{stats['answer_tokens']:,} answer"]


# What the soundtrack card says when none was heard, by the `soundtrack` stat.
_NOT_HEARD = {
    "off": ("off", "Hear the soundtrack is off: the answer comes from the frames"),
    "none": ("none", "the upload has no sound to hear"),
    "unreadable": ("unreadable", "its sound could not be read: the answer comes from the frames"),
}


def _soundtrack(stats: dict) -> tuple[str, str, str] | None:
    """The soundtrack's card: how much the model heard, or why it heard nothing; None for a model that cannot
    hear (its stats say "unsupported"), where the card would only say so."""
    verdict = stats.get("soundtrack")
    if verdict in _NOT_HEARD:
        return ("Soundtrack", *_NOT_HEARD[verdict])
    if verdict not in ("heard", "cut"):
        return None
    first = "the first " if verdict == "cut" else ""
    return (
        "Soundtrack",
        f"heard {first}{stats['audio_seconds']:.1f} s",
        f"{stats['audio_tokens']:,} audio tokens, all kept: EVS prunes video tokens only"
        + ("; the rest is past the server's limit" if verdict == "cut" else ""),
    )


def _patches(stats: dict) -> tuple[str, str, str]:
    """The vision tower's card: patches it encoded of the uploads' total (exact repeats of a group and skipped
    still patches are not encoded; nothing when the features came from the cache)."""
    total, encoded = stats.get("vision_patches_total") or 0, stats.get("vision_patches_encoded") or 0
    if stats.get("vit_cache_hit"):
        detail = "the features came from the cache"
    elif encoded < total:
        detail = f"{100.0 * (total - encoded) / total:.0f}% not encoded: unchanged since last encoded"
    else:
        detail = "every patch changed, or none could be left out"
    return ("Vision patches", f"{encoded:,} of {total:,} encoded", detail)


def _hit(hit: bool) -> str:
    return "hit" if hit else "miss"


def _card(label: str, value: str, detail: str) -> str:
    return (
        f'<div class="evs-card"><div class="evs-card-label">{escape(label)}</div>'
        f'<div class="evs-card-value">{escape(value)}</div>'
        f'<div class="evs-card-detail">{escape(detail)}</div></div>'
    )
