"""Every directory localrun uses, in one place, each with an environment override.

LOCALRUN_HOME puts everything under one folder (the tests use it); otherwise
the XDG base directories apply.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
import time
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
    folder, then a rename, so a failure (a full disk, a folder where the file
    should be) leaves the old file as it was. The folder must exist (a
    missing one is the user's to create). An OSError names ``path``, never
    the temporary file. The file gets the old one's mode, or a new file's
    (what the umask allows), not the temporary file's private 0600."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise _naming(exc, path) from exc
    try:
        with os.fdopen(fd, "wb") as f:
            with contextlib.suppress(OSError):  # a file system without modes (vfat) keeps its own
                os.fchmod(f.fileno(), _mode_for(path))
            f.write(raw)
        Path(tmp).replace(path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise _naming(exc, path) from exc
        raise


def _mode_for(path: Path) -> int:
    """The permission bits ``path`` has, or a new file's under the umask; the
    owner can always read and write it (a file of mode 000 is rewritten 0600)."""
    try:
        return stat.S_IMODE(path.stat().st_mode) | 0o600
    except OSError:
        return 0o666 & ~_umask()


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it
    (setting it to read it back would race with other threads' new files)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _naming(exc: OSError, path: Path) -> OSError:
    """``exc`` about ``path`` (the same errno, so the same OSError subclass)."""
    if exc.errno is None:
        return exc
    return OSError(exc.errno, exc.strerror or os.strerror(exc.errno), str(path))


def ensure_dir(path: Path) -> Path:
    """Create the folder ``path`` (and its parents) if need be. A file where
    a folder should be is NotADirectoryError naming that file (mkdir alone
    says "File exists", which reads as if all were well)."""
    for place in (path, *path.parents):
        if place.exists() and not place.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "a file is where a folder should be", str(place))
        if place.is_dir():
            break
    path.mkdir(parents=True, exist_ok=True)
    return path


def why_failed(exc: OSError | UnicodeDecodeError) -> str:
    """Why a file could not be read or written, in a few words without its
    path (the caller names it): "no such file", "it is a folder, not a file",
    "not UTF-8 text (byte 0xff at offset 0)", "permission denied"."""
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})"
    if isinstance(exc, IsADirectoryError):
        return "it is a folder, not a file"
    if isinstance(exc, FileNotFoundError):
        return "no such file"
    if isinstance(exc, NotADirectoryError):
        return "a file is where a folder should be on its path"
    return (exc.strerror or str(exc)).lower()


def move_aside(path: Path, extras: tuple[str, ...] = ()) -> Path:
    """Rename a damaged file the user may still want (the run history, the
    wisdom) out of the way instead of deleting it: NAME.corrupt-STAMP.EXT
    beside it, with its companions (``path`` + each suffix in ``extras``).
    Where it went."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = path.with_name(f"{path.stem}.corrupt-{stamp}{path.suffix}")
    n = 1
    while aside.exists():  # twice in one second: never overwrite an earlier one
        n += 1
        aside = path.with_name(f"{path.stem}.corrupt-{stamp}-{n}{path.suffix}")
    path.replace(aside)
    for suffix in extras:
        extra = path.with_name(path.name + suffix)
        if extra.exists():
            extra.replace(aside.with_name(aside.name + suffix))
    return aside
