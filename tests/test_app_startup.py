"""`python app.py` with the Hub unreachable and nothing cached: fall back to tiny-trained, or exit when strict."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from engine.hardware import MIN_DRIVER_FOR_CUDA_MAJOR

ROOT = Path(__file__).resolve().parent.parent
MODEL = "Qwen/Qwen3-VL-4B-Instruct"
START_TIMEOUT_S = 240.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def offline_env(home: Path, **extra: str) -> dict[str, str]:
    """No network to the Hub and an empty cache: offline mode, plus an endpoint nothing listens on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVS_", "GRADIO_", "HF_"))}
    env.update(
        HOME=str(home),
        HF_HOME=str(home / "hf"),
        HF_HUB_OFFLINE="1",
        HF_ENDPOINT="http://127.0.0.1:9",
        GRADIO_ANALYTICS_ENABLED="False",
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def get(url: str, timeout_s: float = 5.0) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return response.status, response.read().decode()


def wait_for_health(proc: subprocess.Popen, port: int) -> dict:
    """Poll /healthz until it answers; fail at once if the app exits first."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"app exited with {proc.returncode} before it answered /healthz")
        try:
            status, body = get(f"http://127.0.0.1:{port}/healthz", timeout_s=2.0)
            if status == 200:
                return json.loads(body)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(1.0)
    pytest.fail(f"/healthz did not answer within {START_TIMEOUT_S:.0f} s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def test_unreachable_model_falls_back_to_tiny_trained_with_a_banner(tmp_path):
    port = free_port()
    log_path = tmp_path / "app.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "app.py", "--model", MODEL, "--device", "cpu", "--port", str(port)],
            cwd=ROOT,
            env=offline_env(tmp_path),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            health = wait_for_health(proc, port)
            status, page = get(f"http://127.0.0.1:{port}/")
            _, config = get(f"http://127.0.0.1:{port}/config")
        finally:
            stop(proc)
    output = log_path.read_text()
    assert health == {"status": "ok", "model": "tiny-trained", "device": "cpu", "fallback": True, "replicas": 1}
    assert status == 200 and "<html" in page.lower()
    assert f"falling back to tiny-trained: Model {MODEL} could not be loaded" in output
    assert "warm-up done" in output
    assert "attention: vision tower sdpa, language model sdpa" in output
    # The banner reaches the page a user sees.
    assert f"Model {MODEL} could not be loaded" in config


def test_strict_model_exits_with_one_clear_message(tmp_path):
    result = subprocess.run(
        [sys.executable, "app.py", "--model", MODEL, "--device", "cpu", "--port", str(free_port())],
        cwd=ROOT,
        env=offline_env(tmp_path, EVS_STRICT_MODEL="1"),
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
    )
    assert result.returncode == 3
    assert f"error: model {MODEL} could not be loaded (" in result.stderr
    assert "EVS_STRICT_MODEL" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert "tiny-trained" not in result.stdout


def test_flags_win_over_environment(monkeypatch):
    import app
    monkeypatch.setenv("EVS_MODEL", "from-env")
    monkeypatch.setenv("EVS_PORT", "9001")
    monkeypatch.setenv("GRADIO_SERVER_PORT", "9002")
    monkeypatch.setenv("GRADIO_SERVER_NAME", "0.0.0.0")
    monkeypatch.delenv("EVS_HOST", raising=False)
    monkeypatch.delenv("EVS_STRICT_MODEL", raising=False)
    monkeypatch.delenv("EVS_VIDEO_READERS", raising=False)
    args = app.parse_args([])
    assert (args.model, args.port, args.host, args.strict_model) == ("from-env", 9001, "0.0.0.0", False)
    args = app.parse_args(["--model", "tiny-random", "--port", "7000", "--host", "127.0.0.1"])
    assert (args.model, args.port, args.host) == ("tiny-random", 7000, "127.0.0.1")
    monkeypatch.delenv("EVS_PORT")
    monkeypatch.setenv("EVS_STRICT_MODEL", "1")
    monkeypatch.setenv("EVS_MAX_FILE_MB", "5")
    args = app.parse_args([])
    assert (args.port, args.strict_model, args.max_file_mb) == (9002, True, 5.0)
    assert args.video_readers is None  # the engine's default: one reader per core
    monkeypatch.setenv("EVS_VIDEO_READERS", "3")
    assert app.parse_args([]).video_readers == 3 and app.parse_args(["--video-readers", "5"]).video_readers == 5


def test_bad_port_in_environment_is_a_usage_error(monkeypatch, capsys):
    import app
    monkeypatch.setenv("EVS_PORT", "seventy")
    with pytest.raises(SystemExit) as exit_info:
        app.parse_args([])
    assert exit_info.value.code == 2
    assert "invalid int value: 'seventy'" in capsys.readouterr().err


# ---- the host self-check ------------------------------------------------------------------------

def run_app(tmp_path: Path, *flags: str, path_prefix: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    """`python app.py FLAGS` that is expected to end by itself (a start-up refusal)."""
    environment = offline_env(tmp_path, **env)
    if path_prefix is not None:
        environment["PATH"] = f"{path_prefix}{os.pathsep}{environment['PATH']}"
    return subprocess.run([sys.executable, "app.py", "--port", str(free_port()), *flags], cwd=ROOT,
                          env=environment, capture_output=True, text=True, timeout=START_TIMEOUT_S)


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    assert "Traceback" not in result.stderr + result.stdout
    return [line for line in result.stderr.splitlines() if line.startswith("error: ")]


def test_a_gpu_torch_cannot_use_stops_the_start_with_one_line(tmp_path):
    """A Space host whose driver (575, CUDA 12.9) is older than torch's CUDA: never serve on the CPU."""
    import torch

    if torch.version.cuda is None:
        pytest.skip("the installed torch is a CPU-only build")
    floor = MIN_DRIVER_FOR_CUDA_MAJOR[int(torch.version.cuda.split(".")[0])]
    driver = f"{floor - 5}.57.08"  # for PyPI's CUDA 13 torch: 575, the Space hosts' driver
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho {driver}\n")
    smi.chmod(0o755)
    result = run_app(tmp_path, "--model", "tiny-random", path_prefix=bin_dir)
    assert result.returncode == 4
    [line] = error_lines(result)
    assert f"driver {driver}" in line and f"built for CUDA {torch.version.cuda}" in line
    assert f"needs driver {floor} or newer" in line
    assert f"host: NVIDIA driver {driver}; torch" in result.stderr  # logged before the verdict
    assert "loaded tiny-random" not in result.stderr


def test_device_cuda_without_a_gpu_is_one_line(tmp_path):
    result = run_app(tmp_path, "--model", "tiny-random", "--device", "cuda")
    assert result.returncode == 4
    [line] = error_lines(result)
    assert line.startswith("error: --device cuda was asked for, but this machine has no usable GPU")


def checkpoint_folder(tmp_path: Path, checkpoint: str) -> Path:
    """A folder holding only the checkpoint's published config.json: enough to count its parameters."""
    stored = json.loads((ROOT / "engine" / "checkpoints" / f"{checkpoint.replace('/', '--')}.json").read_text())
    folder = tmp_path / checkpoint.split("/")[-1]
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(stored["config"]))
    return folder


