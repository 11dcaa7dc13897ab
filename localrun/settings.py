"""The one precedence rule for a run's settings.

A command-line option wins; then the model's `defaults` in models.toml; then
the user's config.toml; then localrun's built-in default. Every command
resolves its settings here, and each value remembers where it came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from localrun.config import FLASH_ATTN_MODES, KV_TYPES, UserConfig
from localrun.errors import UsageError

Source = Literal["option", "model", "config", "default"]
AUTO_CTX = "auto"
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


@dataclass(frozen=True)
class RunSettings:
    """The settings a run uses, each with its source (`sources[name]`)."""

    n_ctx: int | None  # None: auto, the longest context that fits the memory budget
    type_k: str
    type_v: str
    flash_attn: str
    threads: int | None  # None: all the CPUs this process may use
    memory_budget: int | None  # None: the available RAM less a reserve
    system: str | None
    draft: str
    parallel: int | None  # None: as many as fit
    sources: Mapping[str, Source] = field(default_factory=dict)


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
    for flag, value in (("--kv", options.kv), ("--kv-k", options.kv_k), ("--kv-v", options.kv_v)):
        if value is not None and value not in KV_TYPES:
            raise UsageError(f"unknown KV cache type {value!r} for {flag}", hint=f"use {', '.join(KV_TYPES)}")
    if options.flash_attn is not None and options.flash_attn not in FLASH_ATTN_MODES:
        raise UsageError(f"unknown --flash-attn value {options.flash_attn!r}", hint="use auto, on or off")


def _first(*candidates: tuple[Source, Any]) -> tuple[Any, Source]:
    for source, value in candidates:
        if value is not None:
            return value, source
    return None, "default"


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
            ("default", "f16"),
        ),
        "type_v": _first(
            ("option", options.kv_v or options.kv),
            ("model", model.get("kv_v") or model.get("kv")),
            ("config", user.kv_v),
            ("default", "f16"),
        ),
        "flash_attn": _first(("option", options.flash_attn), ("config", user.flash_attn), ("default", "auto")),
        "threads": _first(("option", options.threads), ("config", user.threads)),
        "memory_budget": _first(("option", options.memory_budget), ("config", user.memory_budget)),
        "system": _first(("option", options.system), ("model", model.get("system"))),
        "draft": _first(("option", options.draft), ("config", user.draft), ("default", "auto")),
        "parallel": _first(("option", options.parallel), ("config", user.parallel)),
    }
    ctx = picked["ctx"][0]
    return RunSettings(
        n_ctx=parse_ctx(ctx) if isinstance(ctx, str) else ctx,
        type_k=picked["type_k"][0],
        type_v=picked["type_v"][0],
        flash_attn=picked["flash_attn"][0],
        threads=picked["threads"][0],
        memory_budget=picked["memory_budget"][0],
        system=picked["system"][0],
        draft=picked["draft"][0],
        parallel=picked["parallel"][0],
        sources={name: source for name, (_, source) in picked.items()},
    )
