"""The start-up self-check: reading the NVIDIA driver, and which device a request for auto/cuda/cpu gets.

A GPU cannot be conjured on this CPU machine, so the hosts are HostReports as probe_host() would make
them on each kind of machine; the driver readers run against files and a stand-in `nvidia-smi`.
"""

import os
import stat

import pytest
import torch

from engine.loading.device import (
    DeviceUnavailable,
    HostReport,
    _parse_driver_version,
    choose_device,
    nvidia_driver_version,
    probe_host,
)

GIB = 1024**3
NO_GPU = HostReport(driver_version=None, torch_version="2.14.1", torch_cuda="13.0", cuda_usable=False)
OLD_DRIVER = HostReport(
    driver_version="575.57.08",
    torch_version="2.14.1",
    torch_cuda="13.0",
    cuda_usable=False,
    cuda_error="The NVIDIA driver on your system is too old (found version 12090).",
)
CPU_TORCH = HostReport(driver_version="575.57.08", torch_version="2.14.1", torch_cuda=None, cuda_usable=False)
NO_ACCESS = HostReport(driver_version="575.57.08", torch_version="2.14.1", torch_cuda="12.6", cuda_usable=False)
ONE_GPU = HostReport(
    driver_version="575.57.08",
    torch_version="2.14.1",
    torch_cuda="12.6",
    cuda_usable=True,
    gpu_count=1,
    gpu_name="NVIDIA L40S",
    capability=(8, 9),
    free_bytes=44 * GIB,
    total_bytes=45 * GIB,
)


def fake_nvidia_smi(folder, stdout: str, code: int = 0):
    """An `nvidia-smi` on PATH that prints `stdout` (verbatim, from a file beside it) and exits with `code`."""
    (folder / "nvidia-smi.out").write_text(stdout)
    script = folder / "nvidia-smi"
    script.write_text(f'#!/bin/sh\n/bin/cat "{folder / "nvidia-smi.out"}"\nexit {code}\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return folder


@pytest.mark.parametrize(
    "text, version",
    [
        (
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  575.57.08  Sat May 24 07:21:18 UTC 2025\n"
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n",
            "575.57.08",
        ),
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs-builder@U16)\n",
            "580.65.06",
        ),
        ("NVRM version: NVIDIA UNIX aarch64 Kernel Module  535.104  Thu Aug 10 2023\n", "535.104"),
        ("nothing like a driver\n", None),
    ],
)
def test_driver_version_is_read_from_the_kernel_module_file(text, version):
    assert _parse_driver_version(text) == version


def test_driver_version_comes_from_the_proc_file_first(tmp_path, monkeypatch):
    proc = tmp_path / "version"
    proc.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.133.20  Fri Mar 14 2025\n")
    monkeypatch.setenv("PATH", str(fake_nvidia_smi(tmp_path, "999.1.1\n")))
    assert nvidia_driver_version(proc) == "570.133.20"


def test_without_the_proc_file_nvidia_smi_answers(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(fake_nvidia_smi(tmp_path, "575.57.08\n575.57.08\n")))
    assert nvidia_driver_version(tmp_path / "missing") == "575.57.08"


@pytest.mark.parametrize(
    "stdout, code",
    [
        ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", 9),
        ("", 0),
        ("No devices were found\n", 6),
    ],
)
def test_a_failing_nvidia_smi_means_no_driver(tmp_path, monkeypatch, stdout, code):
    monkeypatch.setenv("PATH", str(fake_nvidia_smi(tmp_path, stdout, code)))
    assert nvidia_driver_version(tmp_path / "missing") is None


def test_no_proc_file_and_no_nvidia_smi_means_no_driver(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert nvidia_driver_version(tmp_path / "missing") is None


def test_probe_on_this_machine_reports_the_torch_build():
    report = probe_host()
    assert report.torch_version == torch.__version__.split("+")[0]
    assert report.torch_cuda == torch.version.cuda
    assert report.cuda_usable == torch.cuda.is_available()
    if not report.cuda_usable:
        assert report.gpu_name is None and "CUDA is not usable" in report.summary()


def test_summary_names_driver_build_gpu_capability_and_memory():
    line = ONE_GPU.summary()
    for part in (
        "NVIDIA driver 575.57.08",
        "torch 2.14.1 (CUDA 12.6 build)",
        "NVIDIA L40S",
        "compute capability 8.9",
        "44.0 GiB free of 45.0 GiB",
    ):
        assert part in line
    assert NO_GPU.summary() == "no NVIDIA driver; torch 2.14.1 (CUDA 13.0 build); CUDA is not usable"


def test_cpu_is_always_granted():
    for report in (NO_GPU, OLD_DRIVER, CPU_TORCH, ONE_GPU):
        assert choose_device("cpu", report) == torch.device("cpu")


def test_auto_takes_a_usable_gpu_and_the_cpu_only_when_there_is_no_gpu():
    assert choose_device("auto", ONE_GPU) == torch.device("cuda")
    assert choose_device("auto", NO_GPU) == torch.device("cpu")


@pytest.mark.parametrize("requested", ["auto", "cuda"])
def test_a_driver_too_old_for_torchs_cuda_is_named_with_the_fix(requested):
    with pytest.raises(DeviceUnavailable) as error:
        choose_device(requested, OLD_DRIVER)
    message = str(error.value)
    assert "\n" not in message
    for part in (
        "driver 575.57.08",
        "built for CUDA 13.0",
        "needs driver 580 or newer",
        "--index-url https://download.pytorch.org/whl/cu126",
        "--device cpu",
    ):
        assert part in message


def test_a_cpu_only_torch_beside_a_gpu_is_named():
    with pytest.raises(DeviceUnavailable, match=r"driver 575\.57\.08\) but torch 2\.14\.1 is a CPU-only build"):
        choose_device("auto", CPU_TORCH)


def test_a_gpu_torch_cannot_reach_says_to_check_the_container():
    with pytest.raises(DeviceUnavailable) as error:
        choose_device("auto", NO_ACCESS)
    assert "built for CUDA 12.6) cannot use it" in str(error.value)
    assert "--gpus all" in str(error.value) and "CUDA_VISIBLE_DEVICES" in str(error.value)


def test_cuda_without_any_gpu_is_one_sentence():
    with pytest.raises(DeviceUnavailable) as error:
        choose_device("cuda", NO_GPU)
    assert str(error.value) == (
        "--device cuda was asked for, but this machine has no usable GPU "
        "(no NVIDIA driver is loaded): use --device auto or --device cpu."
    )


def test_a_gpu_index_past_the_last_gpu_is_refused():
    assert choose_device("cuda:0", ONE_GPU) == torch.device("cuda:0")
    with pytest.raises(DeviceUnavailable, match="has 1 GPU"):
        choose_device("cuda:1", ONE_GPU)
    with pytest.raises(DeviceUnavailable, match="Unknown device 'mps'"):
        choose_device("mps", ONE_GPU)


def test_the_engine_refuses_cuda_here_before_loading_anything(tmp_path):
    from engine.loading.load import load_model

    if torch.cuda.is_available():
        pytest.skip("this machine has a usable GPU")
    with pytest.raises(DeviceUnavailable):
        load_model("tiny-random", "cuda", tmp_path)
    assert not os.listdir(tmp_path), "nothing may be built or read before the device is checked"