def test_auto_on_a_cpu_serves_a_4b_checkpoint_only_when_asked(tmp_path):
    """--device auto without a GPU starts on tiny-trained with a banner instead of a 4B model in float32."""
    folder = checkpoint_folder(tmp_path, MODEL)
    port = free_port()
    log_path = tmp_path / "app.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "app.py", "--model", str(folder), "--port", str(port)], cwd=ROOT,
                                env=offline_env(tmp_path), stdout=log, stderr=subprocess.STDOUT)
        try:
            health = wait_for_health(proc, port)
            _, config = get(f"http://127.0.0.1:{port}/config")
        finally:
            stop(proc)
    output = log_path.read_text()
    assert health == {"status": "ok", "model": "tiny-trained", "device": "cpu", "fallback": True, "replicas": 1}
    reason = f"no usable gpu was found and {folder} has 4.4 b parameters, too many to serve on a cpu".lower()
    assert reason in output.lower() and reason in config.lower()
    assert "pass --device cpu to run it there anyway" in config
    assert "so this app runs tiny-trained, a tiny model trained on synthetic clips" in config
    assert "attention: vision tower sdpa, language model sdpa" in output


def test_auto_on_a_cpu_with_a_4b_checkpoint_exits_when_strict(tmp_path):
    folder = checkpoint_folder(tmp_path, MODEL)
    result = run_app(tmp_path, "--model", str(folder), EVS_STRICT_MODEL="1")
    assert result.returncode == 3
    [line] = error_lines(result)
    assert f"{folder} has 4.4 B parameters" in line and "EVS_STRICT_MODEL is set" in line
