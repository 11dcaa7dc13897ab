"""What the benchmark scripts share: model names resolved through localrun's
store, a model loaded as `localrun generate` loads it here, and a --help that
shows every option's default.

A model name is anything localrun accepts: a registry alias
(`qwen2.5-coder:1.5b`), `owner/repo:QUANT`, `hf://owner/repo/file.gguf`, or a
GGUF path. A registry model is pulled on first use.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from localrun import store
from localrun.assemble import assemble
from localrun.errors import LocalrunError
from localrun.runtime.engine import Engine, EngineConfig
from localrun.settings import Options, resolve
from localrun.store.registry import load as load_registry


def model_path(name: str) -> Path:
    """The GGUF file for a model name, pulled (with a one-line notice on
    stderr) if it is not on disk yet. A name that cannot be resolved ends the
    script with a one-line error, not a traceback."""

    def pull(target: store.Target) -> Path:
        print(f"pulling {target.label} (first use)...", file=sys.stderr, flush=True)
        return store.pull(target).path

    try:
        return store.resolve(name, load_registry(), pull_missing=pull).path
    except LocalrunError as exc:
        raise SystemExit(f"error: {exc.message}") from None


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The description as written, and each argument's default (when it has
    one) after its help."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is None or action.default is False or action.default == argparse.SUPPRESS:
            return text
        if "%(default)" in text:
            return text
        return text + " (default: %(default)s)"


def engine_config(model: Path, *, tuned: bool = False, verbose: bool = False, **options: Any) -> EngineConfig:
    """The engine configuration `localrun generate` would make for ``model``
    with these options (`localrun.settings.Options` fields, e.g. ``ctx="4096"``,
    ``threads=2``, ``kv_k="q8_0"``): placed on this machine, with its wisdom
    only when ``tuned`` (llama.cpp's defaults otherwise, as its own tools use)."""
    return assemble(model, resolve(Options(**options)), verbose=verbose, use_wisdom=tuned).config


def tuned_engine(target: Path, threads: int | None, n_ctx: int = 4096) -> tuple[Engine, tuple[float, ...] | None]:
    """The target as `localrun generate` runs it on this machine: its wisdom's
    threads, flash attention and prompt batch (`localrun tune`), with a
    context of ``n_ctx`` tokens; and the verify-cost curve the speculative
    controller starts from."""
    run = assemble(target, resolve(Options(ctx=str(n_ctx), threads=threads)))
    return Engine(run.config, run.info), run.verify_curve
