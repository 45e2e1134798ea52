"""docs/live.md's example, run as a reader would run it: a file played as live to tiny-trained, then a question."""

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
