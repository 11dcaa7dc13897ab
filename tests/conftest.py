from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from localrun.events import Event, Stats, TokenEvent
from tests.tinymodel import write_tiny_model

# A shell that starts a background job without job control makes it ignore
# SIGINT, and every process it starts inherits that: the Ctrl-C tests would
# then test nothing. A handler (unlike "ignore") is reset at exec, so the
# localrun processes the tests start get Python's usual Ctrl-C behaviour.
signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every user directory localrun or huggingface-hub could touch goes to tmp."""
    home = tmp_path / "home"
    monkeypatch.setenv("LOCALRUN_HOME", str(home / "localrun"))
    monkeypatch.setenv("HF_HOME", str(home / "hf"))
    for var in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME"):
        monkeypatch.setenv(var, str(home / var.lower()))
    monkeypatch.delenv("LOCALRUN_MODEL", raising=False)
    monkeypatch.delenv("LOCALRUN_DEBUG", raising=False)
    yield


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_model(models_dir: Path) -> Path:
    return write_tiny_model(models_dir / "tiny.gguf")


@pytest.fixture(scope="session")
def eos_model(models_dir: Path) -> Path:
    return write_tiny_model(models_dir / "tiny-eos.gguf", eos_first=True)


@pytest.fixture(scope="session")
def wide_model(models_dir: Path) -> Path:
    """Head size 32: what quantized KV cache blocks need."""
    return write_tiny_model(models_dir / "wide.gguf", n_embd=128, n_head=4, n_head_kv=2)


@pytest.fixture(scope="session")
def long_model(models_dir: Path) -> Path:
    """Trained context of 32k tokens: generation runs long enough to interrupt."""
    return write_tiny_model(models_dir / "tiny-long.gguf", n_ctx_train=32768)


def cli(
    *args: str, input: str | None = None, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `python -m localrun ARGS` with stdin as given (empty when None)."""
    return subprocess.run(
        [sys.executable, "-m", "localrun", *args],
        input=input if input is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )


def on_terminal(*args: str, rows: int = 30, cols: int = 100) -> tuple[int | None, str]:
    """Run `python -m localrun ARGS` on a pseudo-terminal; (exit status, what the screen got)."""
    import pexpect

    child = pexpect.spawn(
        sys.executable,
        ["-m", "localrun", *args],
        env={**os.environ, "TERM": "xterm-256color", "COLUMNS": str(cols), "LINES": str(rows)},
        encoding="utf-8",
        timeout=60,
        dimensions=(rows, cols),
    )
    child.expect(pexpect.EOF)
    child.close()
    return child.exitstatus, child.before or ""


def collect(events: Iterable[Event]) -> tuple[str, Stats]:
    """A generation's text and its closing stats."""
    text, stats = "", None
    for ev in events:
        if isinstance(ev, TokenEvent):
            text += ev.text
        else:
            stats = ev.stats
    assert stats is not None
    return text, stats
