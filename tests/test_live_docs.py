"""docs/live.md's examples, run as a reader would run them: a file played as live to tiny-trained, then a question;
the same file watched, each change of the answer printed with its stream time."""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_the_example_plays_a_file_as_live_and_answers_it():
    page = (REPO / "docs" / "live.md").read_text()
    example = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    assert len(example.strip().splitlines()) <= 12
    done = subprocess.run(
        [sys.executable, "-c", example],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.partition(" ")[0] == "up", done.stdout


def test_the_watch_example_prints_each_change_of_the_answer_with_its_stream_time():
    page = (REPO / "docs" / "live.md").read_text()
    section = page[page.index("## Watches") :]
    example = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len(example.strip().splitlines()) <= 15
    done = subprocess.run(
        [sys.executable, "-c", example],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    times = [float(line.split(" s ")[0]) for line in lines]
    assert lines and times[0] == 0.5 and times == sorted(set(times)), done.stdout  # one line per change, in order
    answers = [line.split(" s  ")[1].split("  ")[0] for line in lines]
    assert all(a != b for a, b in zip(answers, answers[1:])), done.stdout
