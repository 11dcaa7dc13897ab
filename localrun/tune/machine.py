"""What makes a measurement belong to one machine: the CPU model and its
flags, how many CPUs the process may use, and the llama.cpp build.

Wisdom measured under another `Machine` is ignored: a figure from one CPU
decides nothing on another.
"""

from __future__ import annotations

import hashlib
import platform
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

from localrun.system import cpu_count
from localrun.units import count


def _cpuinfo() -> tuple[str, str]:
    """(model name, flags) of the first CPU in /proc/cpuinfo; the platform's
    processor string and nothing elsewhere."""
    model, flags = "", ""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "Model", "cpu model") and not model:
                model = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = value.strip()
            if model and flags:
                break
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), flags


@cache
def cpu_name() -> str:
    """The CPU model as the OS names it (the run history records it)."""
    return _cpuinfo()[0]


def _build() -> str:
    """llama-cpp-python's version and the CPU features its llama.cpp was built for."""
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode(errors="replace")
    features = [
        part.split("=")[0].strip() for part in info.replace("CPU :", "").split("|") if part.strip().endswith("= 1")
    ]
    return f"llama-cpp-python {llama_cpp.__version__} ({' '.join(features)})"


@dataclass(frozen=True)
class Machine:
    cpu: str  # the CPU model as the OS names it
    flags: str  # a digest of the CPU's flags (two CPUs of one name can differ)
    cpus: int  # CPUs this process may run on
    build: str  # the llama.cpp build
    device: str = "CPU"  # the GPUs the build can use (name, model, memory), or the CPU alone

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Any) -> Machine:
        if not isinstance(raw, dict):
            raise ValueError("machine is not an object")
        cpu, flags, cpus, build = (raw.get(name) for name in ("cpu", "flags", "cpus", "build"))
        if not (isinstance(cpu, str) and isinstance(flags, str) and isinstance(build, str) and isinstance(cpus, int)):
            raise ValueError("machine lacks cpu, flags, cpus or build")
        device = raw.get("device", "CPU")  # measured before GPUs were known: the CPU's
        if not isinstance(device, str):
            raise ValueError("machine's device is not a string")
        return cls(cpu, flags, cpus, build, device)

    def describe(self) -> str:
        where = f", {self.device}" if self.device != "CPU" else ""
        return f"{self.cpu}, {count(self.cpus, 'CPU')}{where}"


@cache
def this_machine() -> Machine:
    model, flags = _cpuinfo()
    digest = hashlib.sha256(" ".join(sorted(flags.split())).encode()).hexdigest()[:16]
    return Machine(cpu=model, flags=digest, cpus=cpu_count(), build=_build(), device=_gpus())


def _gpus() -> str:
    """The GPUs the build can use, as wisdom keys them: a figure measured on
    one GPU decides nothing on another, nor on the CPU alone."""
    from localrun.runtime import devices

    gpus = devices.offload_targets(devices.probe())
    return "; ".join(f"{d.name} {d.description} {round(d.total / 2**30)} GiB" for d in gpus) or "CPU"
