"""What the benchmark scripts share: model names resolved through localrun's
store, and a --help that shows every option's default.

A model name is anything localrun accepts: a registry alias
(`qwen2.5-coder:1.5b`), `owner/repo:QUANT`, `hf://owner/repo/file.gguf`, or a
GGUF path. A registry model is pulled on first use.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from localrun import store
from localrun.errors import LocalrunError
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
