"""`python -m engine --live FILE_OR_URL --ask-at ... QUESTION` (engine/__main__.py, engine/live/playback.py): a
recording played into a live session of tiny-trained, as fast as possible and at its own pace, answered right;
each mistake one sentence and exit code 2, told before the model loads."""

import io
import json
import re
import subprocess
import sys
import threading
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from engine.__main__ import Console, print_answer
from engine.stream import Event, Stream

ROOT = Path(__file__).resolve().parent.parent
CLIP = ROOT / "assets" / "examples" / "shape_moving.mp4"  # 8 s at 8 fps; tiny-trained answers "up"
QUESTION = "Which way does the shape move?"


def engine_command(*arguments: str, timeout_s: float = 300, **options) -> subprocess.CompletedProcess:
    """options: subprocess.run's (stderr=subprocess.STDOUT reads both as a terminal shows them)."""
    options.setdefault("capture_output", "stdout" not in options)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "engine",
            "--model",
            "tiny-trained",
            "--device",
            "cpu",
            "--max-new-tokens",
            "4",
            *arguments,
        ],
        cwd=ROOT,
        text=True,
        timeout=timeout_s,
        env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
        **options,
    )


def answers(stdout: str) -> list[tuple[str, str, dict]]:
    """(heading, answer, its stats) of each answer printed, then the session's stats as the last."""
    found = re.findall(r"^(\[[^\n]*\] [^\n]*)\n([^\n]*)\n(\{\n.*?\n\})$", stdout, re.S | re.M)
    return [(heading, text, json.loads(stats)) for heading, text, stats in found]


def test_a_recording_played_as_fast_as_possible_is_answered_right_at_each_moment():
    done = engine_command("--live", str(CLIP), "--as-fast-as-possible", "--ask-at", "20,4", QUESTION)
    assert done.returncode == 0, done.stderr
    (first, early, early_stats), (last, answer, stats) = answers(done.stdout)
    assert first == f"[4 s, the stream at 4 s] {QUESTION}" and last == f"[20 s, the stream at 7.5 s] {QUESTION}"
    assert answer.split()[0] == "up" and early
    assert early_stats["grid_thw"][0] == 4 and stats["grid_thw"][0] == 8  # the groups each question saw
    played = json.loads(done.stdout[done.stdout.rindex('{\n  "session"') :])
    session = played["session"]
    assert session["frames_received"] == 16 and session["frames_dropped"] == 0  # 2 fps of 8 s, none lost
    assert session["video_tokens_held"] == stats["video_tokens_kept"]
    assert "[The stream ended.]" in done.stderr


def test_a_recording_plays_at_its_own_pace():
    done = engine_command("--live", str(CLIP), "--ask-at", "6", QUESTION)
    assert done.returncode == 0, done.stderr
    ((heading, answer, stats),) = answers(done.stdout)
    assert heading == f"[6 s, the stream at 6 s] {QUESTION}" and answer and stats["ttft_s"] > 0
    played = json.loads(done.stdout[done.stdout.rindex('{\n  "session"') :])
    assert played["session"]["frames_received"] == 16
    assert played["played_s"] >= 7.5  # from its first frame to its last at 7.5 s, as a camera would give them


def test_watches_print_each_event_with_its_stream_time():
    """Two --watch questions on the recording played as fast as possible: each prints its first answer at the
    first group (0.5 s), then one line per change, each at a group's last frame; the summary counts them. The clip
    holds still, crosses in a second and holds still again, so fewer asks than its 8 groups."""
    watched = ["What colour is the shape?", "Is there a red shape?"]
    done = engine_command("--live", str(CLIP), "--as-fast-as-possible", "--watch", watched[0], "--watch", watched[1])
    assert done.returncode == 0, done.stderr
    lines = re.findall(r"^\[watch, the stream at ([\d.]+) s\] (.+?) (\S+)(  ALERT)?$", done.stdout, re.M)
    summary = json.loads(done.stdout[done.stdout.rindex('{\n  "session"') :])
    for question, stats in zip(watched, summary["watches"]):
        mine = [(float(t_s), answer) for t_s, asked, answer, _ in lines if asked == question]
        assert stats["question"] == question and stats["events"] == len(mine) >= 1
        assert mine[0][0] == 0.5 and all(t_s % 1 == 0.5 and t_s <= 7.5 for t_s, _ in mine)
        assert 1 <= stats["asks"] < 8 and stats["dropped"] == 0 and stats["closed"]
        assert all(a != b for (_, a), (_, b) in zip(mine, mine[1:]))


