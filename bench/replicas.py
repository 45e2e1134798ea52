"""Engine replicas on Ray Serve: 8 users on 8 videos with 1 replica against 2, and how often a follow-up
finds its video's caches on the replica that answers it.

    python -m bench.replicas [--quick] [--device cpu|cuda] [--json OUT.json]

Throughput: one in-process Engine (no Ray), then a local Ray cluster with 1 replica, then with 2; each
warmed up, then one user alone (their TTFT: what replicas cannot shorten), then 8 users submit one
question each on their own video at once (greedy, EOS ignored). Figures: wall time from the first
submit to the last answer, answers and tokens per second, mean TTFT: medians of 3 rounds, each on
fresh videos. On a CPU the replicas split the machine's cores (2 replicas on 2 cores get one each, where 1 replica had
both), so the ratio checks the code path rather than shows what scaling buys: it gains only where one
engine leaves a core idle. On GPUs each replica has a device of its own.
Affinity: with 2 replicas, every user then asks a follow-up quoting the first answer; a hit is a
follow-up answered by the replica that answered the first question (its ViT features and conversation KV
are there), and `prefix_cache_hits` counts those whose prefill reused that KV. Routing at random would
hit 1 in 2.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from engine import Engine, EngineConfig
from engine.reading.video import file_sha256

from .markdown import cell, table
from .workload import FOLLOW_UP_QUESTION, FRAME_SAMPLING, FULL, QUESTION, QUICK, make_clips, params

USERS = 8
PRUNING_RATE = 0.5
# Rounds of each measurement, each on fresh videos; medians are reported (the figures of one round on a
# shared 2-core machine move by tens of percent).
ROUNDS = 3


def replicas_scenario(quick: bool, device: str = "cpu") -> dict:
    """Run the scenario (quick: tiny-random and 8 new tokens, else random-qwen3-vl-50m and 32) and
    return its figures; see the module docstring. Imports Ray (the `ray[serve]` requirement)."""
    from replicas import ReplicatedEngine

    work = QUICK if quick else FULL
    config = EngineConfig(model=work.model, device=device, frame_sampling=FRAME_SAMPLING)
    with tempfile.TemporaryDirectory(prefix="bench-replicas-") as folder:
        # Byte-distinct clips, none seen twice by a setup: per round one user alone and 8 users; then
        # spares for warming up each replica.
        clips = make_clips(Path(folder), ROUNDS * (USERS + 1) + 8)
        rounds = [(clips[r * (USERS + 1)], clips[r * (USERS + 1) + 1 : (r + 1) * (USERS + 1)]) for r in range(ROUNDS)]
        spares = clips[ROUNDS * (USERS + 1) :]
        rows = []
        with Engine(config) as engine:
            engine.submit(spares[0], QUESTION, params(PRUNING_RATE, work.new_tokens)).result()
            rows.append(_setup_row("engine, no Ray", 0, engine, rounds, work.new_tokens)[0])
        affinity = None
        for count in (1, 2):
            with ReplicatedEngine(config, replicas=count, quiet=True) as replicated:
                _warm_up(replicated, spares, work.new_tokens)
                row, firsts = _setup_row(
                    f"{count} replica{'s' if count > 1 else ''}", count, replicated, rounds, work.new_tokens
                )
                rows.append(row)
                if count == 2:
                    affinity = _follow_ups(replicated, [users for _, users in rounds], firsts, work.new_tokens)
    one, two = rows[1], rows[2]
    return {
        "model": work.model,
        "device": device,
        "cpu_cores": os.cpu_count(),
        "users": USERS,
        "rounds": ROUNDS,
        "new_tokens": work.new_tokens,
        "pruning_rate": PRUNING_RATE,
        "throughput": rows,
        # Above 1 when 2 replicas serve the 8 users faster than 1 does (medians of the rounds).
        "throughput_ratio_2_over_1": two["answers_per_s"] / one["answers_per_s"],
        "affinity": affinity,
        "note": (
            "On a CPU, 2 replicas split the cores that 1 replica had: they gain only where one engine "
            "leaves cores idle (a tiny model, bound by its one Python worker thread) and lose to Ray's "
            "overhead and contention where its forwards already use every core. Read a CPU ratio as a "
            "check of the code path; on GPUs each replica has a device of its own."
        ),
    }


def _warm_up(replicated, spares: list[Path], new_tokens: int) -> None:
    """One answer on every replica, each on a spare clip whose home it is, so no user pays a cold start."""
    from replicas.routing import home_of

    ids = replicated.replicas()
    chosen = {}
    for clip in spares:
        chosen.setdefault(home_of(file_sha256(clip), ids), clip)
    for clip in chosen.values():
        replicated.submit(clip, QUESTION, params(PRUNING_RATE, new_tokens)).result()


def _setup_row(setup: str, replicas: int, engine, rounds: list, new_tokens: int) -> tuple[dict, list]:
    """Each round: one user alone (their TTFT), then every user's question submitted at once (from the
    first submit to the last answer). Returns the medians over the rounds, and every round's answers."""
    measured, answers = [], []
    for solo, users in rounds:
        alone = engine.submit(solo, QUESTION, params(PRUNING_RATE, new_tokens)).result()
        start = time.perf_counter()
        streams = [engine.submit(clip, QUESTION, params(PRUNING_RATE, new_tokens)) for clip in users]
        burst = [stream.result() for stream in streams]
        wall_s = time.perf_counter() - start
        served: dict[str, int] = {}
        for answer in burst:
            if (replica := answer.stats.get("replica")) is not None:
                served[replica] = served.get(replica, 0) + 1
        measured.append(
            {
                "one_user_ttft_s": alone.stats["ttft_s"],
                "wall_s": wall_s,
                "answers_per_s": len(burst) / wall_s,
                "tokens_per_s": sum(a.stats["generated_tokens"] for a in burst) / wall_s,
                "mean_ttft_s": sum(a.stats["ttft_s"] for a in burst) / len(burst),
                "users_per_replica": sorted(served.values(), reverse=True),
            }
        )
        answers += burst
    row = {"setup": setup, "replicas": replicas}
    for key in ("one_user_ttft_s", "wall_s", "answers_per_s", "tokens_per_s", "mean_ttft_s"):
        row[key] = statistics.median(m[key] for m in measured)
    row["users_per_replica"] = [m["users_per_replica"] for m in measured]
    row["rounds"] = measured
    return row, answers


