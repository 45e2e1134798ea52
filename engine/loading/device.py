"""What this machine offers before anything large is loaded: the NVIDIA driver, torch's CUDA build, the GPU.

    report = probe_host()                      # HostReport, cheap: no model, no CUDA context unless usable
    device = choose_device("auto", report)     # torch.device, or DeviceUnavailable with one sentence

The rule it enforces: a GPU that is there but that torch cannot use is an error, never a silent fall
back to the CPU (a Space whose driver is older than torch's CUDA would otherwise serve a 4B model in
float32 on the CPU, or be killed for memory, and nobody would be told why).
"""

import re
import subprocess
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.errors import one_line

NVIDIA_PROC_VERSION = Path("/proc/driver/nvidia/version")
NVIDIA_SMI_TIMEOUT_S = 10.0

# Oldest driver branch that runs each CUDA major release through minor-version compatibility
# (CUDA 12.x: 525.60.13; CUDA 13.x: 580). PyTorch wheels bundle their CUDA runtime, so this is the floor.
MIN_DRIVER_FOR_CUDA_MAJOR = {11: 450, 12: 525, 13: 580}
# What a user with a CUDA 12 driver installs instead of PyPI's CUDA 13 build.
CUDA12_TORCH_INDEX = "https://download.pytorch.org/whl/cu126"


class DeviceUnavailable(RuntimeError):
    """The asked-for device cannot be used; the message is one sentence that says what to do."""


@dataclass(frozen=True)
class HostReport:
    """driver_version: "575.57.08" when an NVIDIA kernel driver is loaded, else None.
    torch_cuda: the CUDA version torch was built for ("12.6"), None for a CPU-only build.
    cuda_usable: torch.cuda.is_available(); cuda_error: what torch warned when it was not.
    gpu_name, capability (major, minor), free_bytes and total_bytes of device 0: only when usable."""

    driver_version: str | None
    torch_version: str
    torch_cuda: str | None
    cuda_usable: bool
    cuda_error: str | None = None
    gpu_count: int = 0
    gpu_name: str | None = None
    capability: tuple[int, int] | None = None
    free_bytes: int | None = None
    total_bytes: int | None = None

    @property
    def gpu_visible(self) -> bool:
        return self.driver_version is not None

    def summary(self) -> str:
        """One line for the start-up log."""
        driver = f"NVIDIA driver {self.driver_version}" if self.gpu_visible else "no NVIDIA driver"
        build = f"CUDA {self.torch_cuda} build" if self.torch_cuda else "CPU-only build"
        line = f"{driver}; torch {self.torch_version} ({build})"
        if self.cuda_usable:
            gib = 1024**3
            major, minor = self.capability
            line += (
                f"; GPU 0 of {self.gpu_count}: {self.gpu_name}, compute capability {major}.{minor}, "
                f"{self.free_bytes / gib:.1f} GiB free of {self.total_bytes / gib:.1f} GiB"
            )
        else:
            line += "; CUDA is not usable"
        return line


def _parse_driver_version(text: str) -> str | None:
    # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  575.57.08  Sat May 24 …" (the open module says
    # "NVIDIA UNIX Open Kernel Module for x86_64  575.57.08  Release Build …")
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return match[1] if match else None


def nvidia_driver_version(proc_version: Path = NVIDIA_PROC_VERSION) -> str | None:
    """The loaded NVIDIA driver's version, from the kernel module's file or else from `nvidia-smi`."""
    try:
        version = _parse_driver_version(proc_version.read_text())
        if version:
            return version
    except OSError:
        pass
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = result.stdout.split()
    if result.returncode != 0 or not lines or not re.fullmatch(r"\d+\.\d+(?:\.\d+)?", lines[0]):
        return None
    return lines[0]


