"""Real `localrun serve` processes on 127.0.0.1 (a port the system picks),
driven with the official `openai` client."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

LISTENING = re.compile(r"serving .* on (http://127\.0\.0\.1:\d+)/v1")


class Server:
    """A server process: its URL, a client for it, and every line it wrote to stderr."""

    def __init__(self, args: list[str], home: Path) -> None:
        self.key = args[args.index("--api-key") + 1] if "--api-key" in args else "none"
        env = {**os.environ, "LOCALRUN_HOME": str(home / "localrun"), "HF_HOME": str(home / "hf")}
        env.pop("LOCALRUN_API_KEY", None)
        for var in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME"):
            env[var] = str(home / var.lower())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "localrun", "serve", "--port", "0", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        self.clients: list[openai.OpenAI] = []  # closed with the server: none left for the GC to find open
        self.url = ""
        self.ready = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        if not self.ready.wait(120) or not self.url:
            self.proc.kill()
            raise RuntimeError("the server did not start:\n" + "".join(self.lines))

    def _read(self) -> None:
        assert self.proc.stderr is not None
        with self.proc.stderr:
            for line in self.proc.stderr:
                self.lines.append(line)
                found = LISTENING.search(line)
                if found and not self.url:
                    self.url = found.group(1)
                    self.ready.set()
        self.ready.set()  # the process ended

    def client(self, api_key: str | None = None) -> openai.OpenAI:
        api_key = api_key or self.key
        client = openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=120)
        self.clients.append(client)
        return client

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=60)
        self.reader.join(10)
        return code


def start(home: Path, *args: str) -> Iterator[Server]:
    server = Server(list(args), home)
    try:
        yield server
    finally:
        for client in server.clients:
            client.close()
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
        server.reader.join(10)


@pytest.fixture(scope="module")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Two slots on the tiny model."""
    yield from start(tmp_path_factory.mktemp("home"), "-m", str(tiny_model), "--parallel", "2")


@pytest.fixture(scope="module")
def roomy(long_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Room for tools described in the prompt (the byte-level tiny vocabulary spells them out), and an API key."""
    home = tmp_path_factory.mktemp("home")
    yield from start(home, "-m", str(long_model), "--ctx", "8192", "--parallel", "2", "--api-key", ROOMY_KEY)


ROOMY_KEY = "roomy-key-77"


@pytest.fixture(scope="module")
def keyed(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from start(tmp_path_factory.mktemp("home"), "-m", str(tiny_model), "--api-key", "sekrit-key-4242")


@pytest.fixture(scope="module")
def narrow(long_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One slot long enough to stay busy while a test looks, a queue of one, a second of grace."""
    home = tmp_path_factory.mktemp("home")
    yield from start(home, "-m", str(long_model), "--parallel", "1", "--queue", "1", "--ctx", "32768", "--grace", "1")
