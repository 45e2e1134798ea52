"""The per-request stats: their names are a public contract (UI, `/ask` JSON, tests, benchmarks).

A dataclass with slots, so a mistyped name raises AttributeError instead of quietly adding a key; the
done event carries `as_dict()` of it, a plain dict with every key below and, for one release, the old name
of a renamed key beside it (OLD_KEYS).
"""

from dataclasses import asdict, dataclass, fields


@dataclass(slots=True)
class Stats:
    pruning_rate: float | None = None  # q the request asked for
    pruning_method: str | None = None  # the method that chose the kept video tokens: "evs", "vidcom2" or "uniform"
    # One dict per medium, in order: "kind" ("video" or "image"), "tokens_total", "tokens_kept", "grid_thw"; a
    # video's also "frames_sampled", "sampled_fps", "timestamps_s" (each temporal group's centre time),
    # "tokens_kept_per_frame", "soundtrack", "audio_tokens", "audio_seconds"; an image's "size" ([width, height]
    # as given to the processor).
    media: list[dict] | None = None
    frames_sampled: int | None = None  # video frames taken from the files, every video's
    # Of the first video (None without one; `media` has every one's):
    sampled_fps: float | None = None  # frames sampled per second of video (below the asked fps on long videos)
    grid_thw: list[int] | None = None  # [T, h, w] in LLM tokens
    video_tokens_total: int | None = None  # T*h*w before EVS, summed over the videos (images are not counted)
    video_tokens_kept: int | None = None  # after EVS, summed over the videos
    tokens_kept_per_frame: list[int] | None = None  # the first video's, one count per temporal group
    audio_tokens: int | None = None  # the soundtracks' tokens in the prompt, all kept by EVS (0 when not heard)
    audio_seconds: float | None = None  # seconds of soundtrack heard, every video's (0.0 when not heard)
    # The first video's: "heard", "cut" (its first max_soundtrack_seconds heard), "off" (the request turned it
    # off), "none" (no audio stream, one too short to hear, or no video), "unreadable" (it did not decode) or
    # "unsupported" (no audio tower)
    soundtrack: str | None = None
    prompt_tokens: int | None = None  # tokens the language model saw for the prompt (after pruning)
    prefill_tokens: int | None = None  # of those, the ones prefilled now (the rest came from the prefix KV cache)
    generated_tokens: int | None = None  # thinking_tokens + answer_tokens
    thinking_tokens: int | None = None  # up to and including the think-end token; 0 when the request did not think
    answer_tokens: int | None = None  # after the thinking
    ttft_s: float | None = None  # submit -> first generated token (thinking or answer)
    total_s: float | None = None  # submit -> done
    read_video_s: float | None = None  # reading the file + frame sampling + HF processor
    read_wait_s: float | None = None  # of read_video_s, waiting for a free reader process (0 on a frame cache hit)
    read_s: float | None = None  # of read_video_s, the reader(s) reading the file (0 on a frame cache hit)
    # Vision patches (the processor's pixel rows) of every medium, and of them the ones the vision tower ran for
    # this request: exact repeats of a previous group and skipped still units are not run; 0 when the features
    # came from the cache (vit_cache_hit). A question asked of a live session: its session's so far.
    vision_patches_total: int | None = None
    vision_patches_encoded: int | None = None
    vit_s: float | None = None  # the vision forward this request took part in (with the audio tower's, when heard)
    evs_s: float | None = None
    prefill_s: float | None = None
    decode_s: float | None = None  # first token -> done
    vit_batch_requests: int | None = None  # requests that shared the ViT forward (0 on a feature cache hit)
    vit_cache_hit: bool | None = None
    prefix_cache_hit: bool | None = None
    decode_batch_max: int | None = None  # most requests in one decode step with this one

    def as_dict(self) -> dict:
        """Every key below, and each OLD_KEYS name beside the key it was renamed to."""
        values = asdict(self)
        return {**values, **{old: values[new] for old, new in OLD_KEYS.items()}}


def video_entry(
    tokens_total: int,
    grid_thw,
    frames_sampled: int,
    sampled_fps: float | None,
    timestamps_s,
    soundtrack: str | None,
    audio_tokens: int = 0,
    audio_seconds: float = 0.0,
) -> dict:
    """One video's dict in Stats.media, an upload's or a live session's alike, before pruning: its kept tokens
    ("tokens_kept", "tokens_kept_per_frame") are filled in once EVS has chosen them. grid_thw: [T, h, w] in LLM
    tokens; timestamps_s: each temporal group's centre time in seconds of video."""
    return {
        "kind": "video",
        "tokens_total": tokens_total,
        "tokens_kept": None,
        "grid_thw": list(grid_thw),
        "frames_sampled": frames_sampled,
        "sampled_fps": sampled_fps,
        "timestamps_s": list(timestamps_s),
        "tokens_kept_per_frame": None,
        "soundtrack": soundtrack,
        "audio_tokens": audio_tokens,
        "audio_seconds": audio_seconds,
    }


STATS_KEYS = tuple(field.name for field in fields(Stats))
# Keys renamed, still sent under the old name too for one release: old name -> key.
OLD_KEYS = {"decode_video_s": "read_video_s"}
