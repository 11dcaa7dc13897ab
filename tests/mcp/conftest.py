"""MCP servers for the tests: the SDK's own server (`servers/facts.py`, over
stdio or streamable HTTP on 127.0.0.1) and one written by hand to misbehave
(`servers/raw.py`); and a check that none of their processes is left."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from localrun.mcp.servers import ServerSpec

SERVERS = Path(__file__).parent / "servers"
FACTS = SERVERS / "facts.py"
RAW = SERVERS / "raw.py"


def python_server(name: str, script: Path, *args: str, env: dict[str, str] | None = None) -> ServerSpec:
    return ServerSpec(name, "test", command=sys.executable, args=(str(script), *args), env=env or {})


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie has ended: it is not alive)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def pids(pidfile: Path) -> list[int]:
    return [int(line) for line in pidfile.read_text().split()] if pidfile.exists() else []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def pidfile(tmp_path: Path) -> Iterator[Path]:
    """Where the servers write their pids; after the test, none of them may still run."""
    path = tmp_path / "pids"
    yield path
    left = [pid for pid in pids(path) if alive(pid)]
    assert not left, f"server processes left running: {left}"


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[str]:
    """The facts server over streamable HTTP on 127.0.0.1; its address."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(FACTS), "http", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None:
                    pytest.fail("the HTTP server did not start")
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(10)
