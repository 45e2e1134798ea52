"""docs/live.md's examples, run as a reader would run them: a file played as live to tiny-trained, then a question;
the same file watched, each change of the answer printed with its stream time."""

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Run before the example in its process: every live session it opens records the frames it sampled, and as the
# example leaves its engine, that engine replays them into a fresh session (tests/live_helpers.py) and writes what
# it answers to the file in argv[1]. The example plays the clip at its own pace, so on a busy machine the session
# drops frames and its answer is about fewer groups; the replay is about exactly those.
RECORDING = """
import json, sys
sys.path.insert(0, "tests")
from live_helpers import RecordedLive, replayed_answer
from engine import Engine
sessions, open_live, leave = [], Engine.open_live, Engine.__exit__

def recording(engine, params=None):
    sessions.append(RecordedLive(open_live(engine, params), params))
    return sessions[-1]

def replaying(engine, *exc):
    with open(sys.argv[1], "w") as out:
        answer = replayed_answer(engine, sessions[0]).text
        json.dump({"answer": answer, "dropped": sessions[0].dropped_before[0]}, out)
    return leave(engine, *exc)

Engine.open_live, Engine.__exit__ = recording, replaying
"""


def run_example(code: str, *args: str) -> subprocess.CompletedProcess:
    """A page's example run as a reader would, in a fresh Python from the repository, offline; it must succeed."""
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr
    return done


def test_the_example_plays_a_file_as_live_and_answers_it(tmp_path):
    page = (REPO / "docs" / "live.md").read_text()
    example = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    assert len(example.strip().splitlines()) <= 12
    replayed = tmp_path / "replayed.json"
    done = run_example(RECORDING + example, str(replayed))
    answer, _, stats = done.stdout.partition(" {")
    replay = json.loads(replayed.read_text())
    assert answer.strip() == replay["answer"].strip(), (done.stdout, replay)
    assert "'frames_received': 64" in stats
    if replay["dropped"] == 0:  # the page's promise, where the machine kept up with the clip
        assert answer.strip() == "up", done.stdout


def test_the_watch_example_prints_each_change_of_the_answer_with_its_stream_time():
    page = (REPO / "docs" / "live.md").read_text()
    section = page[page.index("## Watches") :]
    example = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len(example.strip().splitlines()) <= 15
    done = run_example(example)
    lines = done.stdout.splitlines()
    times = [float(line.split(" s ")[0]) for line in lines]
    assert lines and times[0] == 0.5 and times == sorted(set(times)), done.stdout  # one line per change, in order
    answers = [line.split(" s  ")[1].split("  ")[0] for line in lines]
    assert all(a != b for a, b in zip(answers, answers[1:])), done.stdout
