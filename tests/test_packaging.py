"""`pip install .`: the project installs as a Python project, with its offline models, and its two commands run
from the installed copy, away from the checkout."""

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "engine", "evs", "pruning", "replicas", "ui", "assets")
# The README's and docs' pictures live in assets/ too, but nothing reads them at run time.
README_PICTURE = re.compile(r"assets/[^/]+\.(png|svg)")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The project installed (no dependencies: they are this environment's) into a folder of its own, built from a
    copy of the tracked files so that the build leaves nothing in the checkout."""
    work = tmp_path_factory.mktemp("packaging")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    source = work / "source"
    for name in tracked.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    target = work / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
        + ["--target", str(target), str(source)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return target


def run_installed(target: Path, command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """A command with only the installed copy on the path (the checkout is neither the cwd nor on PYTHONPATH)."""
    env = {**os.environ, "PYTHONPATH": str(target)}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_dependencies_are_requirements_txt(installed):
    """pyproject.toml reads requirements.txt, so the README's install and `pip install .` install the same pins."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "dependencies" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["dependencies"] == {"file": ["requirements.txt"]}
    metadata = next(installed.glob("evs_video_chat-*.dist-info")) / "METADATA"
    declared = sorted(
        line.split(": ", 1)[1] for line in metadata.read_text().splitlines() if line.startswith("Requires-Dist")
    )
    pinned = sorted(
        line.strip() for line in (ROOT / "requirements.txt").read_text().splitlines() if line.strip() and line[0] != "#"
    )
    assert [d.replace(" ", "") for d in declared] == [p.replace(" ", "") for p in pinned]


def test_the_installed_commands_run_from_the_installed_copy(installed, tmp_path):
    where = run_installed(
        installed, [sys.executable, "-c", "import app, engine; print(app.__file__); print(engine.__file__)"], tmp_path
    )
    assert where.returncode == 0, where.stderr
    assert all(Path(line).is_relative_to(installed) for line in where.stdout.split()), where.stdout

    app_help = run_installed(installed, [str(installed / "bin" / "evs-video-chat"), "--help"], tmp_path)
    assert app_help.returncode == 0, app_help.stderr
    assert app_help.stdout.startswith("usage: evs-video-chat") and "--model" in app_help.stdout

    # The engine's command answers a question on the built-in offline model and its example clip: the weights,
    # the tokenizer and the examples came with the install.
    clip = installed / "assets" / "examples" / "shape_colour.mp4"
    answer = run_installed(
        installed,
        [str(installed / "bin" / "evs-engine"), "--model", "tiny-trained", "--device", "cpu", "--video", str(clip)]
        + ["--question", "What colour is the shape?", "--max-new-tokens", "4"],
        tmp_path,
    )
    assert answer.returncode == 0, answer.stderr[-3000:]
    assert '"prompt_tokens"' in answer.stdout


def test_every_package_and_its_files_are_installed(installed):
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    wanted = [
        name
        for name in tracked.split()
        if name.split("/")[0] in PACKAGES[1:] and not name.endswith(".py") and not README_PICTURE.fullmatch(name)
    ]
    assert wanted, "no data files tracked: the test would check nothing"
    missing = [name for name in wanted if not (installed / name).is_file()]
    assert not missing, f"tracked files pip install . leaves out: {missing}"
    assert (installed / "app.py").is_file()
