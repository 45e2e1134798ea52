"""`python app.py` with the Hub unreachable and nothing cached: fall back to tiny-trained, or exit when strict."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest
from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

import app
from engine.loading.device import MIN_DRIVER_FOR_CUDA_MAJOR
from engine.loading.load import ModelUnavailable, UnsupportedModel
from engine.memory.plan import InsufficientMemory

ROOT = Path(__file__).resolve().parent.parent
MODEL = "Qwen/Qwen3-VL-4B-Instruct"
# A Hub id that cannot be fetched offline, its name one unbreakable word wider than a phone's screen.
UNREACHABLE_MODEL = "evs-test/Qwen3VL4BInstructFineTunedOnEveryShapeClipTheTrainingScriptMakes"
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


@dataclass
class StartedApp:
    url: str
    health: dict
    log: Path  # its stdout and stderr


@contextmanager
def app_process(home: Path, *flags: str):
    """`python app.py FLAGS` on a free port as a user starts it, offline (offline_env); yields once /healthz
    answers, and stops it afterwards."""
    port = free_port()
    log_path = home / "app.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "app.py", *flags, "--port", str(port)],
            cwd=ROOT,
            env=offline_env(home),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            health = wait_for_health(proc, port)
            yield StartedApp(url=f"http://127.0.0.1:{port}/", health=health, log=log_path)
        finally:
            stop(proc)


def test_unreachable_model_falls_back_to_tiny_trained_with_a_banner(fallback_app):
    status, page = get(fallback_app.url)
    _, config = get(f"{fallback_app.url}config")
    output = fallback_app.log.read_text()
    assert fallback_app.health == {
        "status": "ok",
        "model": "tiny-trained",
        "device": "cpu",
        "fallback": True,
        "replicas": 1,
    }
    assert status == 200 and "<html" in page.lower()
    # The Hub client's own words go to the log, on one line.
    assert (
        f"falling back to tiny-trained: model {UNREACHABLE_MODEL} cannot be served (We couldn't connect to "
        "'http://127.0.0.1:9'"
    ) in output
    assert "warm-up done" in output
    assert "attention: vision tower sdpa, language model sdpa" in output
    # The page a user sees says why in one sentence, and what the offline model knows.
    assert (
        f"The model {UNREACHABLE_MODEL} could not be downloaded: no network connection, and no copy on this "
        "machine. This app runs tiny-trained instead, a tiny model trained on synthetic clips"
    ) in config
    assert "couldn" not in config and "offline-mode" not in config


def test_metrics_right_after_the_start_count_no_request_the_warm_up_is_nobodys(fallback_app):
    """The start answers one warm-up request before it serves anyone; /metrics scraped right after shows no
    request and no time to first token. (The tests before this one on the shared app only load pages.)"""
    from app_harness import outcomes, scrape_metrics

    samples = scrape_metrics(fallback_app.url)
    assert outcomes(samples) == {"answered": 0, "refused": 0, "cancelled": 0, "failed": 0}
    assert samples[("evs_ttft_seconds_count", ())] == 0 and samples[("evs_answer_seconds_count", ())] == 0
    assert "warm-up done" in fallback_app.log.read_text()


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
    assert f"error: model {MODEL} cannot be served (We couldn't connect" in result.stderr
    assert "EVS_STRICT_MODEL" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert "tiny-trained" not in result.stdout


def test_flags_win_over_environment(monkeypatch):
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


def test_the_temp_cleaning_interval_keeps_its_old_names_for_a_release(monkeypatch, capsys):
    monkeypatch.delenv("EVS_TEMP_CLEAN_S", raising=False)
    monkeypatch.setenv("EVS_TEMP_SWEEP_S", "60")
    assert app.parse_args([]).temp_clean_s == 60
    monkeypatch.setenv("EVS_TEMP_CLEAN_S", "90")
    assert app.parse_args([]).temp_clean_s == 90
    assert app.parse_args(["--temp-sweep-s", "30"]).temp_clean_s == 30
    assert app.parse_args(["--temp-clean-s", "20"]).temp_clean_s == 20
    with pytest.raises(SystemExit):
        app.parse_args(["--help"])
    usage = capsys.readouterr().out
    assert "--temp-clean-s" in usage and "--temp-sweep-s" not in usage


def test_bad_port_in_environment_is_a_usage_error(monkeypatch, capsys):
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
    return subprocess.run(
        [sys.executable, "app.py", "--port", str(free_port()), *flags],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
    )


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
    stored = json.loads(
        (ROOT / "engine" / "checkpoints" / "specs" / f"{checkpoint.replace('/', '--')}.json").read_text()
    )
    folder = tmp_path / checkpoint.split("/")[-1]
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(stored["config"]))
    return folder


def test_auto_on_a_cpu_serves_a_4b_checkpoint_only_when_asked(tmp_path):
    """--device auto without a GPU starts on tiny-trained with a banner instead of a 4B model in float32."""
    folder = checkpoint_folder(tmp_path, MODEL)
    with app_process(tmp_path, "--model", str(folder)) as started:
        _, config = get(f"{started.url}config")
        output = started.log.read_text()
    assert started.health == {"status": "ok", "model": "tiny-trained", "device": "cpu", "fallback": True, "replicas": 1}
    assert (
        f"model {folder} cannot be served (no usable GPU was found and it has 4.4 B parameters, too many to "
        "serve on a CPU; pass --device cpu to run it there anyway)"
    ) in output
    assert (
        f"No usable GPU was found, and {folder} (4.4 B parameters) is too large to run on a CPU. This app runs "
        "tiny-trained instead, a tiny model trained on synthetic clips"
    ) in config
    assert "attention: vision tower sdpa, language model sdpa" in output


def test_auto_on_a_cpu_with_a_4b_checkpoint_exits_when_strict(tmp_path):
    folder = checkpoint_folder(tmp_path, MODEL)
    result = run_app(tmp_path, "--model", str(folder), EVS_STRICT_MODEL="1")
    assert result.returncode == 3
    [line] = error_lines(result)
    assert f"model {folder} cannot be served (no usable GPU was found and it has 4.4 B parameters" in line
    assert "EVS_STRICT_MODEL is set" in line


# ---- the banner's sentence ----------------------------------------------------------------------

# What the Hub client says when it cannot connect: a developer's advice and a URL wider than a phone.
HUB_MESSAGE = (
    "We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them in the "
    "cached files. Check your internet connection or see how to run the library in offline mode at "
    "'https://huggingface.co/docs/transformers/installation#offline-mode'."
)


def chained(*errors: BaseException) -> BaseException:
    """The first of `errors` raised from the second, that from the third, ... as engine.loading.load raises
    ModelUnavailable from the Hub client's errors."""
    for outer, inner in zip(errors, errors[1:]):
        outer.__cause__ = inner
    return errors[0]


