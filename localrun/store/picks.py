"""What a repo name without a quantization picked from the repo's listing
(Q4_K_M, or the repo's only quantization), kept in localrun's cache so the
name finds its file again without asking the hub (`--offline`)."""

from __future__ import annotations

import json
from pathlib import Path

from localrun import paths


def _file() -> Path:
    return paths.cache_dir() / "repo-picks.json"


def _key(repo: str, revision: str | None) -> str:
    return f"{repo}@{revision or 'main'}"


def _all() -> dict[str, str]:
    try:
        found = json.loads(_file().read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def remembered(repo: str, revision: str | None) -> str | None:
    """The file the repo's listing picked when it was last pulled by its name alone."""
    return _all().get(_key(repo, revision))


def remember(repo: str, revision: str | None, file: str) -> None:
    known = _all()
    if known.get(_key(repo, revision)) != file:
        paths.ensure_dir(_file().parent)
        paths.atomic_write(_file(), json.dumps({**known, _key(repo, revision): file}, indent=1))
