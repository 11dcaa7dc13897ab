"""Which remote a model name means: `[remotes.NAME]` in models.toml (by its
name or as `remote:NAME`), a URL given as the model, or `--remote URL`.

The API key is read from the environment variable the remote names (ad hoc:
LOCALRUN_API_KEY, the variable `localrun serve` and `ps` read, so one key
works both ends; LOCALRUN_REMOTE_API_KEY, its old name, when that is not
set), never from the command line, and is kept out of every repr, message
and record.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from localrun.errors import ModelNotFoundError, UsageError
from localrun.store.names import is_hub_address
from localrun.store.registry import Registry, RemoteEntry

PREFIX = "remote:"
API_KEY_ENV = "LOCALRUN_API_KEY"  # the key of a server given by URL, as `serve` and `ps` read it
OLD_API_KEY_ENV = "LOCALRUN_REMOTE_API_KEY"  # its old name for a remote: read when API_KEY_ENV is not set
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
    """A server's URL given as the model; the hub's web addresses name model files (localrun.store.names)."""
    return name.startswith(("http://", "https://")) and not is_hub_address(name)


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
    """A server given by its URL; its key from LOCALRUN_API_KEY, else LOCALRUN_REMOTE_API_KEY."""
    env = OLD_API_KEY_ENV if not os.environ.get(API_KEY_ENV) and os.environ.get(OLD_API_KEY_ENV) else API_KEY_ENV
    key = os.environ.get(env)
    return Remote(label=base_url(url), url=base_url(url), model=model, api_key_env=env, api_key=key or None)


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
