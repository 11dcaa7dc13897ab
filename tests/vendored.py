"""The chat templates the vendored llama.cpp ships (``models/templates/`` in
the pinned llama-cpp-python sdist), read from the sdist that scripts/setup
keeps in the wheelhouse (fetched with pip when it is not there), so tests
can render every family's real template without a llama.cpp build."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = "vendor/llama.cpp/models/templates/"


def llama_cpp_version() -> str:
    match = re.search(r'"llama-cpp-python==([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert match, "pyproject.toml pins no llama-cpp-python version"
    return match.group(1)


def wheelhouse() -> Path:
    if house := os.environ.get("LOCALRUN_WHEELHOUSE"):
        return Path(house)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "localrun" / "wheelhouse"


def sdist() -> Path:
    """The pinned sdist, where scripts/setup keeps it; downloaded once if missing."""
    version = llama_cpp_version()
    home = wheelhouse() / "sdist"
    path = home / f"llama_cpp_python-{version}.tar.gz"
    if not path.is_file():
        home.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "-q",
                    "--no-deps",
                    "--no-binary=:all:",
                    "-d",
                    tmp,
                    f"llama-cpp-python=={version}",
                ],
                check=True,
            )
            Path(tmp, path.name).replace(path)
    return path


@functools.cache
def templates() -> dict[str, str]:
    """Every vendored template by file name (``Qwen-Qwen3-0.6B.jinja``, ...)."""
    found: dict[str, str] = {}
    with tarfile.open(sdist(), "r:gz") as tar:
        for member in tar.getmembers():
            _, _, inner = member.name.partition("/")
            if member.isfile() and inner.startswith(TEMPLATES) and inner.endswith(".jinja"):
                handle = tar.extractfile(member)
                assert handle is not None
                found[inner.removeprefix(TEMPLATES)] = handle.read().decode("utf-8")
    assert found, f"no templates under {TEMPLATES} in {sdist()}"
    return found


def template(name: str) -> str:
    """One vendored template by file name, with or without ``.jinja``."""
    return templates()[name if name.endswith(".jinja") else f"{name}.jinja"]
