"""Anthropic's Messages API through `localrun serve`, driven with the official
`anthropic` client: text, tools, a tool loop, streaming with the SDK's
stream helpers, count_tokens, x-api-key and errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import jsonschema
import pytest

from tests.serve.conftest import ROOMY_KEY, Server
from tests.serve.test_tools import SCHEMAS

MODEL = "tiny-long"
TOOLS: Any = [{"name": name, "description": f"{name} somewhere", "input_schema": s} for name, s in SCHEMAS.items()]
GREEDY = {"temperature": 0}
QUESTION: Any = [{"role": "user", "content": "What's the weather in Lisbon?"}]


@pytest.fixture(scope="module")
def client(roomy: Server) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=roomy.url, api_key=ROOMY_KEY, max_retries=0, timeout=120) as client:
        yield client


def test_a_text_reply(client: anthropic.Anthropic) -> None:
    reply = client.messages.create(
        model=MODEL, max_tokens=12, system="be brief", messages=QUESTION, extra_body=GREEDY, stop_sequences=["zzz"]
    )
    assert reply.type == "message" and reply.role == "assistant" and reply.id.startswith("msg_")
    assert reply.stop_reason == "max_tokens" and reply.usage.output_tokens == 12
    assert [b.type for b in reply.content] == ["text"]


def test_any_tool_calls_one_with_valid_input(client: anthropic.Anthropic) -> None:
    for seed_temperature in (0.0, 1.0):
        reply = client.messages.create(
            model=MODEL,
            max_tokens=200,
            messages=QUESTION,
            tools=TOOLS,
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
            extra_body={"temperature": seed_temperature},
        )
        assert reply.stop_reason == "tool_use"
        (use,) = [b for b in reply.content if b.type == "tool_use"]
        assert use.id.startswith("toolu_") and use.name in SCHEMAS
        jsonschema.validate(use.input, SCHEMAS[use.name])
    named = client.messages.create(
        model=MODEL, max_tokens=200, messages=QUESTION, tools=TOOLS, tool_choice={"type": "tool", "name": "get_time"}
    )
    assert {b.name for b in named.content if b.type == "tool_use"} == {"get_time"}


def test_a_tool_loop_and_the_stream_helpers(client: anthropic.Anthropic) -> None:
    """A call, its result sent back, a final answer; streamed, the SDK's helpers rebuild the same message."""
    first = client.messages.create(
        model=MODEL, max_tokens=200, messages=QUESTION, tools=TOOLS, tool_choice={"type": "any"}, extra_body=GREEDY
    )
    use = next(b for b in first.content if b.type == "tool_use")
    with client.messages.stream(
        model=MODEL, max_tokens=200, messages=QUESTION, tools=TOOLS, tool_choice={"type": "any"}, extra_body=GREEDY
    ) as stream:
        streamed = stream.get_final_message()
    assert [b.model_dump(exclude={"id"}) for b in streamed.content] == [
        b.model_dump(exclude={"id"}) for b in first.content
    ]
    assert streamed.stop_reason == "tool_use"
    messages: Any = [
        *QUESTION,
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": json.dumps({"temperature": 18})}],
        },
    ]
    final = client.messages.create(model=MODEL, max_tokens=10, messages=messages, tools=TOOLS, extra_body=GREEDY)
    assert final.stop_reason in ("end_turn", "max_tokens")
    with client.messages.stream(
        model=MODEL, max_tokens=10, messages=messages, tools=TOOLS, extra_body=GREEDY
    ) as stream:
        text = "".join(stream.text_stream)
        again = stream.get_final_message()
    assert text == "".join(b.text for b in final.content if b.type == "text")
    assert again.stop_reason == final.stop_reason and again.usage.output_tokens == final.usage.output_tokens


def test_count_tokens(client: anthropic.Anthropic) -> None:
    plain = client.messages.count_tokens(model=MODEL, messages=QUESTION)
    with_tools = client.messages.count_tokens(model=MODEL, messages=QUESTION, tools=TOOLS)
    assert 0 < plain.input_tokens < with_tools.input_tokens


def test_errors_in_anthropics_shape(roomy: Server, client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(
            model=MODEL, max_tokens=10, messages=QUESTION, extra_body={"thinking": {"type": "enabled"}}
        )
    assert caught.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "thinking" in caught.value.message
    with (
        anthropic.Anthropic(base_url=roomy.url, api_key="wrong", max_retries=0) as wrong,
        pytest.raises(anthropic.AuthenticationError),
    ):
        wrong.messages.create(model=MODEL, max_tokens=10, messages=QUESTION)


def test_an_image_block_is_refused_in_words(client: anthropic.Anthropic) -> None:
    image: Any = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    messages: Any = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, image]}]
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model=MODEL, max_tokens=10, messages=messages)
    assert "images are not supported by this model" in caught.value.message


def test_a_required_call_is_one_call_and_auto_may_make_several() -> None:
    """`any` and a named tool end the reply at one call (a small model would
    call on to the length limit); `auto` keeps Anthropic's default of several."""
    from localrun.serve.anthropic import _tools

    tools: Any = [{"name": "get_weather", "input_schema": {"type": "object"}}]
    parallel = {
        str(choice): _tools({"tools": tools, **({"tool_choice": choice} if choice else {})})["parallel_tool_calls"]
        for choice in (None, {"type": "auto"}, {"type": "any"}, {"type": "tool", "name": "get_weather"})
    }
    assert list(parallel.values()) == [True, True, False, False]
    disabled = {"type": "auto", "disable_parallel_tool_use": True}
    assert _tools({"tools": tools, "tool_choice": disabled})["parallel_tool_calls"] is False
