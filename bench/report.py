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
from .plot import plot_file

DOCS = Path(__file__).resolve().parent.parent / "docs"
# docs/performance.md holds one run's printout between these lines (`python -m bench --docs` rewrites it).
DOCS_START = "<!-- written by `python -m bench --docs` from one full run: edit bench/, not these tables -->"
DOCS_END = "<!-- end of the tables written by `python -m bench --docs` -->"


def untargeted(make):
    """The table maker of a section that holds no target, called as the others are: (section, target rows)."""
    return lambda section, _targets: make(section)


# (report key, heading, table maker (section, the run's target rows) -> markdown), in printing order.
SECTIONS = (
    ("ttft_by_rate", "TTFT vs q, one request alone, by stage", untargeted(ttft_by_rate.markdown)),
    (
        "users",
        "N users at once: engine vs pipelined ideal vs the peer (stock transformers in process, one at a time)",
        users.markdown,
    ),
    ("concurrency", "Throughput vs concurrency", concurrency.markdown),
    ("follow_up", "Follow-up question vs cold", untargeted(follow_up.markdown)),
    ("vit_batching", "ViT batching", untargeted(vit_batching.markdown)),
    ("reading", "Reading the video vs the rest of TTFT, one request alone (q = 0)", reading.markdown),
    ("decoding", "Video reading", decoding_hook.markdown),
    ("live", "Live sessions: a question into a stream against an upload; sessions kept in real time", live.markdown),
    (
        "vision_skip",
        "The vision tower: exact reuse and still patches skipped, by kind of clip; its share of prefill",
        vision_skip.markdown,
    ),
    ("targets", "Targets", untargeted(targets.markdown)),
)


def header(report: dict) -> str:
    env, work = report["environment"], report["workload"]
    model, machine, sampling = env["model"], env["machine"], work["frame_sampling"]
    return (
        f"# {report['command']} ({report['mode']}), {report['started_at']}\n\n"
        f"{model['name']} ({model['parameters'] / 1e6:.1f} M parameters, {model['dtype']}) on "
        f"{env['device']['device']} ({env['device']['name']}); {machine['cores']} cores, load average "
        f"{min(machine['load_averages']):.1f}–{max(machine['load_averages']):.1f} (as each scenario started); "
        f"torch {env['versions']['torch']}, transformers {env['versions']['transformers']}; "
        f"commit {env['git_commit'] or 'unknown'}\n"
        f"{sampling['max_frames']}-frame clips of at most {sampling['max_pixels_per_frame']} "
        f"pixels, {work['new_tokens']} new tokens (EOS ignored); each burst, the peer's serving and each request "
        f"alone the median of {work['repeats']} runs; times in seconds, TTFT from the burst's start"
    )


def markdown(report: dict) -> str:
    """Every section's table, each with the verdicts of the targets its rows hold ("met")."""
    targets_ = report["targets"]
    parts = [header(report)]
    parts += [f"## {title}\n\n{make(report[key], targets_)}" for key, title, make in SECTIONS]
    parts.append(f"took {report['duration_s']:.0f} s")
    return "\n\n".join(parts)


def save(report: dict, out_dir: Path) -> Path:
    """bench-<mode>-<UTC start time>.json in out_dir; returns its path."""
    stamp = report["started_at"].replace(":", "").replace("-", "").replace("+0000", "Z")
    path = out_dir / f"bench-{report['mode']}-{stamp}.json"
    out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return path


def write_docs(report: dict, docs: Path = DOCS) -> list[Path]:
    """A full run as the docs' figures: its printout between the markers of docs/performance.md (headings two
    levels down, under the page's own), the JSON as docs/performance.json and its PNG beside it. Returns the paths
    written. ValueError with a sentence for a quick run or a page without its markers."""
    if report["mode"] != "full":
        raise ValueError("--docs takes a full run: the quick run's figures are not held to the targets.")
    page = docs / "performance.md"
    text = page.read_text()
    if DOCS_START not in text or DOCS_END not in text:
        raise ValueError(f"{page} has lost the lines that mark where the tables go: {DOCS_START!r}, {DOCS_END!r}.")
    before, rest = text.split(DOCS_START, 1)
    after = rest.split(DOCS_END, 1)[1]
    printout = "\n".join("##" + line if line.startswith("#") else line for line in markdown(report).splitlines())
    page.write_text(f"{before}{DOCS_START}\n\n{printout}\n\n{DOCS_END}{after}")
    data = docs / "performance.json"
    data.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return [page, data, plot_file(data)]
