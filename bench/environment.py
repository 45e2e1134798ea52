"""Where a benchmark ran: machine, device, model, library versions, git commit."""

import os
import platform
import subprocess
from pathlib import Path

import torch
import transformers

from engine import Engine

REPO_ROOT = Path(__file__).resolve().parent.parent


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo, else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def versions() -> dict:
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__}


def git_commit() -> str | None:
    """HEAD's commit of the checkout the benchmark runs from; None without git or a repository."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def device(engine: Engine) -> dict:
    where = engine.loaded.device
    name = torch.cuda.get_device_name(where) if where.type == "cuda" else cpu_model()
    return {"device": str(where), "name": name, "torch_threads": torch.get_num_threads()}


def model(engine: Engine) -> dict:
    """The engine's model_info (name, family, dtype, attention kernels, ...) with its parameter count."""
    return {**engine.model_info, "parameters": sum(p.numel() for p in engine.loaded.model.parameters())}


def describe(engine: Engine) -> dict:
    return {
        "machine": machine(),
        "device": device(engine),
        "model": model(engine),
        "versions": versions(),
        "git_commit": git_commit(),
    }