@pytest.mark.parametrize(
    "arguments, sentence",
    [
        (["--live", "no-such-clip.mp4", "--ask-at", "5"], "There is no file at no-such-clip.mp4."),
        (
            ["--live", str(CLIP), "--ask-at", "5,soon"],
            "--ask-at takes seconds into the recording, 0 or more, separated by commas (e.g. 5,30,60); got '5,soon'.",
        ),
        (
            ["--live", str(CLIP), "--ask-at", "-1"],
            "--ask-at takes seconds into the recording, 0 or more, separated by commas (e.g. 5,30,60); got '-1'.",
        ),
        (
            ["--live", "rtsp://127.0.0.1:8554/cam", "--ask-at", "5"],
            "Only streams at public internet addresses are read.",
        ),
        (
            ["--live", "ftp://example.com/cam", "--ask-at", "5"],
            "A stream URL must start with rtsp://, rtsps://, rtmp://, rtmps://, srt://, http:// or https:// and name a "
            "host, e.g. rtsp://camera.example.com/live.",
        ),
    ],
)
def test_mistakes_are_one_sentence_and_exit_2_before_the_model_loads(arguments, sentence):
    done = engine_command(*arguments, QUESTION, timeout_s=120)
    # stderr is the sentence alone: no model was loaded to say it (loading prints its weights' progress there)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"error: {sentence}\n")


def test_a_file_that_is_not_video_and_a_question_before_any_video_are_told(tmp_path):
    notes = tmp_path / "notes.mp4"
    notes.write_text("not a video")
    done = engine_command("--live", str(notes), "--ask-at", "1", QUESTION)
    assert done.returncode == 2 and "error: The file notes.mp4 could not be read as video." in done.stderr.splitlines()
    early = engine_command("--live", str(CLIP), "--as-fast-as-possible", "--ask-at", "0,20", QUESTION)
    assert early.returncode == 2
    assert (
        "error: The live stream has no video yet: push at least 2 frames 0.5 s apart before asking."
        in early.stderr.splitlines()
    )
    assert answers(early.stdout)[-1][1].split()[0] == "up"  # the session went on to answer the next


def test_a_status_line_waits_for_the_answer_being_printed():
    """The feed's thread says "[The stream ended.]" while the printing thread is halfway through an answer, with
    stdout and stderr one stream as a terminal shows them: the status line comes after the answer's line, whole."""
    stream, console, shown = Stream(1), Console(), io.StringIO()
    with redirect_stdout(shown), redirect_stderr(shown):
        printing = threading.Thread(target=print_answer, args=(stream, console))
        printing.start()
        stream.push(Event("text", "bl"))
        deadline = time.monotonic() + 30
        while not shown.getvalue().endswith("bl") and time.monotonic() < deadline:
            time.sleep(0.01)
        console.line("[The stream ended.]", to_stderr=True)  # as play_live's on_status, from the feed's thread
        stream.push(Event("text", "ue"))
        stream.push(Event("done", stats={"generated_tokens": 2}))
        printing.join(30)
    assert shown.getvalue().startswith("blue\n[The stream ended.]\n{"), shown.getvalue()


def test_the_answer_at_the_streams_end_is_one_line_on_a_terminal():
    """The probe's command, python -m engine --live ... --ask-at 7 "What colour is the shape?"
    --as-fast-as-possible, its two outputs read as one (as a terminal shows them): the stream ends while the answer
    asked at 7 s is printed, and the answer's line stays whole, the status line on a line of its own."""
    question = "What colour is the shape?"
    done = engine_command(
        "--live",
        str(CLIP),
        "--as-fast-as-possible",
        "--ask-at",
        "7",
        question,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    heading = lines.index(f"[7 s, the stream at 7 s] {question}")
    # Between the heading and the answer's stats: status lines ("[waiting for the GPU]", "[The stream ended.]"),
    # each whole, and the answer's one line.
    between = lines[heading + 1 : lines.index("{", heading)]
    answer = [line for line in between if not (line.startswith("[") and line.endswith("]"))]
    assert len(answer) == 1 and answer[0] and "[" not in answer[0], between
    assert "[The stream ended.]" in lines
