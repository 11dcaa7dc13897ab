"""scripts/_backend.py: which accelerator setup builds for, decided from the
tools on PATH (faked here) without compiling anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

DETECT = Path(__file__).resolve().parent.parent / "scripts" / "_backend.py"


def _tool(folder: Path, name: str, script: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)


def _detect(folder: Path, **env: str) -> tuple[str, str, str]:
    done = subprocess.run(
        [sys.executable, str(DETECT)],
        capture_output=True,
        text=True,
        env={"PATH": str(folder), **env},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    backend, why, flags = done.stdout.split("\n")[:3]
    return backend, why, flags


@pytest.fixture
def tools(tmp_path: Path) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    _tool(folder, "uname", 'case "$1" in -s) echo Linux;; -m) echo x86_64;; esac')
    return folder


def test_no_toolkit_is_the_cpu(tools: Path) -> None:
    assert _detect(tools) == ("cpu", "no GPU toolkit with a GPU found", "")


def test_nvcc_without_a_driver_stays_on_the_cpu(tools: Path) -> None:
    _tool(tools, "nvcc", "exit 0")
    _tool(tools, "nvidia-smi", "echo 'NVIDIA-SMI has failed' >&2; exit 9")
    backend, why, flags = _detect(tools)
    assert (backend, flags) == ("cpu", "") and "nvcc found, but no NVIDIA GPU" in why


def test_nvcc_and_a_gpu_build_for_cuda_natively(tools: Path) -> None:
    _tool(tools, "nvcc", "exit 0")
    _tool(tools, "nvidia-smi", "echo 'GPU 0: NVIDIA H200 (UUID: GPU-1234)'")
    backend, why, flags = _detect(tools)
    assert backend == "cuda" and "NVIDIA H200" in why
    assert flags == "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native"


def test_a_forced_cuda_build_without_a_gpu_takes_the_documented_list(tools: Path) -> None:
    backend, why, flags = _detect(tools, LOCALRUN_BACKEND="cuda")
    assert (backend, why) == ("cuda", "LOCALRUN_BACKEND=cuda")
    assert flags == "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=75;80;86;89;90"


def test_a_mac_on_apple_silicon_builds_for_metal(tools: Path) -> None:
    _tool(tools, "uname", 'case "$1" in -s) echo Darwin;; -m) echo arm64;; esac')
    assert _detect(tools) == ("metal", "macOS on Apple Silicon", "-DGGML_METAL=ON")


def test_rocm_and_vulkan_are_found_by_their_tools(tools: Path, tmp_path: Path) -> None:
    _tool(tools, "hipcc", "exit 0")
    _tool(tools, "rocminfo", "echo '  Name: gfx1100'")
    assert _detect(tools)[0::2] == ("rocm", "-DGGML_HIP=ON")
    vulkan = tmp_path / "vulkan"
    vulkan.mkdir()
    _tool(vulkan, "uname", "echo Linux")
    _tool(vulkan, "glslc", "exit 0")
    _tool(vulkan, "vulkaninfo", "echo 'deviceName = AMD Radeon'")
    assert _detect(vulkan)[0::2] == ("vulkan", "-DGGML_VULKAN=ON")


LLVMPIPE = """\
Devices:
========
GPU{n}:
\tapiVersion         = 1.3.230
\tvendorID           = 0x10005
\tdeviceType         = PHYSICAL_DEVICE_TYPE_CPU
\tdeviceName         = llvmpipe (LLVM 15.0.6, 256 bits)
\tdriverName         = llvmpipe
"""
RADEON = """\
GPU{n}:
\tapiVersion         = 1.3.246
\tvendorID           = 0x1002
\tdeviceType         = PHYSICAL_DEVICE_TYPE_DISCRETE_GPU
\tdeviceName         = AMD Radeon RX 7900 XTX (RADV NAVI31)
\tdriverName         = radv
"""


def _vulkaninfo(folder: Path, summary: str) -> None:
    _tool(folder, "vulkaninfo", f"[ \"$1\" = --summary ] && printf '%s' '{summary}'")
    _tool(folder, "glslc", "exit 0")


def test_a_cpu_type_vulkan_device_alone_is_no_gpu(tools: Path) -> None:
    _vulkaninfo(tools, LLVMPIPE.format(n=0))
    backend, why, flags = _detect(tools)
    assert (backend, flags) == ("cpu", "")
    assert "llvmpipe (LLVM 15.0.6, 256 bits)" in why and "runs on the CPU" in why


def test_a_gpu_beside_llvmpipe_builds_for_vulkan(tools: Path) -> None:
    _vulkaninfo(tools, LLVMPIPE.format(n=0) + RADEON.format(n=1))
    backend, why, flags = _detect(tools)
    assert (backend, flags) == ("vulkan", "-DGGML_VULKAN=ON")
    assert "AMD Radeon RX 7900 XTX" in why and "llvmpipe" not in why


def test_llvmpipe_without_glslc_is_the_plain_cpu_case(tools: Path) -> None:
    _vulkaninfo(tools, LLVMPIPE.format(n=0))
    (tools / "glslc").unlink()
    assert _detect(tools) == ("cpu", "no GPU toolkit with a GPU found", "")


def test_the_cpu_can_be_forced_and_a_wrong_name_is_refused(tools: Path) -> None:
    _tool(tools, "nvcc", "exit 0")
    _tool(tools, "nvidia-smi", "echo 'GPU 0: NVIDIA H200 (UUID: GPU-1234)'")
    assert _detect(tools, LOCALRUN_BACKEND="cpu") == ("cpu", "LOCALRUN_BACKEND=cpu", "")
    done = subprocess.run(
        [sys.executable, str(DETECT)],
        capture_output=True,
        text=True,
        env={**os.environ, "LOCALRUN_BACKEND": "opencl"},
        check=False,
    )
    assert done.returncode != 0 and "'opencl' is not one of cpu, cuda" in done.stderr
