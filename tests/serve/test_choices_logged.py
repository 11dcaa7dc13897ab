"""A request with `n` choices is one line in the run history with every
choice in it (issue 54: only choice 0 was logged)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import cli
from tests.serve.conftest import start


def test_n_choices_are_logged_together(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    home = tmp_path_factory.mktemp("home")
    for server in start(home, "-m", str(tiny_model), "--parallel", "2"):
        reply = server.client().chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4, n=2, seed=3, temperature=1.5
        )
        assert reply.usage is not None and reply.usage.completion_tokens == 8
        texts = [choice.message.content for choice in reply.choices]
        assert server.stop() == 0
    env = {"LOCALRUN_HOME": str(home / "localrun")}
    (newest,) = json.loads(cli("logs", "-n", "1", "--json", env=env).stdout)
    assert newest["generated_tokens"] == 8  # both choices' tokens, not the first's 4
    shown = json.loads(cli("logs", "show", str(newest["id"]), "--json", env=env).stdout)
    assert shown["response"] == f"[choice 0]\n{texts[0]}\n\n[choice 1]\n{texts[1]}"