def probe_host() -> HostReport:
    """Driver, torch build and (when usable) the first GPU's name, capability and free memory."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        usable = torch.cuda.is_available()
    cuda_error = None
    if not usable and caught:
        cuda_error = one_line(caught[-1].message)
    report = dict(
        driver_version=nvidia_driver_version(),
        torch_version=torch.__version__.split("+")[0],
        torch_cuda=torch.version.cuda,
        cuda_usable=usable,
        cuda_error=cuda_error,
    )
    if usable:
        free_bytes, total_bytes = torch.cuda.mem_get_info(0)
        report.update(
            gpu_count=torch.cuda.device_count(),
            gpu_name=torch.cuda.get_device_name(0),
            capability=torch.cuda.get_device_capability(0),
            free_bytes=free_bytes,
            total_bytes=total_bytes,
        )
    return HostReport(**report)


def _driver_major(version: str) -> int:
    return int(version.split(".")[0])


def unusable_gpu_message(report: HostReport) -> str:
    """Why torch cannot use the visible GPU, and what to do, in one sentence."""
    seen = f"An NVIDIA GPU is visible (driver {report.driver_version})"
    cpu_instead = "or pass --device cpu to run on the CPU anyway"
    if report.torch_cuda is None:
        return (
            f"{seen} but torch {report.torch_version} is a CPU-only build: install a CUDA build "
            f"(pip install torch=={report.torch_version} --index-url {CUDA12_TORCH_INDEX}) {cpu_instead}."
        )
    cuda_major = int(report.torch_cuda.split(".")[0])
    floor = MIN_DRIVER_FOR_CUDA_MAJOR.get(cuda_major)
    if floor is not None and _driver_major(report.driver_version) < floor:
        # A CUDA 12 build is the way out only for a newer build on a CUDA 12 driver.
        cuda12_driver = _driver_major(report.driver_version) >= MIN_DRIVER_FOR_CUDA_MAJOR[12]
        instead = (
            f"install torch built for CUDA 12 (pip install torch=={report.torch_version} --index-url "
            f"{CUDA12_TORCH_INDEX}), or update the driver,"
            if cuda_major > 12 and cuda12_driver
            else "update the driver,"
        )
        return (
            f"{seen} but torch {report.torch_version} was built for CUDA {report.torch_cuda}, which needs "
            f"driver {floor} or newer: {instead} {cpu_instead}."
        )
    cause = f" ({report.cuda_error})" if report.cuda_error else ""
    return (
        f"{seen} but torch {report.torch_version} (built for CUDA {report.torch_cuda}) cannot use it"
        f"{cause}: check that the container has GPU access (docker run --gpus all) and that "
        f"CUDA_VISIBLE_DEVICES names a GPU, {cpu_instead}."
    )


def choose_device(requested: str, report: HostReport) -> torch.device:
    """The device to load on for `requested` ("auto", "cpu", "cuda" or "cuda:N").

    auto: the GPU when torch can use it, the CPU when there is no NVIDIA GPU at all, and
    DeviceUnavailable when a GPU is visible but unusable. cuda: DeviceUnavailable when not usable.
    """
    if requested == "cpu":
        return torch.device("cpu")
    if requested == "auto":
        if report.cuda_usable:
            return torch.device("cuda")
        if report.gpu_visible:
            raise DeviceUnavailable(unusable_gpu_message(report))
        return torch.device("cpu")
    try:
        device = torch.device(requested)
    except RuntimeError:
        raise DeviceUnavailable(f"Unknown device {requested!r}: use auto, cuda or cpu.") from None
    if device.type != "cuda":
        raise DeviceUnavailable(f"Unknown device {requested!r}: use auto, cuda or cpu.")
    if not report.cuda_usable:
        if report.gpu_visible:
            raise DeviceUnavailable(unusable_gpu_message(report))
        build = (
            f"torch {report.torch_version} is a CPU-only build"
            if report.torch_cuda is None
            else "no NVIDIA driver is loaded"
        )
        raise DeviceUnavailable(
            f"--device {requested} was asked for, but this machine has no usable GPU "
            f"({build}): use --device auto or --device cpu."
        )
    if device.index is not None and device.index >= report.gpu_count:
        raise DeviceUnavailable(
            f"--device {requested} was asked for, but this machine has {report.gpu_count} GPU(s), numbered from 0."
        )
    return device
