"""What this machine and this build offer localrun, for `localrun doctor`:
the llama.cpp build (its version, backends and their flags), the devices
with their memory, where the registry's default model would go, and how
fast `localrun tune` measured it here. Nothing here prints, loads a model or
downloads one; `examine` returns a `Report` the command renders.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localrun import store
from localrun.config import UserConfig
from localrun.errors import LocalrunError
from localrun.runtime import devices as devices_module
from localrun.runtime.devices import Device, gpu_vendor, local_gpus
from localrun.runtime.placement import Placement
from localrun.settings import Options, resolve
from localrun.store.registry import Registry
from localrun.tune.wisdom import Decision, Wisdom


@dataclass(frozen=True)
class Backend:
    """One of the build's ggml backends, with the flags it was built with."""

    name: str  # "CPU", "CUDA", "Metal", "Vulkan"
    flags: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Speed:
    """What `localrun tune` measured for a model on this machine, in tokens/s."""

    decode: float | None  # one sequence, at the fastest thread count measured
    prompt: float | None  # prompt evaluation, at the fastest batch size measured
    batch: float | None  # sequences decoded together, all of them, at the fastest parallel count
    kv: str
    measured_at: str

    def to_json(self) -> dict[str, Any]:
        return {
            "decode_tokens_per_s": self.decode,
            "prompt_tokens_per_s": self.prompt,
            "batch_tokens_per_s": self.batch,
            "kv": self.kv,
            "measured_at": self.measured_at,
        }


@dataclass(frozen=True)
class DefaultModel:
    """The registry's default model: where it would run, and how fast it ran here."""

    name: str
    path: Path | None  # None: not downloaded
    placement: Placement | None = None
    speed: Speed | None = None
    note: str = ""  # why a part is missing, and the command that fills it

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": str(self.path) if self.path else None,
            "placement": self.placement.to_json() if self.placement else None,
            "speed": self.speed.to_json() if self.speed else None,
            "note": self.note or None,
        }


@dataclass(frozen=True)
class Report:
    version: str  # llama-cpp-python's
    backends: tuple[Backend, ...]
    devices: tuple[Device, ...]
    model: DefaultModel
    hint: str | None = None  # a GPU this build cannot use, and the command that builds for it

    @property
    def gpu_build(self) -> bool:
        """Whether the build reaches a GPU of this machine's: a device layers can be placed on."""
        return bool(local_gpus(self.devices))

    @property
    def rpc_devices(self) -> tuple[Device, ...]:
        """The devices of RPC servers (`--rpc`), each described by its server's HOST:PORT."""
        return tuple(d for d in self.devices if d.remote)

    def to_json(self) -> dict[str, Any]:
        return {
            "llama_cpp_python": self.version,
            "backends": [{"name": b.name, "flags": dict(b.flags)} for b in self.backends],
            "gpu_build": self.gpu_build,
            "devices": [
                {"name": d.name, "description": d.description, "kind": d.kind}
                | {"free_bytes": d.free, "total_bytes": d.total, "rpc": d.remote}
                for d in self.devices
            ],
            "default_model": self.model.to_json(),
            "hint": self.hint,
        }


def parse_system_info(text: str) -> tuple[Backend, ...]:
    """The backends in `llama_print_system_info`'s text: `NAME : KEY = VALUE | ...`
    for each backend registered, e.g. `CUDA : ARCHS = 900 | USE_GRAPHS = 1 | CPU : AVX2 = 1 |`."""
    found: list[tuple[str, list[tuple[str, str]]]] = []
    for part in text.split("|"):
        head, colon, rest = part.partition(" : ")
        if colon:  # a backend's first flag follows its name
            found.append((head.strip(), []))
        key, equals, value = (rest if colon else part).partition("=")
        if equals and found:
            found[-1][1].append((key.strip(), value.strip()))
    return tuple(Backend(name, tuple(flags)) for name, flags in found)


GPU_BACKENDS = frozenset({"CUDA", "ROCm", "MUSA", "MTL", "Metal", "Vulkan", "SYCL", "OpenCL"})  # ggml's names


def setup_hint(vendor: str | None, gpus: Sequence[Device], backends: Sequence[Backend] = ()) -> str | None:
    """One line for a machine with a GPU and a build that has no backend for
    one (no GPU device, no GPU backend): the setup command that builds for it."""
    if vendor is None or gpus or any(b.name in GPU_BACKENDS for b in backends):
        return None
    return devices_module.setup_hint(vendor, gpus)


def speed_of(wisdom: Wisdom) -> Speed:
    """The best rates `localrun tune` measured (its figures are ms per token)."""

    def best(decision: Decision | None) -> float | None:
        times = [v for v in (decision.figures.values() if decision else ()) if v > 0]
        return 1000 / min(times) if times else None

    decode = best(wisdom.threads)
    if decode is None and wisdom.verify_ms and wisdom.verify_ms[0] > 0:
        decode = 1000 / wisdom.verify_ms[0]
    return Speed(decode, best(wisdom.n_ubatch), best(wisdom.parallel), wisdom.kv, wisdom.measured_at)


def default_model(registry: Registry, user: UserConfig, found: Sequence[Device]) -> DefaultModel:
    """Where the registry's default would run on ``found``, if it is downloaded
    (never pulled), and its speed here from the wisdom."""
    from localrun.assemble import assemble  # loads llama.cpp's bindings

    target = store.parse(registry.default, registry)
    path = store.locate(target)
    if path is None:
        return DefaultModel(target.label, None, note=f"not downloaded: `localrun pull {target.label}`")
    try:
        settings = resolve(Options(), target.entry.defaults if target.entry else None, user)
        run = assemble(path, settings, devices=found, hint_once=False)
    except LocalrunError as exc:  # a damaged file: the rest of the report stands
        return DefaultModel(target.label, path, note=str(exc))
    if run.wisdom is None:
        unmeasured = f"not measured here: `localrun tune {target.label}`"
        return DefaultModel(target.label, path, run.placement, note=unmeasured)
    speed = speed_of(run.wisdom)
    if speed.decode is None and speed.prompt is None and speed.batch is None:  # a tune that kept no rate
        kept_none = (
            f"no speed kept from the tune of {speed.measured_at} (the machine was busy, or it measured "
            f"nothing that decides): `localrun tune {target.label}` on a quiet machine"
        )
        return DefaultModel(target.label, path, run.placement, note=kept_none)
    return DefaultModel(target.label, path, run.placement, speed)


def examine(registry: Registry, user: UserConfig | None = None) -> Report:
    """This machine and build, as `localrun doctor` shows them."""
    import llama_cpp

    from localrun.runtime.llama_log import init_backend

    init_backend()  # the backends register their devices (quietly)
    found = devices_module.probe()
    backends = parse_system_info(llama_cpp.llama_print_system_info().decode("utf-8", errors="replace"))
    return Report(
        version=llama_cpp.__version__,
        backends=backends,
        devices=found,
        model=default_model(registry, user or UserConfig(), found),
        hint=setup_hint(gpu_vendor(), local_gpus(found), backends),
    )
