"""Which remote a model name means: `[remotes.NAME]` in models.toml (by its
name or as `remote:NAME`), a URL given as the model, or `--remote URL`.

The API key is read from the environment variable the remote names (ad hoc:
LOCALRUN_REMOTE_API_KEY), never from the command line, and is kept out of
every repr, message and record.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from localrun.errors import ModelNotFoundError, UsageError
from localrun.store.registry import Registry, RemoteEntry

PREFIX = "remote:"
AD_HOC_KEY_ENV = "LOCALRUN_REMOTE_API_KEY"
DEFAULT_TIMEOUT_S = 300.0  # the longest wait for the next bytes of an answer (a loaded server is slow to start one)


@dataclass(frozen=True)
class Remote:
    """A server to run on: its base URL (ending in /v1), the model id to send
    (None: the first the server lists), and its key."""

    label: str  # what messages call it: the remote's name, or its URL
    url: str
    model: str | None = None
    api_key_env: str | None = None
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = DEFAULT_TIMEOUT_S


def is_url(name: str) -> bool:
    return name.startswith(("http://", "https://"))


def base_url(url: str) -> str:
    """The API's base: the URL as given without a trailing slash, with /v1
    added when it names only a host (``http://gpu-box:8000``)."""
    url = url.rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"{url!r} is not an http:// or https:// URL", hint="for example http://gpu-box:8000/v1")
    return url if parts.path not in ("", "/") else url + "/v1"


def _from_entry(entry: RemoteEntry, model: str | None = None) -> Remote:
    key = os.environ.get(entry.api_key_env) if entry.api_key_env else None
    return Remote(
        label=entry.name,
        url=base_url(entry.url),
        model=model or entry.model,
        api_key_env=entry.api_key_env,
        api_key=key or None,
        timeout_s=entry.timeout or DEFAULT_TIMEOUT_S,
    )


def ad_hoc(url: str, model: str | None = None) -> Remote:
    key = os.environ.get(AD_HOC_KEY_ENV)
    return Remote(label=base_url(url), url=base_url(url), model=model, api_key_env=AD_HOC_KEY_ENV, api_key=key or None)


def find_remote(name: str | None, registry: Registry, remote_url: str | None = None) -> Remote | None:
    """The remote ``name`` means, or None for a local model. With
    ``remote_url`` (`--remote URL`), ``name`` is the model id sent to it."""
    if remote_url is not None:
        return ad_hoc(remote_url, name)
    if name is None:
        return None
    if is_url(name):
        return ad_hoc(name)
    if name.startswith(PREFIX):
        remote_name = name[len(PREFIX) :]
        if remote_name not in registry.remotes:
            known = ", ".join(sorted(registry.remotes)) or "none yet"
            raise ModelNotFoundError(
                f"unknown remote {remote_name!r}",
                hint=f"known: {known}; add [remotes.{remote_name or 'NAME'}] url = ... to models.toml",
            )
        return _from_entry(registry.remotes[remote_name])
    if name in registry.remotes:
        return _from_entry(registry.remotes[name])
    return None
