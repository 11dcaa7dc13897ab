"""`localrun ps`: the models a running server has loaded, with the memory
each holds, its slots in use and how long it has been idle (what its
/v1/models says)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from localrun.cli._output import out
from localrun.errors import RemoteError, RemoteUnavailableError
from localrun.remote.config import API_KEY_ENV
from localrun.units import human_bytes

TIMEOUT_S = 10.0


def ps_command(
    host: Annotated[str, typer.Option("--host", help="The server's address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="The server's port.")] = 8080,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar=API_KEY_ENV,
            help=f"The server's API key (also {API_KEY_ENV}).",
            show_default=False,
            show_envvar=False,
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout.")] = False,
) -> None:
    """The models a running `localrun serve` has loaded: memory, slots in use, idle time."""
    loaded = [m for m in _listed(host, port, api_key) if m.get("status", {}).get("value") != "unloaded"]
    if as_json:
        out().json({"models": loaded}, indent=2)
        return
    if not loaded:
        out().result("no model is loaded")
        return
    out().table(_table(loaded))


def _listed(host: str, port: int, api_key: str | None) -> list[dict[str, Any]]:
    """The server's /v1/models entries."""
    import httpx2 as httpx

    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/v1/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(url, headers=headers, timeout=TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise RemoteUnavailableError(f"no server answers at {url}: {exc}", hint="start one: localrun serve") from exc
    if response.status_code in (401, 403):
        raise _refused(f"http://{shown}:{port}", bool(api_key))
    if response.status_code != 200:
        raise RemoteError(f"{url}: HTTP {response.status_code}: {response.text[:200]}")
    data = response.json().get("data")
    if not isinstance(data, list):
        raise RemoteError(f"{url}: not a model list")
    return [m for m in data if isinstance(m, dict)]


def _refused(server: str, key_given: bool) -> RemoteUnavailableError:
    """The server wants its API key: where ps reads one."""
    where = f"--api-key or {API_KEY_ENV}"
    if key_given:
        return RemoteUnavailableError(
            f"the server at {server} refused the API key given ({where})",
            hint=f"give the key the server was started with (its --api-key or {API_KEY_ENV})",
        )
    return RemoteUnavailableError(
        f"the server at {server} needs its API key: ps reads it from {where}",
        hint=f"export {API_KEY_ENV}=KEY, the key `localrun serve` was started with",
    )


def _table(models: list[dict[str, Any]]) -> object:
    from localrun.ui.table import Column, FitTable

    columns = (
        Column("MODEL"),
        Column("STATUS"),
        Column("MEMORY", drop=3),
        Column("SLOTS", justify="right"),
        Column("QUEUED", justify="right", drop=2),
        Column("IDLE", justify="right", drop=1),
    )
    table = FitTable(columns, box=None, pad_edge=False)
    for model in models:
        status = model.get("status", {})
        memory = status.get("memory") or {}
        busy = status.get("slots_busy", 0) or status.get("queued", 0)
        table.add_row(
            str(model.get("id")) + (" (pinned)" if status.get("pinned") else ""),
            str(status.get("value", "?")),
            ", ".join(f"{device} {human_bytes(size)}" for device, size in memory.items()) or "-",
            f"{status.get('slots_busy', 0)}/{status.get('slots', 0)}" if "slots" in status else "-",
            str(status.get("queued", 0)) if "queued" in status else "-",
            "busy" if busy else _idle(status.get("idle_s")),
        )
    return table


def _idle(seconds: object) -> str:
    if not isinstance(seconds, int | float):
        return "-"
    whole = int(seconds)
    return f"{whole // 60}m{whole % 60:02d}s" if whole >= 60 else f"{whole}s"
