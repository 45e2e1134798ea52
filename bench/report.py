"""The benchmark's printout (one markdown table per scenario) and its JSON file."""

import json
from pathlib import Path

from . import (
    concurrency,
    decoding_hook,
    follow_up,
    live,
    reading,
    targets,
    ttft_by_rate,
    users,
    vision_skip,
    vit_batching,
)

# (report key, heading, table maker), in printing order.
SECTIONS = (
    ("ttft_by_rate", "TTFT vs q, one request alone, by stage", ttft_by_rate.markdown),
    (
        "users",
        "N users at once: engine vs pipelined ideal vs the peer (stock transformers, one at a time)",
        users.markdown,
    ),
    ("concurrency", "Throughput vs concurrency", concurrency.markdown),
    ("follow_up", "Follow-up question vs cold", follow_up.markdown),
    ("vit_batching", "ViT batching", vit_batching.markdown),
    ("reading", "Reading the video vs the rest of TTFT, one request alone (q = 0)", reading.markdown),
    ("decoding", "Video reading", decoding_hook.markdown),
    ("live", "Live sessions: a question into a stream against an upload; sessions kept in real time", live.markdown),
    (
        "vision_skip",
        "The vision tower: exact reuse and still patches skipped, by kind of clip; its share of prefill",
        vision_skip.markdown,
    ),
    ("targets", "Targets", targets.markdown),
)


def header(report: dict) -> str:
    env, work = report["environment"], report["workload"]
    model, machine, sampling = env["model"], env["machine"], work["frame_sampling"]
    return (
        f"# {report['command']} ({report['mode']}), {report['started_at']}\n\n"
        f"{model['name']} ({model['parameters'] / 1e6:.1f} M parameters, {model['dtype']}) on "
        f"{env['device']['device']} ({env['device']['name']}); {machine['cores']} cores; "
        f"torch {env['versions']['torch']}, transformers {env['versions']['transformers']}; "
        f"commit {env['git_commit'] or 'unknown'}\n"
        f"{sampling['max_frames']}-frame clips of at most {sampling['max_pixels_per_frame']} "
        f"pixels, {work['new_tokens']} new tokens (EOS ignored), median of {work['repeats']} runs; "
        f"times in seconds, TTFT from the burst's start"
    )


def markdown(report: dict) -> str:
    parts = [header(report)]
    parts += [f"## {title}\n\n{make(report[key])}" for key, title, make in SECTIONS]
    parts.append(f"took {report['duration_s']:.0f} s")
    return "\n\n".join(parts)


def save(report: dict, out_dir: Path) -> Path:
    """bench-<mode>-<UTC start time>.json in out_dir; returns its path."""
    stamp = report["started_at"].replace(":", "").replace("-", "").replace("+0000", "Z")
    path = out_dir / f"bench-{report['mode']}-{stamp}.json"
    out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return path
