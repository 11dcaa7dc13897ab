"""A real `localrun serve` process with the tiny model as the remote, and a
fault-injecting proxy in front of it; everything on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.remote.proxy import FaultProxy
from tests.serve.conftest import Server, start

KEY = "sk-remote-test-9f8e7d6c5b4a"


@pytest.fixture(autouse=True)
def no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    """No HTTP proxy from the environment: requests go straight to 127.0.0.1."""
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("LOCALRUN_API_KEY", raising=False)  # a remote given by URL reads it (a serve of yours has it)
    monkeypatch.delenv("LOCALRUN_REMOTE_API_KEY", raising=False)


@pytest.fixture(scope="module")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from start(tmp_path_factory.mktemp("home"), "-m", str(tiny_model), "--parallel", "2")


@pytest.fixture(scope="module")
def keyed(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from start(tmp_path_factory.mktemp("home"), "-m", str(tiny_model), "--api-key", KEY)


@pytest.fixture
def proxy(server: Server) -> Iterator[FaultProxy]:
    p = FaultProxy(server.url)
    try:
        yield p
    finally:
        p.close()
