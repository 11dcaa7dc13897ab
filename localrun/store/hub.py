"""Hugging Face Hub downloads into the standard Hugging Face cache.

huggingface-hub resolves the file (its env vars apply: HF_HOME, HF_HUB_CACHE,
HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE) and lays out the cache. The transfer of
an LFS file's bytes is localrun's own, because huggingface-hub deletes a
partial file when a download stops: localrun writes `blobs/<sha256>.incomplete`,
resumes it with a Range request after a dropped connection or a Ctrl-C,
checks the sha256 against the hub's, and only then moves it to
`blobs/<sha256>`, where `hf_hub_download` finds it and links it into the
snapshot. A transfer silent for HF_HUB_DOWNLOAD_TIMEOUT seconds is resumed;
five in a row that bring no new byte end the pull. Nothing past the announced
size is written, and the sha256 alone decides what enters the cache.
"""

from __future__ import annotations

import errno
import hashlib
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from localrun.errors import DownloadError, ModelNotFoundError, SourceUnreachableError
from localrun.events import TransferProgress
from localrun.paths import ensure_dir, why_failed

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20
_ATTEMPTS = 5  # transfers in a row that end with no new byte written
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


_NO_CONNECTION = {"ConnectError", "ConnectTimeout", "ConnectionError", "OfflineModeIsEnabled"}
_CUT = {"TransportError", "StreamError", "RemoteProtocolError", "ReadTimeout", "ReadError"}


def _named(exc: BaseException, names: set[str]) -> bool:
    """Matched by class name: the client raises its HTTP library's classes (httpx2 in huggingface-hub 2.x)."""
    return bool(names & {cls.__name__ for cls in type(exc).__mro__})


def unreachable(exc: BaseException) -> bool:
    """No answer from the hub: DNS or connection failure, offline mode, or a
    connection cut (or silent) before any answer, as a hub that takes the
    connection and drops it does; as opposed to an HTTP answer."""
    return _named(exc, _NO_CONNECTION | _CUT)


UNREACHABLE_HINT = "check your network, or HF_ENDPOINT if you set it"


def _unreachable_error(exc: BaseException) -> SourceUnreachableError:
    return SourceUnreachableError(f"the hub cannot be reached ({f'{exc}' or type(exc).__name__})", UNREACHABLE_HINT)


def _transport_error(exc: BaseException) -> bool:
    return _named(exc, _CUT)


def check_reachable() -> None:
    """A quick TCP connect to the endpoint: huggingface-hub itself retries a
    failed name lookup with backoff for about half a minute per file."""
    from huggingface_hub import constants

    url = urlsplit(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "", port), timeout=5).close()
    except OSError as exc:
        raise SourceUnreachableError(
            f"the hub cannot be reached ({url.hostname}: {exc.strerror or exc})", UNREACHABLE_HINT
        ) from exc


def cached(repo: str, file: str, revision: str | None = None) -> Path | None:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, file, revision=revision)
    return Path(found) if isinstance(found, str) else None


def cached_files(repo: str, revision: str | None = None) -> list[str]:
    """The files of the repo's snapshot in the local cache (paths inside the repo)."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    folder = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo, repo_type="model")
    ref = folder / "refs" / (revision or "main")
    commit = ref.read_text().strip() if ref.is_file() else (revision or "")
    snapshot = folder / "snapshots" / commit if commit else None
    if snapshot is None or not snapshot.is_dir():
        return []
    return sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())


@dataclass(frozen=True)
class HubFile:
    """A file in a hub repo as its listing says: path, size and (for an LFS file) sha256."""

    path: str
    size: int
    sha256: str | None


def _gated(repo: str) -> DownloadError:
    return DownloadError(
        f"{repo} is gated: its files come only to an account that accepted its terms",
        hint="accept them on the repo's hub page, then set HF_TOKEN to a token of that account",
    )


def list_files(repo: str, revision: str | None = None) -> list[HubFile]:
    """Every file of the repo, with the sha256 the hub publishes for each LFS file."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError
    from huggingface_hub.hf_api import RepoFile

    check_reachable()
    try:
        tree = HfApi().list_repo_tree(repo, recursive=True, revision=revision)
        return [
            HubFile(f.path, f.size, f.lfs.sha256 if f.lfs is not None else None)
            for f in tree
            if isinstance(f, RepoFile)
        ]
    except GatedRepoError as exc:
        raise _gated(repo) from exc
    except RevisionNotFoundError as exc:
        raise ModelNotFoundError(f"no revision {revision!r} in {repo} on the hub") from exc
    except RepositoryNotFoundError as exc:
        raise ModelNotFoundError(f"no repo {repo!r} on the hub", hint="check the owner and the repo name") from exc
    except Exception as exc:
        if unreachable(exc):
            raise _unreachable_error(exc) from exc
        raise DownloadError(f"listing {repo} failed: {exc}") from exc


