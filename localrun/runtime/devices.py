"""What the build and the machine offer a run: the host (its CPUs and the
memory the OS says is available) and every device llama.cpp's backends
report (a CUDA, ROCm, Metal or Vulkan GPU when the build has that backend,
and the devices of the RPC servers `localrun.runtime.rpc` registered).

`probe()` is the one seam: placement reads devices only through it, and
tests hand placement fake device lists instead. llama-cpp-python does not
bind ggml's device API, so it is called through ctypes on the libraries the
wheel ships (libggml for the registry, libggml-base for the device calls).
"""

from __future__ import annotations

import ctypes
import functools
import platform
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from localrun.system import available_memory, total_memory

Kind = Literal["cpu", "gpu", "igpu", "accel"]

HOST = "CPU"  # the host's name, as ggml's CPU backend names its device
_KINDS: dict[int, Kind] = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}  # enum ggml_backend_dev_type


@dataclass(frozen=True)
class Device:
    """One place a model's weights or KV cache can live, with its memory in bytes (0: unknown)."""

    name: str  # llama.cpp's: "CPU", "CUDA0", "Metal", "Vulkan0"
    description: str  # the device's own: a CPU or GPU model name
    kind: Kind
    free: int
    total: int

    @property
    def offloads(self) -> bool:
        """Whether layers can be placed on it (a GPU, discrete or integrated, or an RPC server's device)."""
        return self.kind in ("gpu", "igpu")

    @property
    def remote(self) -> bool:
        """An RPC server's device (`localrun.runtime.rpc`): llama.cpp calls
        them GPUs, names them RPC0, RPC1, ... and describes them by HOST:PORT."""
        return self.name.startswith("RPC")


_DYNAMIC = ("libggml-cuda", "libggml-hip", "libggml-vulkan", "libggml-metal")  # GGML_BACKEND_DL builds


def lib_dir() -> Path:
    import llama_cpp  # its lib/ folder holds the ggml libraries libllama is linked with

    return Path(llama_cpp.__file__).parent / "lib"


def library(name: str) -> ctypes.CDLL:
    """The ggml library ``name`` ("libggml.so") as libllama loaded it. The
    wheel holds copies, not links (libggml.so, libggml.so.0, ...), and each
    copy loaded is a library of its own, with its own device registry and
    abort callback: the one libllama links is named by its soname (the
    shortest name with a version), which the loader finds already loaded."""
    folder = lib_dir()
    versioned = [p for p in folder.glob(f"{name}.*") if p.name[len(name) + 1 :].split(".")[0].isdigit()]
    return ctypes.CDLL(str(min(versioned, key=lambda p: len(p.name), default=folder / name)))


@functools.cache
def load_dynamic_backends() -> None:
    """Register the GPU backends of a build made with GGML_BACKEND_DL, which
    are separate libraries that nothing links: once per process, before
    llama.cpp's backend starts. A build that links its backends (the default)
    has nothing to load."""
    folder = lib_dir()
    if not any(p.name.startswith(_DYNAMIC) for p in folder.glob("libggml-*")):
        return
    try:
        registry = library("libggml.so")
        registry.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
        registry.ggml_backend_load_all_from_path.restype = None
    except (OSError, AttributeError):
        return
    if registry.ggml_backend_dev_count() <= 1:  # the CPU alone: the GPU backends are not linked in
        registry.ggml_backend_load_all_from_path(str(folder).encode())


@dataclass(frozen=True)
class _Api:
    registry: ctypes.CDLL
    base: ctypes.CDLL


@functools.cache
def _api() -> _Api | None:
    """ggml's device calls with their C types; None when the libraries lack them."""
    load_dynamic_backends()
    try:
        registry, base = library("libggml.so"), library("libggml-base.so")
        registry.ggml_backend_dev_count.restype = ctypes.c_size_t
        registry.ggml_backend_dev_count.argtypes = []
        registry.ggml_backend_dev_get.restype = ctypes.c_void_p
        registry.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
        for text in (base.ggml_backend_dev_name, base.ggml_backend_dev_description):
            text.restype = ctypes.c_char_p
            text.argtypes = [ctypes.c_void_p]
        base.ggml_backend_dev_type.restype = ctypes.c_int
        base.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
        base.ggml_backend_dev_memory.restype = None
        size_p = ctypes.POINTER(ctypes.c_size_t)
        base.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, size_p, size_p]
    except (OSError, AttributeError):  # another platform's library names, or an older ggml
        return None
    return _Api(registry, base)


