"""A remote reasoning model's thinking (`reasoning_content` in the stream)
comes through as it does from a local one, and `--stats` counts it (issue 54:
the remote dropped it; the stats line had no thinking count)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import cli
from tests.serve.conftest import Server, start
from tests.tinymodel import THINK_TOKENS, THINKING_CHATML, write_tiny_model

RUN = ("-t", "0", "-n", "16", "--reasoning-budget", "5")


@pytest.fixture(scope="module")
def thinker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("models") / "thinker.gguf"
    return write_tiny_model(path, chat_template=THINKING_CHATML, extra_tokens=THINK_TOKENS, n_ctx_train=1024)


@pytest.fixture(scope="module")
def thinking_server(thinker: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from start(tmp_path_factory.mktemp("home"), "-m", str(thinker), "--parallel", "1")


def _split(stdout: str) -> tuple[str, str, dict[str, Any]]:
    """The thinking, the answer and the done event of `generate --json`."""
    parsed = [json.loads(line) for line in stdout.splitlines()]
    thinking = "".join(e["text"] for e in parsed if e["type"] == "reasoning")
    answer = "".join(e["text"] for e in parsed if e["type"] == "token")
    return thinking, answer, parsed[-1]


def test_the_remote_thinking_is_the_local_one(thinking_server: Server, thinker: Path) -> None:
    local = cli("generate", "-m", str(thinker), "-t", "0", "-n", "16", "--spec", "none", "--json", "hello")
    assert local.returncode == 0, local.stderr
    remote = cli("generate", "-m", thinking_server.url + "/v1", "-t", "0", "-n", "16", "--json", "hello")
    assert remote.returncode == 0, remote.stderr
    (thought, answer, done), (local_thought, local_answer, local_done) = _split(remote.stdout), _split(local.stdout)
    assert thought and thought == local_thought and answer == local_answer
    assert done["reasoning_tokens"] > 0 and done["generated_tokens"] == local_done["generated_tokens"]


def test_stats_count_the_thinking(thinker: Path) -> None:
    ran = cli("generate", "-m", str(thinker), *RUN, "--stats", "--no-log", "hello")
    assert ran.returncode == 0, ran.stderr
    assert "16 tokens (6 thinking)" in ran.stderr  # five of thinking and the closing marker the budget forced
