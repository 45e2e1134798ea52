"""`python app.py` with the Hub unreachable and nothing cached: fall back to tiny-random, or exit when strict."""

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


def test_unreachable_model_falls_back_to_tiny_random_with_a_banner(tmp_path):
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
    assert health == {"status": "ok", "model": "tiny-random", "device": "cpu", "fallback": True}
    assert status == 200 and "<html" in page.lower()
    assert f"falling back to tiny-random: Model {MODEL} could not be loaded" in output
    assert "warm-up done" in output
    assert "attention sdpa" in output
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
    assert "tiny-random" not in result.stdout


def test_flags_win_over_environment(monkeypatch):
    import app
    monkeypatch.setenv("EVS_MODEL", "from-env")
    monkeypatch.setenv("EVS_PORT", "9001")
    monkeypatch.setenv("GRADIO_SERVER_PORT", "9002")
    monkeypatch.setenv("GRADIO_SERVER_NAME", "0.0.0.0")
    monkeypatch.delenv("EVS_HOST", raising=False)
    monkeypatch.delenv("EVS_STRICT_MODEL", raising=False)
    args = app.parse_args([])
    assert (args.model, args.port, args.host, args.strict_model) == ("from-env", 9001, "0.0.0.0", False)
    args = app.parse_args(["--model", "tiny-random", "--port", "7000", "--host", "127.0.0.1"])
    assert (args.model, args.port, args.host) == ("tiny-random", 7000, "127.0.0.1")
    monkeypatch.delenv("EVS_PORT")
    monkeypatch.setenv("EVS_STRICT_MODEL", "1")
    monkeypatch.setenv("EVS_MAX_FILE_MB", "5")
    args = app.parse_args([])
    assert (args.port, args.strict_model, args.max_file_mb) == (9002, True, 5.0)


def test_bad_port_in_environment_is_a_usage_error(monkeypatch, capsys):
    import app
    monkeypatch.setenv("EVS_PORT", "seventy")
    with pytest.raises(SystemExit) as exit_info:
        app.parse_args([])
    assert exit_info.value.code == 2
    assert "invalid int value: 'seventy'" in capsys.readouterr().err
