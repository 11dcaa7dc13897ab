from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tinymodel import write_tiny_model

# A shell that starts a background job without job control makes it ignore
# SIGINT, and every process it starts inherits that: the Ctrl-C tests would
# then test nothing. A handler (unlike "ignore") is reset at exec, so the
# localrun processes the tests start get Python's usual Ctrl-C behaviour.
signal.signal(signal.SIGINT, signal.default_int_handler)

# A second's probe of flash attention per fresh home would add minutes to the suite: llama.cpp's auto, as
# before, in every process the tests start (module-scoped servers start before any function's fixture);
# tests/tune/test_attention.py turns it on for its own.
os.environ["LOCALRUN_PROBE_ATTENTION"] = "0"


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


@pytest.fixture
def quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine reads as idle to tune and bench, whatever else runs while the
    tests do (a measurement under load decides nothing: localrun.runtime.load)."""
    from localrun.runtime import load

    monkeypatch.setattr(load, "runnable_others", lambda: 0)
