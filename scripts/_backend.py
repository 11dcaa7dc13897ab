"""Which accelerator scripts/setup builds llama.cpp for, and why.

    python scripts/_backend.py     prints three lines: the backend, the reason, its CMake flags

LOCALRUN_BACKEND=cpu|cuda|metal|vulkan|rocm decides when set. Otherwise the
machine is asked, in this order:
  cuda    `nvcc` and an NVIDIA driver that lists a GPU (`nvidia-smi -L`):
          nvcc alone, as on a machine with the toolkit and no GPU, is no GPU
  rocm    `hipcc` and an AMD GPU that `rocminfo` lists
  metal   macOS on Apple Silicon (`uname -s` Darwin, `uname -m` arm64)
  vulkan  `glslc` and a GPU that `vulkaninfo --summary` lists (discrete,
          integrated or virtual): a CPU-type Vulkan device (Mesa's llvmpipe
          or lavapipe, installed on many desktops and servers) is no GPU,
          and llama.cpp on it is far slower than its CPU backend
  cpu     anything else: the default, and what CI builds
CUDA builds for the GPUs present (`native`), or where none is visible (a
forced LOCALRUN_BACKEND=cuda) for CUDA_ARCHITECTURES. The tools are looked up
on PATH, so tests fake them. Standard library only: it runs before any .venv.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

BACKENDS = ("cpu", "cuda", "metal", "vulkan", "rocm")
CUDA_ARCHITECTURES = "75;80;86;89;90"  # Turing to Hopper: what CUDA 12 and 13 both compile for
FLAGS = {
    "cpu": "",
    "cuda": "-DGGML_CUDA=ON",
    "metal": "-DGGML_METAL=ON",
    "vulkan": "-DGGML_VULKAN=ON",
    "rocm": "-DGGML_HIP=ON",
}


def _run(*cmd: str) -> str | None:
    """The command's output, or None when it is missing, fails or hangs."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _nvidia_gpus() -> list[str]:
    listed = _run("nvidia-smi", "-L") or ""
    return [line.split(":", 1)[1].split("(")[0].strip() for line in listed.splitlines() if line.startswith("GPU ")]


_VULKAN_GPU_TYPES = ("DISCRETE_GPU", "INTEGRATED_GPU", "VIRTUAL_GPU")  # VkPhysicalDeviceType, less CPU and OTHER


def vulkan_devices(summary: str) -> list[tuple[str, str]]:
    """(deviceName, deviceType without its PHYSICAL_DEVICE_TYPE_ prefix) of
    each device in `vulkaninfo --summary`'s text, whose devices are blocks
    headed `GPU0:`, `GPU1:`...; the type is "" where the block gives none."""
    blocks: list[dict[str, str]] = [{}]
    for line in summary.splitlines():
        text = line.strip()
        if text.startswith("GPU") and text.endswith(":") and text[3:-1].isdigit():
            blocks.append({})
            continue
        key, equals, value = text.partition("=")
        if equals:
            blocks[-1][key.strip()] = value.strip()
    return [
        (b["deviceName"], b.get("deviceType", "").removeprefix("PHYSICAL_DEVICE_TYPE_"))
        for b in blocks
        if "deviceName" in b
    ]


_SOFTWARE = ("llvmpipe", "lavapipe", "swiftshader")  # Vulkan drivers that run on the CPU


def _vulkan_gpus(summary: str) -> tuple[list[str], list[str]]:
    """(the GPUs, the CPU-type devices) among the Vulkan devices listed; a
    device of no stated type is taken for a GPU unless its name is a
    software renderer's."""
    gpus: list[str] = []
    cpus: list[str] = []
    for name, kind in vulkan_devices(summary):
        software = kind == "CPU" or (not kind and any(s in name.lower() for s in _SOFTWARE))
        if software:
            cpus.append(name)
        elif kind in _VULKAN_GPU_TYPES or not kind:
            gpus.append(name)
    return gpus, cpus


def _vulkan() -> tuple[str, str] | None:
    """(backend, why) when `vulkaninfo` lists a device: a GPU builds for
    Vulkan, a CPU-type device alone for the CPU."""
    gpus, software = _vulkan_gpus(_run("vulkaninfo", "--summary") or "")
    if gpus:
        return "vulkan", f"glslc and a Vulkan GPU ({', '.join(gpus)}) found"
    if software:
        return "cpu", (
            f"glslc found, but the only Vulkan device is {', '.join(software)}, which runs on the CPU: "
            "llama.cpp's CPU backend is faster there"
        )
    return None


def _found(gpus: list[str]) -> tuple[str, str]:
    """(backend, why) from the machine's tools, in the order of the module's docstring."""
    if shutil.which("nvcc") and gpus:
        return "cuda", f"nvcc and {', '.join(gpus)} found"
    if shutil.which("hipcc") and "gfx" in (_run("rocminfo") or ""):
        return "rocm", "hipcc and an AMD GPU (rocminfo) found"
    if (_run("uname", "-s") or "").strip() == "Darwin" and (_run("uname", "-m") or "").strip() == "arm64":
        return "metal", "macOS on Apple Silicon"
    vulkan = _vulkan() if shutil.which("glslc") else None
    if vulkan is not None:
        return vulkan
    if shutil.which("nvcc"):
        return "cpu", "nvcc found, but no NVIDIA GPU or driver (nvidia-smi lists none)"
    return "cpu", "no GPU toolkit with a GPU found"


def detect() -> tuple[str, str, str]:
    """(backend, why, CMake flags)."""
    gpus = _nvidia_gpus()
    forced = os.environ.get("LOCALRUN_BACKEND", "").strip().lower()
    if forced and forced not in BACKENDS:
        raise SystemExit(f"setup: LOCALRUN_BACKEND={forced!r} is not one of {', '.join(BACKENDS)}")
    backend, why = (forced, f"LOCALRUN_BACKEND={forced}") if forced else _found(gpus)
    return backend, why, _flags(backend, gpus)


def _flags(backend: str, gpus: list[str]) -> str:
    flags = FLAGS[backend]
    if backend == "cuda":
        arch = "native" if gpus else CUDA_ARCHITECTURES
        flags += f" -DCMAKE_CUDA_ARCHITECTURES={arch}"
    return flags


def main() -> None:
    backend, why, flags = detect()
    sys.stdout.write(f"{backend}\n{why}\n{flags}\n")


if __name__ == "__main__":
    main()
