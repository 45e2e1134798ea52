"""The figures of one burst run: TTFT mean and percentiles, TPOT, throughput. Times in seconds."""

import statistics

import numpy as np

from .bursts import BurstRun


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (0-100), linear between the closest ranks (numpy's default)."""
    return float(np.percentile(values, p))


def burst_summary(run: BurstRun) -> dict:
    """users; mean/p50/p90/p99 TTFT from the burst's start; TPOT: each user's seconds per token after the
    first, averaged over users; wall; requests and output tokens per second of wall time."""
    ttfts = [user.ttft_s for user in run.users]
    per_token = [user.decode_s / (user.generated_tokens - 1) for user in run.users if user.generated_tokens > 1]
    generated = sum(user.generated_tokens for user in run.users)
    return {
        "users": len(run.users),
        "mean_ttft_s": statistics.mean(ttfts),
        "p50_ttft_s": percentile(ttfts, 50),
        "p90_ttft_s": percentile(ttfts, 90),
        "p99_ttft_s": percentile(ttfts, 99),
        "tpot_s": statistics.mean(per_token) if per_token else None,
        "wall_s": run.wall_s,
        "requests_per_s": len(run.users) / run.wall_s,
        "output_tokens_per_s": generated / run.wall_s,
        "generated_tokens": generated,
    }