def handles(names: tuple[str, ...]) -> ctypes.Array[ctypes.c_void_p] | None:
    """A NULL-terminated array of the named devices' handles, as
    `llama_model_params.devices` takes it; None when one is not in this build."""
    api = _api()
    if api is None or not names:
        return None
    api.registry.ggml_backend_dev_by_name.restype = ctypes.c_void_p
    api.registry.ggml_backend_dev_by_name.argtypes = [ctypes.c_char_p]
    found = [api.registry.ggml_backend_dev_by_name(name.encode()) for name in names]
    if not all(found):
        return None
    return (ctypes.c_void_p * (len(found) + 1))(*found, None)


def _text(raw: bytes | None) -> str:
    return raw.decode("utf-8", errors="replace") if raw else ""


def backend_devices() -> tuple[Device, ...]:
    """Every device llama.cpp's backends report, with free memory read now."""
    api = _api()
    if api is None:
        return ()
    found = []
    for i in range(api.registry.ggml_backend_dev_count()):
        handle = api.registry.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        api.base.ggml_backend_dev_memory(handle, ctypes.byref(free), ctypes.byref(total))
        found.append(
            Device(
                name=_text(api.base.ggml_backend_dev_name(handle)),
                description=_text(api.base.ggml_backend_dev_description(handle)),
                kind=_KINDS.get(api.base.ggml_backend_dev_type(handle), "accel"),
                free=int(free.value),
                total=int(total.value),
            )
        )
    return tuple(found)


def probe() -> tuple[Device, ...]:
    """The host first (memory as the OS counts it: ggml's CPU device reports
    its total as free), then every other device the backends report. A run
    probes once, before anything loads, and carries what it found."""
    reported = backend_devices()
    cpu = next((d for d in reported if d.kind == "cpu"), None)
    host = Device(HOST, cpu.description if cpu else "", "cpu", available_memory(), total_memory())
    return (host, *(d for d in reported if d.kind != "cpu"))


_SMI_TIMEOUT_S = 5.0
_VENDORS = {"nvidia": ("cuda", "an NVIDIA GPU"), "amd": ("rocm", "an AMD GPU"), "apple": ("metal", "Apple Silicon")}


def gpu_vendor(*, root: Path = Path("/"), run_smi: Callable[[], bool] | None = None) -> str | None:
    """A GPU the machine has, whatever the build: "nvidia" (a device node, or
    `nvidia-smi -L` listing one), "amd" (ROCm's /dev/kfd) or "apple" (Apple
    Silicon); None when none is seen."""
    if (root / "dev" / "nvidia0").exists() or (run_smi or _smi_lists_a_gpu)():
        return "nvidia"
    if (root / "dev" / "kfd").exists():
        return "amd"
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return "apple"
    return None


def _smi_lists_a_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=_SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0 and "GPU" in done.stdout


def setup_hint(vendor: str | None, gpus: Sequence[Device]) -> str | None:
    """One line for a machine with a GPU (``vendor``) and a build that found
    no GPU device: the setup command that builds for it."""
    if vendor is None or gpus:
        return None
    backend, what = _VENDORS[vendor]
    return (
        f"this machine has {what} but this build of llama.cpp has no backend for it: "
        f"`LOCALRUN_BACKEND={backend} scripts/setup` builds one"
    )


def unused_gpu(found: tuple[Device, ...]) -> str | None:
    """`setup_hint` for a run: the GPU seen from device nodes only (no
    `nvidia-smi` call on every run); an RPC server's device is no GPU of this machine's."""
    return setup_hint(gpu_vendor(run_smi=lambda: False), local_gpus(found))


def host(devices: tuple[Device, ...]) -> Device:
    """The CPU and its memory: the first device of a probe."""
    return next((d for d in devices if d.kind == "cpu"), Device(HOST, "", "cpu", 0, 0))


def local_gpus(devices: tuple[Device, ...]) -> tuple[Device, ...]:
    """The offload targets of this machine's own (no RPC server's)."""
    return tuple(d for d in offload_targets(devices) if not d.remote)


def offload_targets(devices: tuple[Device, ...]) -> tuple[Device, ...]:
    """The devices layers could be placed on (none on a CPU-only build)."""
    return tuple(d for d in devices if d.offloads)
