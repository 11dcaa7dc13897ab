"""The precedence rule for a run's settings, before wisdom.

A command-line option wins; then the model's `defaults` in models.toml; then
the user's config.toml; then the built-in default, which is llama.cpp's own
where speed depends on it. Every command resolves its settings here, and each
value remembers where it came from. `resolve` never reads the wisdom: what
`localrun tune` measured on this machine is applied afterwards, by
`localrun.tune.apply`, to each setting still at its default (source "wisdom").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from localrun.config import FLASH_ATTN_MODES, KV_TYPES, UserConfig
from localrun.errors import UsageError

Source = Literal["option", "model", "config", "wisdom", "default"]
AUTO = "auto"
DEFAULT_TEMPERATURE = 0.8
AUTO_CTX = AUTO
SAMPLE_ON = (AUTO, "host", "device")
# speculation's modes (`--spec`, config.toml's `draft`; any other draft value names a draft model)
SPEC_MODES = (AUTO, "lookup", "mtp", "none")
NO_DRAFT_MODEL = ("lookup", "mtp", "none")  # the modes that never load a draft model
MTP_MODES = (AUTO, "mtp")  # the modes that draft with the model's own MTP head where it has one
MODEL_BOUND = ("mtp",)  # modes bound to the model's own parts: /model's next model does not keep them
MIN_CTX = 16  # a context smaller than this is refused


@dataclass(frozen=True)
class Options:
    """What the command line says; None where an option was not given."""

    ctx: str | None = None  # a number of tokens, or "auto"
    kv: str | None = None
    kv_k: str | None = None
    kv_v: str | None = None
    flash_attn: str | None = None
    threads: int | None = None
    memory_budget: int | None = None
    system: str | None = None
    draft: str | None = None
    parallel: int | None = None
    gpu_layers: str | None = None  # auto, all or a count (0: the CPU)
    device: str | None = None  # one device by llama.cpp's name (CUDA0); None: every GPU
    sample_on: str | None = None  # auto, host or device
    template: str | None = None  # --template: a built-in chat template's name, or a Jinja file


@dataclass(frozen=True)
class RunSettings:
    """The settings a run uses, each with its source (`sources[name]`)."""

    n_ctx: int | None  # None: auto, the longest context that fits the memory budget
    type_k: str  # "auto" until `localrun.tune.apply` settles it
    type_v: str
    flash_attn: str
    threads: int | None  # None: llama.cpp's default (the physical cores)
    memory_budget: int | None  # None: the available RAM less a reserve
    system: str | None
    draft: str
    parallel: int | None  # None: the tuned count, else llama-server's default
    n_ubatch: int | None = None  # prompt batch size; None: llama.cpp's default
    gpu_layers: str = "auto"  # layers on the GPU: auto (all that fit), all, or a count (0: the CPU)
    device: str | None = None  # the one device layers go to; None: every GPU
    sample_on: str = AUTO  # where decoding samples: auto (the device holding the output layer), host, device
    sources: Mapping[str, Source] = field(default_factory=dict)
    reasons: Mapping[str, str] = field(default_factory=dict)  # why an automatic value is what it is

    @property
    def kv_news(self) -> bool:
        """Whether the automatic KV cache type is worth a note at a terminal:
        it is not f16 (the default) because the context does not fit at f16.
        A type this machine's measurements found faster (source "wisdom") is
        a default like the tuned thread count: said by `--json` and
        `--verbose`, not on every run."""
        chosen = "kv" in self.reasons and (self.type_k, self.type_v) != ("f16", "f16")
        return chosen and self.sources.get("type_k") != "wisdom"

    def as_dict(self) -> dict[str, Any]:
        """Each setting with its value and source (and reason, where there is one): `--json`."""
        values = {
            "ctx": self.n_ctx,
            "type_k": self.type_k,
            "type_v": self.type_v,
            "flash_attn": self.flash_attn,
            "threads": self.threads,
            "draft": self.draft,
            "parallel": self.parallel,
            "n_ubatch": self.n_ubatch,
            "sample_on": self.sample_on,
        }
        result: dict[str, Any] = {}
        for name, value in values.items():
            why = self.reasons.get("kv" if name in ("type_k", "type_v") else name)
            result[name] = {"value": value, "source": self.sources.get(name, "default")} | ({"why": why} if why else {})
        return result


def check_context(n_ctx: int) -> int:
    if n_ctx < MIN_CTX:
        raise UsageError(f"context size {n_ctx} is too small", hint=f"use --ctx {MIN_CTX} or more")
    return n_ctx


def parse_ctx(value: str) -> int | None:
    """`--ctx`: a number of tokens (at least MIN_CTX), or None for auto."""
    if value == AUTO_CTX:
        return None
    try:
        n_ctx = int(value)
    except ValueError:
        raise UsageError(f"--ctx {value!r} is not a number", hint="use --ctx auto or --ctx 8192") from None
    return check_context(n_ctx)


def _check_options(options: Options) -> None:
    for flag, value, allowed in (
        ("--kv", options.kv, (AUTO, *KV_TYPES)),
        ("--kv-k", options.kv_k, KV_TYPES),
        ("--kv-v", options.kv_v, KV_TYPES),
    ):
        if value is not None and value not in allowed:
            raise UsageError(f"unknown KV cache type {value!r} for {flag}", hint=f"use {', '.join(allowed)}")
    if options.flash_attn is not None and options.flash_attn not in FLASH_ATTN_MODES:
        raise UsageError(f"unknown --flash-attn value {options.flash_attn!r}", hint="use auto, on or off")
    if options.sample_on is not None and options.sample_on not in SAMPLE_ON:
        raise UsageError(f"unknown --sample-on value {options.sample_on!r}", hint="use auto, host or device")


def _first(*candidates: tuple[Source, Any]) -> tuple[Any, Source]:
    for source, value in candidates:
        if value is not None:
            return value, source
    return None, "default"


def sampling_defaults(
    temperature: float | None, max_tokens: int | None, user: UserConfig | None = None
) -> tuple[float, int | None]:
    """`--temperature` and `--max-tokens`: the option, then config.toml, then
    the built-in default (0.8, and no limit)."""
    user = user or UserConfig()
    picked_temperature, _ = _first(("option", temperature), ("config", user.temperature))
    picked_max, _ = _first(("option", max_tokens), ("config", user.max_tokens))
    return (DEFAULT_TEMPERATURE if picked_temperature is None else picked_temperature), picked_max


def resolve(
    options: Options, model_defaults: Mapping[str, Any] | None = None, user: UserConfig | None = None
) -> RunSettings:
    """Apply the precedence: option, then the model's registry defaults, then
    config.toml, then the built-in default. Option values are checked first."""
    _check_options(options)
    model = model_defaults or {}
    user = user or UserConfig()
    picked: dict[str, tuple[Any, Source]] = {
        "ctx": _first(("option", options.ctx), ("model", model.get("ctx"))),
        "type_k": _first(
            ("option", options.kv_k or options.kv),
            ("model", model.get("kv_k") or model.get("kv")),
            ("config", user.kv_k),
            ("default", AUTO),
        ),
        "type_v": _first(
            ("option", options.kv_v or options.kv),
            ("model", model.get("kv_v") or model.get("kv")),
            ("config", user.kv_v),
            ("default", AUTO),
        ),
        "flash_attn": _first(("option", options.flash_attn), ("config", user.flash_attn), ("default", "auto")),
        "threads": _first(("option", options.threads), ("config", user.threads)),
        "memory_budget": _first(("option", options.memory_budget), ("config", user.memory_budget)),
        "system": _first(("option", options.system), ("model", model.get("system")), ("config", user.system)),
        "draft": _first(("option", options.draft), ("config", user.draft), ("default", "auto")),
        "parallel": _first(("option", options.parallel), ("config", user.parallel)),
        "gpu_layers": _first(("option", options.gpu_layers), ("default", "auto")),
        "device": _first(("option", options.device)),
        "sample_on": _first(("option", options.sample_on), ("default", AUTO)),
    }
    ctx = picked["ctx"][0]
    type_k, type_v = picked["type_k"][0], picked["type_v"][0]
    if (type_k == AUTO) != (type_v == AUTO):  # one type given: the other stays f16, as llama.cpp's
        type_k, type_v = ("f16" if type_k == AUTO else type_k), ("f16" if type_v == AUTO else type_v)
    return RunSettings(
        n_ctx=parse_ctx(ctx) if isinstance(ctx, str) else ctx,
        type_k=type_k,
        type_v=type_v,
        flash_attn=picked["flash_attn"][0],
        threads=picked["threads"][0],
        memory_budget=picked["memory_budget"][0],
        system=picked["system"][0],
        draft=picked["draft"][0],
        parallel=picked["parallel"][0],
        gpu_layers=str(picked["gpu_layers"][0]),
        device=picked["device"][0],
        sample_on=picked["sample_on"][0],
        sources={name: source for name, (_, source) in picked.items()},
    )


def layers_without_a_gpu(settings: RunSettings) -> tuple[RunSettings, str | None]:
    """`--gpu-layers N` (or all) where no GPU can take a layer (a CPU-only
    build, a machine without one): as llama.cpp does, the run goes on on the
    CPU, with a warning (the settings, and the warning). A value that is not
    a count stays, for the placement to refuse by name."""
    asked = settings.gpu_layers
    if settings.device is not None:  # one device named: the placement says it is not a GPU
        return settings, None
    try:
        layers = 1 if asked == "all" else int(asked)
    except ValueError:
        return settings, None
    if layers <= 0:
        return settings, None
    warning = f"--gpu-layers {asked}: this build or machine has no GPU, so the model runs on the CPU"
    return replace(settings, gpu_layers=AUTO), warning
