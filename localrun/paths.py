"""Every directory localrun uses, in one place, each with an environment override.

LOCALRUN_HOME puts everything under one folder (the tests use it); otherwise
the XDG base directories apply.
"""

from __future__ import annotations

import os
import tempfile
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


def history_db() -> Path:
    """The run history (localrun/history): an SQLite database."""
    return data_dir() / "history.db"


def history_off_marker() -> Path:
    """Present while `localrun logs off` is in force."""
    return config_dir() / "logs-off"


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write ``path`` whole or not at all: a temporary file in the same
    folder, then a rename. The folder must exist (a missing one is the
    user's to create: the OSError names it)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
