"""A reasoning model served: OpenAI's `reasoning_content` on messages and
stream deltas, Anthropic's thinking blocks and thinking deltas, and a budget
of thinking tokens, through the official clients. The tiny model's template
opens ``<think>`` and its weights never close it: a budget does (see
tests/runtime/test_thinking.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from tests.serve.conftest import Server, start
from tests.tinymodel import THINK_TOKENS, THINKING_CHATML, write_tiny_model

BUDGET = {"reasoning_budget_tokens": 5}


@pytest.fixture(scope="module")
def thinking_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    model = tmp_path_factory.mktemp("models") / "thinker.gguf"
    write_tiny_model(model, chat_template=THINKING_CHATML, extra_tokens=THINK_TOKENS, n_ctx_train=1024)
    yield from start(tmp_path_factory.mktemp("home"), "-m", str(model), "--parallel", "2", "--ctx", "1024")


def _chat(server: Server, **extra: Any) -> Any:
    return server.client().chat.completions.create(
        model="thinker", messages=[{"role": "user", "content": "hello"}], max_tokens=20, temperature=0, **extra
    )


def test_openai_message_carries_the_thinking_apart(thinking_server: Server) -> None:
    reply = _chat(thinking_server, extra_body=BUDGET)
    message = reply.choices[0].message
    thinking = message.model_extra["reasoning_content"]
    assert thinking and message.content
    assert "think>" not in thinking + message.content
    assert reply.usage is not None and reply.usage.completion_tokens == 20
    assert reply.usage.completion_tokens_details.reasoning_tokens == 6  # five, and the forced closing marker


def test_openai_stream_deltas_carry_the_thinking_then_the_answer(thinking_server: Server) -> None:
    whole = _chat(thinking_server, extra_body=BUDGET).choices[0].message
    kinds: list[str] = []
    thinking, answer = "", ""
    for chunk in _chat(thinking_server, extra_body=BUDGET, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if piece := (delta.model_extra or {}).get("reasoning_content"):
            thinking += piece
            kinds.append("reasoning")
        if delta.content:
            answer += delta.content
            kinds.append("content")
    assert (thinking, answer) == (whole.model_extra["reasoning_content"], whole.content)
    assert "reasoning" not in kinds[kinds.index("content") :]


def test_openai_without_a_budget_thinks_to_the_limit(thinking_server: Server) -> None:
    message = _chat(thinking_server).choices[0].message
    assert message.model_extra["reasoning_content"] and message.content == ""


def test_reasoning_effort_none_turns_the_thinking_off(thinking_server: Server) -> None:
    message = _chat(thinking_server, reasoning_effort="none").choices[0].message
    assert "reasoning_content" not in (message.model_extra or {}) and message.content


def test_the_schema_applies_after_the_thinking(thinking_server: Server) -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    reply = thinking_server.client().chat.completions.create(
        model="thinker",
        messages=[{"role": "user", "content": "a number"}],
        max_tokens=150,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
        extra_body=BUDGET,
    )
    message = reply.choices[0].message
    assert (message.model_extra or {})["reasoning_content"]
    assert reply.choices[0].finish_reason == "stop", message.content
    assert isinstance(json.loads(message.content or "")["n"], int)


def _anthropic(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=120)


def test_anthropic_thinking_blocks_with_a_budget(thinking_server: Server) -> None:
    with _anthropic(thinking_server) as client:
        message = client.messages.create(
            model="thinker",
            max_tokens=20,
            extra_body={"temperature": 0},
            thinking={"type": "enabled", "budget_tokens": 4},
            messages=[{"role": "user", "content": "hello"}],
        )
        assert [b.type for b in message.content] == ["thinking", "text"]
        thinking, text = message.content
        assert isinstance(thinking, anthropic.types.ThinkingBlock) and thinking.thinking
        assert isinstance(text, anthropic.types.TextBlock) and text.text
        # the thinking given back in the next turn is taken (the template drops it)
        history: list[Any] = [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": [thinking.model_dump(), text.model_dump()]},
            {"role": "user", "content": "more"},
        ]
        again = client.messages.create(model="thinker", max_tokens=8, extra_body={"temperature": 0}, messages=history)
        assert again.content[0].type == "thinking"


def test_anthropic_streams_thinking_deltas(thinking_server: Server) -> None:
    with (
        _anthropic(thinking_server) as client,
        client.messages.stream(
            model="thinker",
            max_tokens=20,
            extra_body={"temperature": 0},
            thinking={"type": "enabled", "budget_tokens": 4},
            messages=[{"role": "user", "content": "hello"}],
        ) as stream,
    ):
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert "thinking" in kinds and "text" in kinds
    assert kinds.index("thinking") < kinds.index("text")
    assert [b.type for b in final.content] == ["thinking", "text"]


def test_anthropic_thinking_disabled_and_bad_values(thinking_server: Server) -> None:
    with _anthropic(thinking_server) as client:
        message = client.messages.create(
            model="thinker",
            max_tokens=8,
            extra_body={"temperature": 0},
            thinking={"type": "disabled"},
            messages=[{"role": "user", "content": "hello"}],
        )
        assert [b.type for b in message.content] == ["text"]
        with pytest.raises(anthropic.BadRequestError, match="budget_tokens"):
            client.messages.create(
                model="thinker",
                max_tokens=8,
                extra_body={"thinking": {"type": "enabled"}},
                messages=[{"role": "user", "content": "hello"}],
            )


def test_a_model_without_thinking_sends_no_reasoning(server: Server, tiny_model: Path) -> None:
    message = server.client().chat.completions.create(
        model=server.client().models.list().data[0].id,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=5,
        temperature=0,
    )
    assert "reasoning_content" not in (message.choices[0].message.model_extra or {})


def test_reasoning_format_none_leaves_the_thinking_in_the_content(thinking_server: Server) -> None:
    split = _chat(thinking_server).choices[0].message
    message = _chat(thinking_server, extra_body={"reasoning_format": "none"}).choices[0].message
    assert "reasoning_content" not in (message.model_extra or {})
    assert (message.content or "").strip() == split.model_extra["reasoning_content"]
