"""Every directory localrun uses, in one place, each with an environment override.

LOCALRUN_HOME puts everything under one folder (the tests use it); otherwise
the XDG base directories apply.
"""

from __future__ import annotations

import os
from pathlib import Path


def _base(xdg_var: str, fallback: str, sub: str) -> Path:
    home = os.environ.get("LOCALRUN_HOME")
    if home:
        return Path(home) / sub
    root = os.environ.get(xdg_var) or str(Path.home() / fallback)
    return Path(root) / "localrun"


def config_dir() -> Path:
    return _base("XDG_CONFIG_HOME", ".config", "config")


def cache_dir() -> Path:
    return _base("XDG_CACHE_HOME", ".cache", "cache")


def data_dir() -> Path:
    return _base("XDG_DATA_HOME", ".local/share", "data")