def _follow_ups(replicated, rounds: list[list[Path]], firsts: list, new_tokens: int) -> dict:
    """Each round's users ask their follow-up at once (as they asked their first question); counted
    against the replica of their first answer. firsts: every round's first answers, in order."""
    firsts, pairs = list(firsts), []
    for users in rounds:
        answers, firsts = firsts[: len(users)], firsts[len(users) :]
        streams = [
            replicated.submit(
                clip, FOLLOW_UP_QUESTION, params(PRUNING_RATE, new_tokens), history=[(QUESTION, first.text)]
            )
            for clip, first in zip(users, answers)
        ]
        pairs += zip(answers, [stream.result() for stream in streams])
    same = sum(follow.stats["replica"] == first.stats["replica"] for first, follow in pairs)
    return {
        "follow_ups": len(pairs),
        "same_replica": same,
        "hit_rate": same / len(pairs),
        "prefix_cache_hits": sum(bool(follow.stats["prefix_cache_hit"]) for _, follow in pairs),
        "random_routing_hit_rate": 0.5,
    }


def markdown(result: dict) -> str:
    body = [
        [
            row["setup"],
            cell(row["one_user_ttft_s"], 2),
            cell(row["wall_s"], 2),
            cell(row["answers_per_s"], 2),
            cell(row["tokens_per_s"], 1),
            cell(row["mean_ttft_s"], 2),
            ", ".join("/".join(map(str, split)) for split in row["users_per_replica"] if split) or "—",
        ]
        for row in result["throughput"]
    ]
    lines = [
        f"{result['users']} users on {result['users']} videos, {result['model']} on {result['device']} "
        f"({result['cpu_cores']} cores), {result['new_tokens']} new tokens, q = {result['pruning_rate']}; "
        f"medians of {result['rounds']} rounds",
        "",
        table(
            [
                "setup",
                "one user's TTFT s",
                "8 users: wall s",
                "answers/s",
                "tokens/s",
                "mean TTFT s",
                "users per replica, each round",
            ],
            body,
        ),
        "",
        f"throughput, 2 replicas / 1 replica: {result['throughput_ratio_2_over_1']:.2f}",
    ]
    affinity = result["affinity"]
    if affinity:
        count = affinity["follow_ups"]
        lines.append(
            f"follow-ups on the first answer's replica: {affinity['same_replica']}/{count} (hit rate "
            f"{affinity['hit_rate']:.2f}; random routing {affinity['random_routing_hit_rate']:.2f}), "
            f"prefix-cache hits {affinity['prefix_cache_hits']}/{count}"
        )
    lines += ["", result["note"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replicas", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny-random and 8 new tokens: a smoke run")
    parser.add_argument(
        "--device", default="cpu", choices=["cpu", "cuda"], help="where the replicas run (cuda: one GPU each, 2 needed)"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    result = replicas_scenario(args.quick, args.device)
    print(markdown(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
        print(f"saved {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