def unavailable(hub_error: BaseException) -> ModelUnavailable:
    return chained(
        ModelUnavailable(f"Model '{MODEL}' is unavailable: OSError: {HUB_MESSAGE}"), OSError(HUB_MESSAGE), hub_error
    )


def hub_refusal(kind: type, status: int) -> BaseException:
    response = httpx2.Response(status, request=httpx2.Request("GET", f"https://huggingface.co/api/models/{MODEL}"))
    return kind(f"{status} Client Error. Repository Not Found for url: {response.request.url}.", response=response)


@pytest.mark.parametrize(
    "error, why",
    [
        (
            unavailable(
                LocalEntryNotFoundError(
                    "Cannot find the requested files in the disk cache and outgoing traffic has been disabled."
                )
            ),
            f"The model {MODEL} could not be downloaded: no network connection, and no copy on this machine.",
        ),
        (
            unavailable(hub_refusal(RepositoryNotFoundError, 404)),
            f"The model {MODEL} was found neither on this machine nor on the Hugging Face Hub, or it is private.",
        ),
        (
            unavailable(hub_refusal(GatedRepoError, 403)),
            f"The model {MODEL} is gated on the Hugging Face Hub, and this server has no token for it.",
        ),
        # No Hub error beneath it: an unknown random:<id>, or weights checked out as LFS pointers.
        (
            ModelUnavailable(f"Model '{MODEL}' is unavailable: OSError: {HUB_MESSAGE}"),
            f"The model {MODEL} could not be downloaded or read.",
        ),
        (
            app.TooLargeForCpu(4_437_815_808),
            f"No usable GPU was found, and {MODEL} (4.4 B parameters) is too large to run on a CPU.",
        ),
        (
            InsufficientMemory(
                "After loading the model the GPU has 1.0 GiB free, room for 0 video tokens per request, "
                "fewer than the 256 of a small clip: use a GPU with more memory or a smaller checkpoint."
            ),
            f"The GPU has too little free memory to run {MODEL}.",
        ),
        (
            UnsupportedModel(f"Model '{MODEL}' has model_type 'llava'; only ['qwen3_vl'] checkpoints are supported."),
            f"The model {MODEL} is not a kind of model this app can run.",
        ),
    ],
    ids=["offline", "not-found", "gated", "unreadable", "cpu-too-small", "gpu-memory", "unsupported"],
)
def test_the_banner_says_why_in_one_sentence_a_person_can_read(error, why):
    assert isinstance(error, app.CANNOT_SERVE)
    sentence = app.fallback_reason(MODEL, error)
    assert sentence == why
    # One line of prose: no URL, no exception class, nothing of the raw message.
    assert len(sentence) <= 120 and sentence.endswith(".") and ". " not in sentence
    assert "http" not in sentence and "Error" not in sentence and "'" not in sentence
    assert not any(kind.__name__ in sentence for kind in app.CANNOT_SERVE)


