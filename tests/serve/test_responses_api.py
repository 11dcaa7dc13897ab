"""OpenAI's Responses API through `localrun serve` with the official `openai`
client: a tool loop (a `function_call` item whose arguments follow the schema,
then an answer once its output goes back) with `previous_response_id` and with
the whole input sent again, streamed events that reassemble to the response,
`text.format`, reasoning items, the store, and what is refused by name."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest

from localrun.errors import InvalidRequestError
from localrun.serve.responses_api import Kept
from localrun.serve.responses_request import messages
from tests.serve.conftest import Server, start
from tests.serve.test_tools import SCHEMAS
from tests.tinymodel import THINK_TOKENS, THINKING_CHATML, write_tiny_model

MODEL = "tiny-long"
TOOLS: Any = [
    {"type": "function", "name": name, "description": f"{name} somewhere", "parameters": schema}
    for name, schema in SCHEMAS.items()
]
QUESTION = "What's the weather in Lisbon?"
NAMED: Any = {"type": "function", "name": "get_weather"}


@pytest.fixture(scope="module")
def server(roomy: Server) -> Server:
    return roomy


def create(server: Server, **kw: Any) -> Any:
    return server.client().responses.create(model=MODEL, **kw)


def check_call(item: Any) -> dict[str, Any]:
    """A function_call item naming a declared function, with arguments that parse and follow its schema."""
    assert item.type == "function_call" and item.call_id.startswith("call_") and item.status == "completed"
    arguments: dict[str, Any] = json.loads(item.arguments)
    jsonschema.validate(arguments, SCHEMAS[item.name])
    return arguments


def called(server: Server, choice: Any = "required", seed: int = 1, **kw: Any) -> Any:
    reply = create(
        server,
        input=QUESTION,
        tools=TOOLS,
        tool_choice=choice,
        parallel_tool_calls=False,
        max_output_tokens=200,
        temperature=1.0,
        extra_body={"seed": seed},
        **kw,
    )
    calls = [item for item in reply.output if item.type == "function_call"]
    assert len(calls) == 1, reply
    check_call(calls[0])
    return reply


def test_required_and_named_choices_give_a_valid_function_call(server: Server) -> None:
    for seed in range(3):
        called(server, "required", seed)
        reply = called(server, NAMED, seed)
        assert [i.name for i in reply.output if i.type == "function_call"] == ["get_weather"]
        assert reply.usage.input_tokens > 0 and reply.usage.output_tokens > 0


def test_a_tool_loop_with_previous_response_id_ends_in_an_answer(server: Server) -> None:
    first = called(server, NAMED)
    call = next(i for i in first.output if i.type == "function_call")
    output = {"type": "function_call_output", "call_id": call.call_id, "output": json.dumps({"temperature": 18})}
    final = create(
        server, previous_response_id=first.id, input=[output], tools=TOOLS, tool_choice="none", max_output_tokens=12
    )
    assert final.previous_response_id == first.id
    assert [i.type for i in final.output] == ["message"] and final.output_text
    # the earlier turn was in the prompt: the same conversation sent whole costs the same tokens
    again = create(
        server,
        input=[{"role": "user", "content": QUESTION}, *[i.model_dump() for i in first.output], output],
        tools=TOOLS,
        tool_choice="none",
        max_output_tokens=12,
    )
    assert [i.type for i in again.output] == ["message"] and again.output_text
    assert again.usage.input_tokens == final.usage.input_tokens


def test_the_stream_reassembles_to_the_response(server: Server) -> None:
    kw: Any = {
        "input": QUESTION,
        "tools": TOOLS,
        "tool_choice": "required",
        "max_output_tokens": 150,
        "temperature": 1.0,
        "extra_body": {"seed": 5},
    }
    whole = create(server, **kw)
    names: list[str] = []
    numbers: list[int] = []
    arguments = ""
    with server.client().responses.stream(model=MODEL, **kw) as stream:
        for event in stream:
            names.append(event.type)
            numbers.append(event.sequence_number)
            if event.type == "response.function_call_arguments.delta":
                arguments += event.delta
        streamed: Any = stream.get_final_response()
    assert names[:2] == ["response.created", "response.in_progress"] and names[-1] == "response.completed"
    assert numbers == list(range(len(names)))
    assert "response.output_item.added" in names and "response.function_call_arguments.done" in names

    def shape(response: Any) -> list[tuple[str, ...]]:
        return [
            (i.type, i.name, i.arguments) if i.type == "function_call" else (i.type, response.output_text)
            for i in response.output
        ]

    assert shape(streamed) == shape(whole)
    calls = [i for i in streamed.output if i.type == "function_call"]
    assert calls and arguments == "".join(c.arguments for c in calls)
    check_call(calls[0])


def test_a_streamed_tool_loop_with_previous_response_id(server: Server) -> None:
    kw: Any = {"tools": TOOLS, "max_output_tokens": 150, "temperature": 1.0, "extra_body": {"seed": 2}}
    with server.client().responses.stream(model=MODEL, input=QUESTION, tool_choice=NAMED, **kw) as stream:
        first: Any = stream.get_final_response()
    call = next(i for i in first.output if i.type == "function_call")
    assert check_call(call) and call.name == "get_weather"
    output: Any = {"type": "function_call_output", "call_id": call.call_id, "output": "18 degrees"}
    with server.client().responses.stream(
        model=MODEL, previous_response_id=first.id, input=[output], tool_choice="none", **kw
    ) as stream:
        final: Any = stream.get_final_response()
    assert [i.type for i in final.output] == ["message"] and final.output_text
    whole_input = [{"role": "user", "content": QUESTION}, *[i.model_dump() for i in first.output], output]
    again = create(server, input=whole_input, tools=TOOLS, tool_choice="none", max_output_tokens=4)
    assert again.usage.input_tokens == final.usage.input_tokens  # the streamed turn was kept whole


def test_plain_text_streams_as_it_comes_back_whole(server: Server) -> None:
    kw: Any = {"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}], "max_output_tokens": 16}
    whole = create(server, temperature=0, instructions="Be brief.", **kw)
    deltas = ""
    with server.client().responses.stream(model=MODEL, temperature=0, instructions="Be brief.", **kw) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas += event.delta
        streamed: Any = stream.get_final_response()
    assert whole.output_text and deltas == whole.output_text == streamed.output_text
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert streamed.usage.output_tokens == whole.usage.output_tokens == 16


def test_a_stored_response_is_found_and_an_unstored_one_is_not(server: Server) -> None:
    kept = create(server, input="hi", max_output_tokens=4)
    assert server.client().responses.retrieve(kept.id).output_text == kept.output_text
    server.client().responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        server.client().responses.retrieve(kept.id)
    gone = create(server, input="hi", max_output_tokens=4, store=False)
    assert gone.store is False
    with pytest.raises(openai.NotFoundError):
        server.client().responses.retrieve(gone.id)
    with pytest.raises(openai.BadRequestError, match="previous_response_id") as caught:
        create(server, input="more", previous_response_id=gone.id, max_output_tokens=4)
    assert caught.value.body["param"] == "previous_response_id"  # type: ignore[index]


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"background": True}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"truncation": "auto"}, "truncation"),
        ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "web_search_call"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "item_reference"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "images"),
        ({"tools": [{"type": "web_search"}]}, "web_search"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_it(server: Server, extra: dict[str, Any], named: str) -> None:
    body: dict[str, Any] = {"input": "hi", "max_output_tokens": 4} | extra
    with pytest.raises(openai.BadRequestError) as caught:
        create(server, extra_body=body)
    assert named in caught.value.body["message"]  # type: ignore[index]


def test_what_the_clients_send_beside_changes_nothing(server: Server) -> None:
    reply = create(
        server,
        input="hi",
        max_output_tokens=4,
        include=["reasoning.encrypted_content"],
        metadata={"run": "1"},
        prompt_cache_key="k",
        user="someone",
        service_tier="auto",
        truncation="disabled",
        reasoning={"effort": "low", "summary": "auto"},
        text={"verbosity": "medium"},
    )
    assert reply.status == "incomplete" and reply.metadata == {"run": "1"}


def test_a_request_shaped_as_codex_sends_it_streams_a_call(server: Server) -> None:
    """Codex's body: developer and user messages, strict function tools, its
    fields beside them, `store: false` and the whole history each turn."""
    shell: Any = {
        "type": "object",
        "properties": {"command": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2}},
        "required": ["command"],
        "additionalProperties": False,
    }
    tools: Any = [{"type": "function", "name": "shell", "description": "run", "strict": False, "parameters": shell}]
    history: Any = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox: none"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]},
    ]
    stream = server.client().responses.create(
        model=MODEL,
        instructions="You are a coding agent.",
        input=history,
        tools=tools,
        tool_choice="required",
        parallel_tool_calls=False,
        reasoning={"effort": "medium", "summary": "auto"},
        store=False,
        stream=True,
        include=["reasoning.encrypted_content"],
        prompt_cache_key="thread-1",
        text={"verbosity": "medium"},
        max_output_tokens=200,
        extra_body={"client_metadata": {"x": "y"}, "seed": 4},
    )
    done = [e.item for e in stream if e.type == "response.output_item.done"]
    calls = [item for item in done if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "shell"
    jsonschema.validate(json.loads(calls[0].arguments), shell)


PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer", "maximum": 99}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_a_json_schema_format_gives_output_that_follows_it(server: Server) -> None:
    fmt: Any = {"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}}
    reply = create(server, input="a person", text=fmt, max_output_tokens=80, temperature=1.0, extra_body={"seed": 3})
    assert reply.status == "completed", reply
    jsonschema.validate(json.loads(reply.output_text), PERSON)
    assert reply.text.format.type == "json_schema"


def test_a_json_object_format_gives_an_object(server: Server) -> None:
    reply = create(
        server, input="json", text={"format": {"type": "json_object"}}, max_output_tokens=200, extra_body={"seed": 3}
    )
    assert reply.status == "completed", reply
    assert isinstance(json.loads(reply.output_text), dict)


# ------------------------------------------------------------ reasoning --


@pytest.fixture(scope="module")
def thinker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    model = tmp_path_factory.mktemp("models") / "thinker.gguf"
    write_tiny_model(model, chat_template=THINKING_CHATML, extra_tokens=THINK_TOKENS, n_ctx_train=1024)
    yield from start(tmp_path_factory.mktemp("home"), "-m", str(model), "--ctx", "1024")


def test_a_thinking_model_gives_a_reasoning_item_whole_and_streamed(thinker: Server) -> None:
    kw: Any = {"input": "hello", "max_output_tokens": 20, "temperature": 0}
    kw["extra_body"] = {"reasoning_budget_tokens": 5}
    whole: Any = thinker.client().responses.create(model="thinker", **kw)
    assert [i.type for i in whole.output] == ["reasoning", "message"]
    thought = whole.output[0].content[0].text
    assert thought and "think>" not in thought + whole.output_text
    assert whole.usage.output_tokens_details.reasoning_tokens == 6  # five, and the forced closing marker
    reasoning = ""
    names: list[str] = []
    with thinker.client().responses.stream(model="thinker", **kw) as stream:
        for event in stream:
            names.append(event.type)
            if event.type == "response.reasoning_text.delta":
                reasoning += event.delta
        streamed: Any = stream.get_final_response()
    assert reasoning == thought == streamed.output[0].content[0].text
    assert streamed.output_text == whole.output_text
    assert names.index("response.reasoning_text.done") < names.index("response.output_text.delta")
    plain: Any = thinker.client().responses.create(model="thinker", input="hello", reasoning={"effort": "none"})
    assert [i.type for i in plain.output] == ["message"]
    # the reasoning item goes back as input with the rest of the turn, and is read
    turn = [{"role": "user", "content": "hello"}, *[i.model_dump(exclude_none=True) for i in whole.output]]
    again: Any = thinker.client().responses.create(
        model="thinker", input=[*turn, {"role": "user", "content": "more"}], max_output_tokens=4
    )
    assert again.usage.input_tokens > whole.usage.input_tokens


# ---------------------------------------------------------- the pieces --


def test_the_store_keeps_only_the_last_responses() -> None:
    kept = Kept(size=2)
    for n in range(3):
        kept.put({"id": f"resp_{n}"}, [{"type": "message", "role": "user", "content": str(n)}])
    assert kept.body("resp_2") == {"id": "resp_2"} and kept.items("resp_1")[0]["content"] == "1"
    with pytest.raises(InvalidRequestError, match="the last 2"):
        kept.items("resp_0")


def test_items_become_the_chat_turns_they_stand_for() -> None:
    items: Any = [
        {"role": "developer", "content": "be terse"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "two cities"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
        {"type": "function_call", "call_id": "a", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call", "call_id": "b", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "a", "output": "sunny"},
        {"type": "function_call_output", "call_id": "b", "output": [{"type": "input_text", "text": "noon"}]},
    ]
    turns = messages(items)
    assert [t["role"] for t in turns] == ["developer", "user", "assistant", "tool", "tool"]
    assert turns[2]["reasoning_content"] == "hm" and [c["id"] for c in turns[2]["tool_calls"]] == ["a", "b"]
    assert (turns[3]["content"], turns[4]["content"]) == ("sunny", "noon")