def _length(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_failed(exc: OSError, path: Path, file: str, resumes: bool) -> DownloadError:
    """A download stopped because its file in the cache could not be written."""
    kept = _length(path) if resumes else 0
    what = f"{kept} bytes of {file} kept" if resumes else f"nothing of {file} kept"
    again = "run the pull again: it resumes where it stopped" if resumes else "run the pull again"
    hint = f"free some space, then {again}" if exc.errno in _DISK_FULL else again
    return DownloadError(f"could not write {path}: {why_failed(exc)} ({what})", hint=hint)


def _transfer(
    url: str, headers: dict[str, str], part: Path, size: int | None, label: str, progress: TransferProgress | None
) -> None:
    """GET ``url`` into ``part``, continuing from its current length, never
    past ``size`` (a server that sends more is cut off: the hash decides)."""
    from huggingface_hub import constants, get_session

    start = _length(part)
    if size is not None and start >= size:
        return
    request_headers = {**headers, **({"Range": f"bytes={start}-"} if start else {})}
    timeout = constants.HF_HUB_DOWNLOAD_TIMEOUT
    with get_session().stream("GET", url, headers=request_headers, follow_redirects=True, timeout=timeout) as response:
        if response.status_code == 416:
            return  # nothing past what we have: the hash decides
        if response.status_code == 200:
            start = 0  # the server sent the whole file
        elif response.status_code != 206:
            raise DownloadError(f"the hub answered {response.status_code} for {label}")
        with part.open("r+b" if part.exists() else "wb") as out:
            out.seek(start)
            out.truncate()
            done = start
            for received in response.iter_bytes():  # as it comes: a cut-off loses nothing received
                chunk = received if size is None else received[: size - done]
                out.write(chunk)
                done += len(chunk)
                if progress:
                    progress(label, done, size)
                if size is not None and done >= size:
                    break


@dataclass(frozen=True)
class Expected:
    """The sha256 a file must have and where that comes from ("pinned in models.toml")."""

    sha256: str
    origin: str


def _fetch_blob(
    repo: str, file: str, label: str, progress: TransferProgress | None, revision: str | None, expected: Expected | None
) -> None:
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import repo_folder_name
    from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]  # public, not in __all__

    url = hf_hub_url(repo, file, revision=revision)
    meta = get_hf_file_metadata(url)
    sha = (meta.etag or "").strip('"')
    if not _SHA256.match(sha):
        return  # not an LFS file: small, hf_hub_download fetches it whole; `download` checks it after
    if expected is not None and sha != expected.sha256:
        raise DownloadError(
            f"{file}: the hub serves a file with sha256 {sha}, not the {expected.sha256} {expected.origin};"
            " nothing was downloaded",
            hint="the repo changed: pull it by its repo name, or update the entry's sha256",
        )
    blobs = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo, repo_type="model") / "blobs"
    blob = blobs / sha
    if blob.exists():
        return
    ensure_dir(blobs)
    part = blobs / f"{sha}.incomplete"
    location = meta.location or url
    same_host = urlsplit(location).netloc == urlsplit(url).netloc
    headers = build_hf_headers() if same_host else {}
    idle = 0
    while True:
        before = _length(part)
        try:
            _transfer(location, headers, part, meta.size, label, progress)
            break
        except Exception as exc:
            if isinstance(exc, OSError) and not isinstance(exc, ConnectionError):
                raise write_failed(exc, part, file, resumes=True) from exc  # the disk, not the network
            idle = 0 if _length(part) > before else idle + 1
            if not _transport_error(exc) or idle == _ATTEMPTS:
                why = f"{exc}" or type(exc).__name__
                raise DownloadError(
                    f"download of {file} was cut off at {_length(part)} bytes: {why}",
                    hint="run the pull again: it resumes where it stopped",
                ) from exc
    got, length = sha256_of(part), _length(part)
    if got != sha:
        part.unlink(missing_ok=True)
        announced = f" of the {meta.size} announced" if meta.size is not None and meta.size != length else ""
        raise DownloadError(
            f"{file}: sha256 mismatch from the hub: got {got} ({length} bytes{announced}), expected {sha};"
            " the file was deleted",
            hint="pull it again",
        )
    try:
        part.replace(blob)
    except OSError as exc:
        raise write_failed(exc, part, file, resumes=True) from exc


def download(
    repo: str,
    file: str,
    label: str,
    progress: TransferProgress | None = None,
    *,
    revision: str | None = None,
    expected: Expected | None = None,
) -> Path:
    """The file in the Hugging Face cache, downloading (and resuming) it as
    needed; its bytes are checked against the sha256 the hub publishes for it,
    which must be ``expected`` when one is given."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        FileMetadataError,
        GatedRepoError,
        LocalEntryNotFoundError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
    )

    check_reachable()
    try:
        _fetch_blob(repo, file, label, progress, revision, expected)
        path = Path(hf_hub_download(repo, file, revision=revision))
        if expected is not None and sha256_of(path) != expected.sha256:  # a small file the hub keeps outside LFS
            remove(repo, file, revision)
            raise DownloadError(f"{file}: sha256 mismatch: expected {expected.sha256} {expected.origin}")
        return path
    except GatedRepoError as exc:
        raise _gated(repo) from exc
    except (RemoteEntryNotFoundError, RepositoryNotFoundError) as exc:
        raise ModelNotFoundError(f"{repo}/{file} is not on the hub", hint="check the repo and file name") from exc
    except LocalEntryNotFoundError as exc:  # no usable answer from the hub, and not in the cache
        if isinstance(exc.__cause__, FileMetadataError):  # it answered, but not like a hub
            raise DownloadError(f"{repo}/{file}: {exc.__cause__}", hint="check HF_ENDPOINT") from exc
        raise SourceUnreachableError("the hub cannot be reached", UNREACHABLE_HINT) from exc
    except (DownloadError, ModelNotFoundError):
        raise
    except Exception as exc:
        if unreachable(exc):
            raise _unreachable_error(exc) from exc
        if isinstance(exc, OSError) and exc.filename:
            raise  # a folder of the cache that cannot be made: a path for the user to fix
        raise DownloadError(f"download of {file} failed: {exc}") from exc


def remove(repo: str, file: str, revision: str | None = None) -> int:
    """Delete the file's snapshot link and blob; returns the bytes freed."""
    path = cached(repo, file, revision)
    if path is None:
        return 0
    blob = path.resolve()
    freed = _length(blob)
    blob.unlink(missing_ok=True)
    path.unlink(missing_ok=True)
    return freed
