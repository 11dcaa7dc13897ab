"""The server an agent talks to: a `localrun serve` already answering on
the host and port asked for, else one started for the agent alone (on
loopback, a free port and a fresh random key), stopped when it is done."""

from __future__ import annotations

import contextlib
import json
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localrun.errors import LaunchError, RemoteUnavailableError
from localrun.launch.agents import Endpoint
from localrun.openmp import others_environ

DEFAULT_HOST = "127.0.0.1"  # `localrun serve`'s defaults
DEFAULT_PORT = 8080
START_TIMEOUT_S = 300.0  # loading a large model from a slow disk takes minutes
STOP_TIMEOUT_S = 15.0  # serve's grace for requests in flight, and some

Progress = Callable[[str], None]


def _get(url: str, token: str | None = None, timeout: float = 2.0) -> Any:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def is_localrun(url: str) -> bool:
    """Whether a localrun server answers at ``url`` (its /health names it)."""
    try:
        health = _get(f"{url}/health")
    except (OSError, ValueError):
        return False
    return isinstance(health, dict) and health.get("server") == "localrun"


def _context(model: dict[str, Any]) -> int | None:
    meta = model.get("meta")
    n_ctx = meta.get("n_ctx") if isinstance(meta, dict) else None
    return n_ctx if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and n_ctx > 0 else None


def model_contexts(endpoint: Endpoint) -> dict[str, int | None]:
    """The models the server lists (/v1/models), in its order, each with its
    context in tokens (None: not loaded, so not known yet); a refused key is
    an error saying which variable to set."""
    try:
        listed = _get(f"{endpoint.v1}/models", endpoint.token, timeout=10)
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 401:
            raise RemoteUnavailableError(
                f"the localrun server at {endpoint.url} needs an API key",
                hint="set LOCALRUN_API_KEY to the key it was started with",
            ) from None
        raise RemoteUnavailableError(f"the localrun server at {endpoint.url} answered {exc.code}") from None
    except (OSError, ValueError) as exc:
        raise RemoteUnavailableError(f"the localrun server at {endpoint.url} did not answer: {exc}") from None
    return {str(m["id"]): _context(m) for m in listed.get("data", []) if isinstance(m, dict) and "id" in m}


def free_port(host: str = DEFAULT_HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


@dataclass
class Started:
    """A `localrun serve` started for the agent: its process, endpoint and log file."""

    process: subprocess.Popen[bytes]
    endpoint: Endpoint
    log: Path


def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:] if line.strip())


def _wait_healthy(started: Started, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not is_localrun(started.endpoint.url):
        code = started.process.poll()
        if code is not None:
            said = _tail(started.log)
            raise LaunchError(
                f"localrun serve stopped before it was ready (exit status {code})" + (f": {said}" if said else ""),
                hint=f"its log: {started.log}",
            )
        if time.monotonic() > deadline:
            raise LaunchError(
                f"localrun serve was not ready after {timeout_s:g} s",
                hint=f"its log: {started.log}; a larger --timeout gives a slow load more time",
            )
        time.sleep(0.2)


def stop(process: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM (serve finishes what is in flight, then exits), SIGKILL after ``timeout_s``."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextmanager
def started_server(
    model: str | None,
    log: Path,
    *,
    progress: Progress,
    host: str = DEFAULT_HOST,
    timeout_s: float = START_TIMEOUT_S,
    extra_args: tuple[str, ...] = (),
) -> Iterator[Started]:
    """`localrun serve` (``-m model``, or none: what serve serves by default)
    on ``host`` and a free port with a fresh key, its output in ``log``;
    ready when it answers /health; stopped on leaving, however that is.
    It runs in its own session, so a Ctrl-C at the terminal, which the
    agent takes, does not reach it."""
    port = free_port(host)
    token = secrets.token_urlsafe(24)
    argv = [sys.executable, "-m", "localrun", "serve", "--host", host, "--port", str(port), *extra_args]
    if model is not None:
        argv += ["-m", model]
    env = {**others_environ(), "LOCALRUN_API_KEY": token}  # by the environment: not in the process list
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as sink:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink, env=env, start_new_session=True
        )
    started = Started(process, Endpoint(f"http://{host}:{port}", token), log)
    try:
        progress(f"starting localrun serve on {host}:{port} (log: {log})")
        _wait_healthy(started, timeout_s)
        yield started
    finally:
        with contextlib.suppress(ProcessLookupError):
            stop(process)
