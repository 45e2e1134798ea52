"""Runs every scenario of `python -m bench` and assembles the report (a JSON-ready dict; times in seconds)."""

import os
import tempfile
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from engine import Engine, EngineConfig

from . import environment, peer
from .bursts import burst_round, engine_burst, median_run, median_runs
from .concurrency import concurrency_rows
from .decoding import long_gop_file
from .decoding_hook import decoding_results
from .follow_up import follow_up_rows
from .live import live_scenario
from .reading import reading_rows
from .targets import bench_target_rows
from .ttft_by_rate import ttft_by_rate
from .users import peer_record, users_rows
from .vision_skip import FULL as FULL_SKIP
from .vision_skip import QUICK as QUICK_SKIP
from .vision_skip import kind_rows, share_rows
from .vit_batching import vit_batching
from .workload import QUESTION, Workload, make_clips, params

NO_CACHES = dict(feature_cache_bytes=0, prefix_cache_bytes=0, frame_cache_bytes=0)


LOADS: list[float] = []  # the load average over the last minute as each scenario started, then at the end


def log(message: str) -> None:
    """Say which scenario starts, and note how busy the machine is then (LOADS)."""
    LOADS.append(os.getloadavg()[0])
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def run(
    work: Workload,
    device: str,
    mode: str,
    command: str,
    keep: Path | None = None,
    limits: dict[str, float] | None = None,
) -> dict:
    """Every scenario on `work`: caches off (each request reads, encodes and prefills for itself) except
    for the follow-up, which measures them. mode: "full" or "quick"; command: the command line, recorded;
    keep: a folder to make the long-GOP file in (or reuse it from) instead of a temporary one; limits: targets
    held to other limits than the issues' (--target)."""
    started = datetime.now(UTC)
    start = time.perf_counter()
    LOADS.clear()
    report: dict = {"command": command, "mode": mode, "started_at": started.isoformat(timespec="seconds")}
    with tempfile.TemporaryDirectory() as folder:
        clips = make_clips(Path(folder), work.clip_count)
        log("making the long-GOP file (minutes on two cores in full mode)")
        long_file, _ = long_gop_file(mode == "quick", keep or Path(folder))
        config = EngineConfig(model=work.model, device=device, frame_sampling=work.frame_sampling, **NO_CACHES)
        with Engine(config) as engine:
            report["environment"] = environment.describe(engine)
            engine_burst(engine, clips[:2], params(0.5, 2))  # first-request costs, untimed
            log("TTFT vs q")
            report["ttft_by_rate"] = ttft_by_rate(
                engine, clips[0], work.rates, QUESTION, lambda q: params(q, work.new_tokens), work.repeats
            )
            peer.answer(engine, clips[-1], work.frame_sampling, 2)  # the peer's first-request costs, untimed
            rounds, peer_runs = [], []
            for round_ in range(1, work.repeats + 1):  # rounds, so drift hits the engine and the peer alike
                log(
                    f"round {round_}/{work.repeats}: bursts of {list(work.burst_sizes)} users at "
                    f"q = {list(work.burst_rates)}, then the peer: {max(work.users)} users one at a time"
                )
                rounds.append(burst_round(engine, clips, work.burst_sizes, work.burst_rates, work.new_tokens))
                peer_runs.append(
                    peer.serve_one_by_one(engine, clips[: max(work.users)], work.frame_sampling, work.new_tokens)
                )
            grid, served = median_runs(rounds), median_run(peer_runs)
            log("ViT batching")
            report["vit_batching"] = vit_batching(
                engine, clips[: work.vit_videos], work.frame_sampling, work.vit_repeats
            )
            log("reading vs the rest of TTFT")
            report["reading"] = reading_rows(
                engine,
                {"short clip (4 s, 224x224)": clips[0], "long-GOP file": long_file},
                QUESTION,
                params(0.0, work.new_tokens),
                work.repeats,
            )
        report["users"] = users_rows(grid, served, work.users, work.burst_rates)
        report["peer"] = {**peer_record(served, work.new_tokens), "decoder": peer.DECODER}
        report["concurrency"] = concurrency_rows(grid, work.concurrency, work.burst_rates)
        log("follow-up vs cold")
        with Engine(EngineConfig(model=work.model, device=device, frame_sampling=work.frame_sampling)) as engine:
            report["follow_up"] = follow_up_rows(engine, clips, work.burst_rates, work.new_tokens)
        log("live sessions: TTFT into a stream against an upload, sessions kept in real time")
        config = EngineConfig(
            model=work.model,
            device=device,
            frame_sampling=work.frame_sampling,
            max_live_sessions=work.live.max_sessions,
            **NO_CACHES,
        )
        with Engine(config) as engine:
            report["live"] = live_scenario(engine, Path(folder), work.live, QUESTION)
        log("vision: three kinds of clip with and without exact reuse and skipping still patches")
        skip_work = QUICK_SKIP if mode == "quick" else FULL_SKIP
        kinds = kind_rows(device, Path(folder), skip_work)
        report["vision_skip"] = {"kinds": kinds, "share": []}
        if mode == "full":
            log("vision: the ViT's share of prefill on real checkpoints' shapes (towers cut, seconds scaled)")
            report["vision_skip"]["share"] = share_rows(device, Path(folder), skip_work)
        log("video reading")
        report["decoding"] = decoding_results(mode == "quick", long_file.parent)
    report["targets"] = bench_target_rows(report, work.repeats, limits or {})
    report["workload"] = {**asdict(work), "clips": "224x224, 8 fps, 4-4.75 s, distinct per user"}
    report["duration_s"] = time.perf_counter() - start
    report["environment"]["machine"]["load_averages"] = [*LOADS, os.getloadavg()[0]]
    return report