@pytest.mark.parametrize("strict", [False, True], ids=["falls-back", "strict"])
def test_too_little_gpu_memory_falls_back_unless_strict(monkeypatch, capsys, strict):
    """The memory plan's refusal on a small GPU, faked: tiny-trained and a banner, or exit 4 when strict."""
    real_engine = app.Engine

    def engine(config):
        if config.model == MODEL:
            raise InsufficientMemory("After loading the model the GPU has 1.0 GiB free, room for 0 video tokens.")
        return real_engine(config)

    monkeypatch.setattr(app, "Engine", engine)
    for name in ("EVS_STRICT_MODEL", "EVS_VIDEO_READERS", "EVS_REPLICAS"):
        monkeypatch.delenv(name, raising=False)
    # Asked for cuda, served on the CPU here: the fake stands in for the GPU, and no parameter count is fetched.
    args = app.parse_args(
        ["--model", MODEL, "--device", "cuda", "--video-readers", "1", *(["--strict-model"] if strict else [])]
    )
    if strict:
        with pytest.raises(SystemExit) as exit_info:
            app.build_engine(args, "cpu", max_file_bytes=1_000_000)
        assert exit_info.value.code == app.EXIT_DEVICE_UNAVAILABLE
        assert capsys.readouterr().err == (
            f"error: model {MODEL} cannot be served (After loading the model the GPU "
            "has 1.0 GiB free, room for 0 video tokens.); EVS_STRICT_MODEL is set, so "
            "the app does not fall back to tiny-trained.\n"
        )
        return
    served, banner = app.build_engine(args, "cpu", max_file_bytes=1_000_000)
    try:
        assert served.model_info["name"] == "tiny-trained"
        assert banner.startswith(
            f"The GPU has too little free memory to run {MODEL}. This app runs tiny-trained "
            "instead, a tiny model trained on synthetic clips"
        )
    finally:
        served.shutdown()


# ---- a Ray cluster that cannot be reached or started (--replicas) ----------------------------------------------


def test_an_unreachable_ray_cluster_is_one_sentence_and_a_prompt_exit(tmp_path):
    """RAY_ADDRESS names a port where nothing listens: Ray's own client retried it for over two minutes without a
    word; the app says which address it tried and what to check, and exits (replicas/cluster.py)."""
    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    result = run_app(tmp_path, "--model", "tiny-random", "--replicas", "2", RAY_ADDRESS=address)
    took_s = time.monotonic() - started
    assert result.returncode == 4, result.stderr[-2000:]
    [line] = error_lines(result)
    assert line.startswith(f"error: Nothing answers at the Ray cluster address {address} (RAY_ADDRESS): ")
    assert "`ray status`" in line
    assert took_s < 90, took_s


def test_a_local_ray_cluster_that_cannot_start_is_one_sentence(tmp_path):
    """Ray cannot create its temporary folder (RAY_TMPDIR under a plain file): one sentence that names the folder to
    check, not ray.init's traceback."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    result = run_app(tmp_path, "--model", "tiny-random", "--replicas", "2", RAY_TMPDIR=str(blocker / "ray"))
    assert result.returncode == 4, result.stderr[-2000:]
    [line] = error_lines(result)
    assert line.startswith("error: Ray could not start a local cluster: ")
    assert "RAY_TMPDIR" in line
