"""`/save` keeps a reasoning model's thinking beside each reply, and
`--load` gives it back (issue 54: it was dropped)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localrun.runtime.chat import ChatSession, read_conversation
from localrun.runtime.engine import Engine
from localrun.runtime.prompt import chat_template
from localrun.runtime.sampling import SamplingParams
from tests.helpers import collect, engine_config
from tests.tinymodel import THINK_TOKENS, THINKING_CHATML, write_tiny_model


@pytest.fixture(scope="module")
def thinker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("models") / "thinker.gguf"
    return write_tiny_model(path, chat_template=THINKING_CHATML, extra_tokens=THINK_TOKENS, n_ctx_train=1024)


def test_save_keeps_the_thinking_and_load_gives_it_back(thinker: Path, tmp_path: Path) -> None:
    with Engine(engine_config(thinker, n_ctx=512, n_threads=2)) as engine:
        session = ChatSession(
            engine, chat_template(engine), SamplingParams(temperature=0.0), max_tokens=16, reasoning_budget=4
        )
        collect(session.reply(session.plan("hello")))
        (turn,) = session.turns
        assert turn.reasoning and turn.reply  # the model thought, then answered
        saved = tmp_path / "talk.json"
        session.save(saved)
    reply = json.loads(saved.read_text())["messages"][1]
    assert reply == {"role": "assistant", "content": turn.reply, "reasoning_content": turn.reasoning}
    (loaded,) = read_conversation(saved).turns
    assert (loaded.reply, loaded.reasoning) == (turn.reply, turn.reasoning)
