"""N users at once: the engine's TTFT against the pipelined ideal, and against the peer.

pipelined ideal(N) = read_video + (N + 1) / 2 * (ViT + EVS + prefill), with one request's stages from the
N = 1 burst at the same q: what the mean TTFT would be if the device worked through the users' vision and
prefill one after another and each user's first token came as soon as its own prefill ended.
The peer (bench/peer.py) serves one user at a time, so its N-user figures are its first N users.
The issue that asked for this scenario wrote the ideal with one prefill; on a device that runs one forward
at a time every user's prefill delays the users after it, so the ideal here counts the prefills too.
"""

from .bursts import BurstRun
from .markdown import cell, table
from .summary import burst_summary
from .targets import met_cell


def pipelined_ideal_s(single: dict, users: int) -> float:
    """Mean TTFT (seconds) of `users` users under ideal pipelining, from one request's stats."""
    return single["read_video_s"] + (users + 1) / 2 * (single["vit_s"] + single["evs_s"] + single["prefill_s"])


def users_rows(
    grid: dict[tuple[int, float], BurstRun], peer: BurstRun, users: tuple[int, ...], rates: tuple[float, ...]
) -> list[dict]:
    """One row per (q, N): the engine burst's figures, the pipelined ideal, the peer's and the ratios."""
    rows = []
    for q in rates:
        single = grid[(1, q)].answers[0].stats
        for n in users:
            engine = burst_summary(grid[(n, q)])
            served = burst_summary(peer.first(n))
            ideal = pipelined_ideal_s(single, n)
            rows.append(
                {
                    "pruning_rate": q,
                    "users": n,
                    "mean_ttft_s": engine["mean_ttft_s"],
                    "p90_ttft_s": engine["p90_ttft_s"],
                    "wall_s": engine["wall_s"],
                    "pipelined_ideal_s": ideal,
                    "ttft_over_ideal": engine["mean_ttft_s"] / ideal,
                    "peer_mean_ttft_s": served["mean_ttft_s"],
                    "peer_p90_ttft_s": served["p90_ttft_s"],
                    "peer_wall_s": served["wall_s"],
                    "ttft_engine_over_peer": engine["mean_ttft_s"] / served["mean_ttft_s"],
                    "wall_engine_over_peer": engine["wall_s"] / served["wall_s"],
                }
            )
    return rows


def markdown(rows: list[dict], targets: list[dict] = ()) -> str:
    """The table, with the burst targets' verdicts on their row (targets: the run's target rows)."""
    body = [
        [
            row["pruning_rate"],
            row["users"],
            cell(row["mean_ttft_s"]),
            cell(row["p90_ttft_s"]),
            cell(row["wall_s"]),
            cell(row["pipelined_ideal_s"]),
            cell(row["ttft_over_ideal"], 2),
            cell(row["peer_mean_ttft_s"]),
            cell(row["peer_wall_s"]),
            cell(row["ttft_engine_over_peer"], 2),
            cell(row["wall_engine_over_peer"], 2),
            met_cell(targets, "users", row),
        ]
        for row in rows
    ]
    return table(
        [
            "q",
            "users",
            "mean TTFT s",
            "p90 TTFT s",
            "wall s",
            "pipelined ideal s",
            "mean TTFT/ideal",
            "peer mean TTFT s",
            "peer wall s",
            "TTFT engine/peer",
            "wall engine/peer",
            "met",
        ],
        body,
    )


def peer_record(peer: BurstRun, new_tokens: int) -> dict:
    """The peer's run for the JSON: each user's timing, and how many got the whole answer."""
    return {
        "users": len(peer.users),
        "answered": sum(user.generated_tokens == new_tokens for user in peer.users),
        "new_tokens": new_tokens,
        **{key: value for key, value in burst_summary(peer).items() if key != "users"},
        "per_user": [
            {"ttft_s": u.ttft_s, "done_s": u.done_s, "generated_tokens": u.generated_tokens} for u in peer.users
        ],
    }
