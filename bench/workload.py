"""What `python -m bench` measures: the clips, their sampling, the answer length, each scenario's sizes."""

from dataclasses import dataclass
from pathlib import Path

from assets.clips import write_clip
from engine import FrameSampling, GenerationParams

from .live_work import LiveWork

QUESTION = "What happens in this video?"
FOLLOW_UP_QUESTION = "And then?"
CLIP_KINDS = ("moving_object", "pan", "scene_cut", "static")
# 16 frames of at most 224x224 pixels: 392 video tokens per clip on Qwen3-VL (8 groups of 7x7).
FRAME_SAMPLING = FrameSampling(fps=4.0, max_frames=16, max_pixels_per_frame=224 * 224)


@dataclass(frozen=True)
class Workload:
    """One benchmark mode.

    model: what the engine loads. new_tokens: tokens per answer, EOS ignored. rates: q of the TTFT-vs-q
    scenario (the first must be 0, the ideal's reference). users: burst sizes compared with the pipelined
    ideal and with the peer (must include 1: the single-request stages). concurrency: burst sizes of the
    throughput table. burst_rates: q of every burst. repeats: runs of each timed measurement, the median
    kept. vit_videos, vit_repeats: the ViT batching measurement.
    """

    model: str
    new_tokens: int
    rates: tuple[float, ...]
    users: tuple[int, ...]
    concurrency: tuple[int, ...]
    burst_rates: tuple[float, ...]
    repeats: int
    vit_videos: int
    vit_repeats: int
    live: LiveWork
    frame_sampling: FrameSampling = FRAME_SAMPLING

    @property
    def burst_sizes(self) -> tuple[int, ...]:
        """Every burst size the users and concurrency scenarios need; each is run once per q and repeat."""
        return tuple(sorted(set(self.users) | set(self.concurrency)))

    @property
    def clip_count(self) -> int:
        """Distinct clips needed: the largest burst, the ViT batch, a warm-up clip beside the follow-ups."""
        return max(*self.burst_sizes, self.vit_videos, len(self.burst_rates) + 1)


FULL = Workload(
    model="random-qwen3-vl-50m",
    new_tokens=32,
    rates=(0.0, 0.3, 0.5, 0.7, 0.9),
    users=(1, 2, 4, 8),
    concurrency=(1, 4, 8, 16),
    burst_rates=(0.0, 0.7),
    repeats=3,
    vit_videos=8,
    vit_repeats=3,
    live=LiveWork(
        moments_s=(10, 60, 600),
        size=(224, 224),
        max_pixels_per_frame=224 * 224,
        session_s=20,
        max_sessions=32,
        new_tokens=32,
    ),
)
# Every scenario's code path, peer included, on the tiny model: about a minute and a half on two cores.
QUICK = Workload(
    model="tiny-random",
    new_tokens=8,
    rates=FULL.rates,
    users=(1, 2, 4),
    concurrency=(1, 4),
    burst_rates=FULL.burst_rates,
    repeats=1,
    vit_videos=4,
    vit_repeats=1,
    live=LiveWork(
        moments_s=(5, 10, 30),
        size=(160, 120),
        max_pixels_per_frame=160 * 120,
        session_s=4,
        max_sessions=2,
        new_tokens=8,
        questions=3,
        uploads=2,
        tail_s=20,
    ),
)


def make_clips(folder: Path, count: int) -> list[Path]:
    """`count` byte-distinct 224x224 clips at 8 fps, 4 s and longer by a quarter second every four
    (each samples to 16 frames at 4 fps), so no content-hash dedup merges two users."""
    return [
        write_clip(
            folder / f"clip{i}.mp4",
            CLIP_KINDS[i % len(CLIP_KINDS)],
            seconds=4.0 + 0.25 * (i // 4),
            fps=8,
            size=(224, 224),
        )
        for i in range(count)
    ]


def params(
    q: float, new_tokens: int, sampling: FrameSampling | None = None, skip_still_patches: bool = False
) -> GenerationParams:
    """Greedy, exactly `new_tokens` tokens (EOS ignored), pruning rate q; sampling None: the engine's default."""
    return GenerationParams(
        pruning_rate=q,
        max_new_tokens=new_tokens,
        ignore_eos=True,
        frame_sampling=sampling,
        skip_still_patches=skip_still_patches,
    )
