"""Putting a run together: a model file and the run's settings become what
an engine is made of, before anything loads.

Every way localrun starts a model (generate, chat, `--batch`, serve, and the
scripts that measure them) goes through `assemble`: it places the run on
this machine's devices (`localrun.runtime.placement`, memory measured once),
settles what is automatic from this machine's wisdom (`localrun.tune.apply`)
and makes the `EngineConfig` that carries both. Nothing here prints: the
notes a person should see come back in `Assembled`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from localrun.errors import LocalrunError
from localrun.gguf.info import N_UBATCH, ModelInfo, describe
from localrun.gguf.reader import GGUFInfo, read_gguf
from localrun.runtime import devices as devices_module
from localrun.runtime.devices import Device
from localrun.runtime.engine import EngineConfig
from localrun.runtime.placement import Placement, place
from localrun.settings import AUTO, RunSettings
from localrun.system import cpu_count
from localrun.tune import apply as tuned
from localrun.tune.wisdom import Wisdom

PINNED = ("option", "config", "model")  # where a thread count comes from that adapting must keep


@dataclass(frozen=True)
class Assembled:
    """A run put together: its engine configuration (with the placement), the
    model's header, the settings as settled, this machine's wisdom for the
    model, and what to tell a person about them."""

    config: EngineConfig
    info: GGUFInfo
    settings: RunSettings
    wisdom: Wisdom | None = None
    warnings: tuple[str, ...] = ()
    hint: str | None = None  # how to tune the model, said once per model
    gpu_hint: str | None = None  # a GPU the build cannot use, and the setup command that builds for it

    @property
    def placement(self) -> Placement:
        assert self.config.placement is not None  # assemble always places
        return self.config.placement

    @property
    def verify_curve(self) -> tuple[float, ...] | None:
        return self.wisdom.verify_curve if self.wisdom is not None else None


def report(settings: RunSettings, placement: Placement | None) -> dict[str, Any]:
    """The run's settings as `--json` and the history show them (each
    `{"value", "source"}`, with `"why"` for an automatic one), the placement
    among them: where the model runs and the memory budgeted for it."""
    shown = settings.as_dict()
    if placement is not None:
        reasons = dict(placement.reasons)
        given = settings.sources.get("memory_budget", "default")
        shown["placement"] = {"value": placement.model.describe(), "source": "default", "why": reasons["model"]}
        shown["memory_budget"] = {"value": placement.budget or None, "source": given, "why": reasons["budget"]}
    return shown


def _draft_shape(draft: Path | None) -> ModelInfo | None:
    """The draft model's shape, for its share of a GPU; a draft file that
    cannot be read is left to the speculative path, which says why."""
    if draft is None:
        return None
    try:
        return describe(read_gguf(draft))
    except (LocalrunError, OSError):
        return None


def sample_on(settings: RunSettings, placement: Placement) -> RunSettings:
    """Where a plain generation samples, settled: as asked, or on auto on the
    device when it holds the output layer (the logits are made there, and
    llama.cpp then copies one token to the host, not a vocabulary's row),
    else on the host, with the reason."""
    if settings.sample_on != AUTO:
        return settings
    if placement.model.whole:
        where, why = "device", "the output layer is on the GPU: the sampler chain runs in llama.cpp's graph there"
    else:
        where, why = "host", "the logits are made on the CPU"
    return replace(settings, sample_on=where, reasons={**settings.reasons, "sample_on": why})


def assemble(
    path: Path,
    settings: RunSettings,
    *,
    need: int | None = None,
    depth: int | None = None,
    verbose: bool = False,
    hint_once: bool = False,
    devices: Sequence[Device] | None = None,
    use_wisdom: bool = True,
    draft: Path | None = None,
) -> Assembled:
    """The run of the model at ``path`` with ``settings`` (after the
    precedence rule of `localrun.settings.resolve`): placed on ``devices``
    (None: this machine's, probed now), its automatic values settled from
    the wisdom (``need``: the context the run needs, ``depth``: the depth it
    mostly decodes at, when known; ``use_wisdom`` False: llama.cpp's
    defaults, as a benchmark comparing with llama.cpp's own tools needs;
    ``draft``: the draft model that will run beside it, placed in the same
    plan). The model is not loaded."""
    info = read_gguf(path)
    shape = describe(info)
    type_k, type_v = ("f16" if t == AUTO else t for t in (settings.type_k, settings.type_v))  # f16 if any fits
    found_devices = devices_module.probe() if devices is None else tuple(devices)
    placement = place(
        found_devices,
        memory_budget=settings.memory_budget,
        shape=shape,
        need=need or settings.n_ctx,
        kv=(type_k, type_v),
        gpu_layers=settings.gpu_layers,
        device=settings.device,
        draft=_draft_shape(draft) if devices_module.offload_targets(found_devices) else None,
    )
    found = (
        tuned.find(path, (settings.type_k, settings.type_v), hint_once=hint_once) if use_wisdom else tuned.Found(None)
    )
    settings = tuned.apply(
        settings, shape, found.wisdom, need=need, depth=depth, budget=placement.budget, kv_pairs=placement.kv_pairs
    )
    settings = sample_on(settings, placement)
    # a count given is kept; with every layer on a GPU nothing decodes on the CPU, and nothing adapts
    adaptive = settings.sources.get("threads") not in PINNED and not placement.model.whole
    config = EngineConfig(
        model_path=info.path,
        n_ctx=settings.n_ctx,
        placement=placement,
        n_threads=settings.threads,
        adapt_threads=adaptive,
        max_threads=cpu_count() if adaptive else None,
        n_ubatch=settings.n_ubatch or N_UBATCH,
        type_k=settings.type_k,
        type_v=settings.type_v,
        flash_attn=settings.flash_attn,
        verbose=verbose,
        sample_on=settings.sample_on,
    )
    gpu_hint = devices_module.unused_gpu(found_devices) if settings.gpu_layers != "0" else None
    warnings = list(found.warnings)
    kv = (settings.type_k, settings.type_v)
    if placement.model.offloaded and kv not in placement.kv_pairs:
        warnings.append(
            f"KV {kv[0]}/{kv[1]} on a GPU: llama.cpp's CUDA flash attention has kernels for matching K and V "
            "types only, and falls back to a slower path for this pair; --kv q8_0 (or f16) keeps them matched"
        )
    return Assembled(config, info, settings, found.wisdom, tuple(warnings), found.hint, gpu_hint)
