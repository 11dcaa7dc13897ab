"""OpenAI tools through `localrun serve` with the official `openai` client:
tool_choice none, auto, required and named, streaming, and a tool loop."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import jsonschema
import openai
import pytest

from localrun.runtime.templates import render_chat
from localrun.serve.tools import ToolStream, ToolUse, conversation, function_from, split_reply, tool_use
from localrun.structured.toolcalls.families import HERMES_FAMILY, MISTRAL_FAMILY
from tests.serve.conftest import Server, start
from tests.tinymodel import CHATML, write_tiny_model
from tests.vendored import template, templates

WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}
TIME: dict[str, Any] = {
    "type": "object",
    "properties": {"tz": {"type": "integer", "minimum": -12, "maximum": 14}},
    "required": ["tz"],
}
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
TOOLS: Any = [
    {"type": "function", "function": {"name": name, "description": f"{name} somewhere", "parameters": schema}}
    for name, schema in SCHEMAS.items()
]
MODEL = "tiny-long"
QUESTION: Any = [{"role": "user", "content": "What's the weather in Lisbon?"}]


@pytest.fixture(autouse=True, scope="module")
def vendored() -> None:
    """The templates read once, from the real cache (before a test sends the user's directories to tmp)."""
    templates()


@pytest.fixture(scope="module")
def server(roomy: Server) -> Server:
    return roomy


def chat(server: Server, messages: Any = QUESTION, **kw: Any) -> Any:
    return server.client().chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, **kw)


def check_calls(message: Any, names: frozenset[str] = frozenset(SCHEMAS)) -> None:
    assert message.tool_calls
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_tool_choice_none_never_calls(server: Server) -> None:
    for seed in range(3):
        reply = chat(server, tool_choice="none", max_tokens=30, temperature=1.0, seed=seed)
        assert reply.choices[0].message.tool_calls is None
        assert reply.choices[0].finish_reason in ("stop", "length")


def test_required_always_calls_a_declared_function_with_valid_arguments(server: Server) -> None:
    for seed in range(6):
        reply = chat(server, tool_choice="required", max_tokens=200, temperature=1.0, seed=seed)
        assert reply.choices[0].finish_reason == "tool_calls", reply
        # nothing but calls: a call the length limit cut short is left as text
        content = reply.choices[0].message.content
        assert not content or (reply.usage.completion_tokens == 200 and content.lstrip().startswith("<tool_call>"))
        check_calls(reply.choices[0].message)
        single = chat(
            server, tool_choice="required", parallel_tool_calls=False, max_tokens=200, temperature=1.0, seed=seed
        )
        assert len(single.choices[0].message.tool_calls) == 1


def test_a_named_function_is_the_one_called(server: Server) -> None:
    named: Any = {"type": "function", "function": {"name": "get_time"}}
    for seed in range(3):
        reply = chat(server, tool_choice=named, max_tokens=200, temperature=1.0, seed=seed)
        check_calls(reply.choices[0].message, frozenset({"get_time"}))


def test_auto_leaves_plain_text_alone(server: Server) -> None:
    reply = chat(server, max_tokens=20, temperature=0)
    plain = server.client().chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=20, temperature=0, tool_choice="none"
    )
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].finish_reason == "length"
    assert isinstance(reply.choices[0].message.content, str) and isinstance(plain.choices[0].message.content, str)


@pytest.mark.parametrize("choice", ["required", "auto"])
def test_streamed_deltas_reassemble_to_the_whole_reply(server: Server, choice: str) -> None:
    kw: Any = {"tool_choice": choice, "max_tokens": 120, "temperature": 1.0, "seed": 5}
    whole = chat(server, **kw).choices[0]
    chunks = list(chat(server, stream=True, **kw))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            call = calls.setdefault(delta.index, {"name": "", "arguments": ""})
            call["name"] += delta.function.name or ""
            call["arguments"] += delta.function.arguments or ""
    assert content == (whole.message.content or "")
    expected = [{"name": c.function.name, "arguments": c.function.arguments} for c in whole.message.tool_calls or []]
    assert [calls[i] for i in sorted(calls)] == expected
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason


def test_a_tool_loop_ends_in_an_answer(server: Server) -> None:
    """Two tools declared, the model calls one, the result goes back, and a final answer comes."""
    messages: Any = list(QUESTION)
    first = chat(server, messages=messages, tool_choice="required", parallel_tool_calls=False, max_tokens=200, seed=1)
    call = first.choices[0].message.tool_calls[0]
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18})})
    final = chat(server, messages=messages, max_tokens=16, temperature=0)
    assert final.choices[0].message.tool_calls is None
    assert final.choices[0].message.content
    streamed = list(chat(server, messages=messages, max_tokens=16, temperature=0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == final.choices[0].message.content


def test_unusable_tools_are_a_400_naming_what(server: Server) -> None:
    broken: Any = [{"type": "function", "function": {"name": "broken", "parameters": {"type": "nope"}}}]
    with pytest.raises(openai.BadRequestError, match="broken"):
        server.client().chat.completions.create(model=MODEL, messages=QUESTION, tools=broken)
    unknown: Any = {"type": "function", "function": {"name": "missing"}}
    with pytest.raises(openai.BadRequestError, match="missing"):
        chat(server, tool_choice=unknown)
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        server.client().chat.completions.create(model=MODEL, messages=QUESTION, tool_choice="required")


@pytest.mark.parametrize(
    "text",
    [
        'Let me look.\n<tool_call>\n{"name": "get_time", "arguments": {"tz": 3}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}\n</tool_call>',
        'Sure:\n```json\n{\n  "name": "get_time",\n  "arguments": {\n    "tz": -2\n  }\n}\n```',
        "No call here, only a ``` fence and <tool_ text.",
        '{"name": "get_time", "arguments": {"tz": 0}}',
        '{"nam is not a call',
        'Use:\n```json\n{"name": "multiply", "arguments": {}}\n```\nthen\n'
        '```json\n{"name": "get_time", "arguments": {"tz": 2}}\n```',
    ],
)
def test_a_reply_streamed_in_any_pieces_reassembles(text: str) -> None:
    """Held back only while it may begin a call; each call as it is written: the same content and calls."""
    functions = [function_from(t, i) for i, t in enumerate(TOOLS)]
    use = ToolUse(functions, TOOLS, HERMES_FAMILY, "auto", parallel=True, native=False)
    for size in (1, 3, 1000):
        stream = ToolStream(use)
        content, calls = "", dict[int, list[str]]()
        for k in range(0, len(text), size):
            piece, deltas = stream.feed(text[k : k + size])
            content += piece
            for d in deltas:
                call = calls.setdefault(d.index, ["", ""])
                call[0] += d.name
                call[1] += d.arguments
        rest, last, found = stream.finish()
        for d in last:
            calls.setdefault(d.index, ["", ""])
            calls[d.index][0] += d.name
            calls[d.index][1] += d.arguments
        whole_content, whole_calls = split_reply(text, use)
        assert content + rest == whole_content and found == whole_calls
        assert [tuple(calls[i]) for i in sorted(calls)] == [(c.name, c.raw) for c in whole_calls]


# Qwen2.5's way with tools, shortened: the tools in the system turn, past calls
# as <tool_call>, results as <tool_response>
QWEN_LIKE = (
    "{% if tools %}<|im_start|>system\n# Tools\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n"
    "</tools>\nReturn calls within <tool_call></tool_call> XML tags.<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant"
    "{% for call in message.tool_calls %}\n<tool_call>\n"
    '{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}\n</tool_call>'
    "{% endfor %}<|im_end|>\n"
    "{% elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response>"
    "<|im_end|>\n"
    "{% else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "<|im_start|>assistant\n"
)
HISTORY: Any = [
    {"role": "user", "content": "Weather in Lisbon?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lisbon"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "18 degrees"},
]


def test_a_template_that_takes_tools_gets_them_and_the_calls_as_its_own_fields() -> None:
    use = tool_use(TOOLS, "auto", None, QWEN_LIKE)
    assert use is not None and use.native and use.family is HERMES_FAMILY
    text = render_chat(QWEN_LIKE, conversation(HISTORY, use), bos_token="", eos_token="", tools=use.declared)
    assert '"name": "get_time"' in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lisbon"}}\n</tool_call>' in text
    assert "<tool_response>\n18 degrees\n</tool_response>" in text


def test_a_template_without_tools_gets_them_described_and_the_calls_as_text() -> None:
    use = tool_use(TOOLS, "required", None, CHATML)
    assert use is not None and not use.native
    text = render_chat(CHATML, conversation(HISTORY, use), bos_token="", eos_token="")
    assert text.startswith("<|im_start|>system\n# Tools") and '"name": "get_time"' in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lisbon"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\n18 degrees\n</tool_response>" in text


def test_a_doubled_brace_call_is_a_call() -> None:
    """What the default model writes about one time in ten (its template shows the format that way)."""
    use = tool_use(TOOLS, "auto", None, QWEN_LIKE)
    assert use is not None
    text = '{{"name": "get_weather", "arguments": {"city": "Lisbon", "unit": "celsius"}}}'
    content, calls = split_reply(text, use)
    assert content == "" and [(c.name, c.arguments) for c in calls] == [
        ("get_weather", {"city": "Lisbon", "unit": "celsius"})
    ]


def test_one_call_ends_a_reply_unless_the_request_asks_for_several() -> None:
    """As llama-server: given the choice after a required call, a small model
    calls on (a city after another) until its context is full."""
    for choice in ("required", "auto"):
        for asked, parallel in ((None, False), (False, False), (True, True)):
            use = tool_use(TOOLS, choice, asked, QWEN_LIKE)
            assert use is not None and use.parallel is parallel
    call = {"city": "Lisbon", "unit": "celsius"}
    two = f"<tool_call>\n{json.dumps({'name': 'get_weather', 'arguments': call})}\n</tool_call>\n" * 2
    use = tool_use(TOOLS, "required", None, QWEN_LIKE)
    assert use is not None
    assert [c.arguments for c in split_reply(two, use)[1]] == [call]


def test_a_required_call_cut_short_is_no_content() -> None:
    cut = '<tool_call>\n{"name": "get_weather", "arguments":'
    use = tool_use(TOOLS, "required", None, QWEN_LIKE)
    assert use is not None
    assert split_reply(cut, use) == ("", [])
    stream = ToolStream(use)
    sent = "".join(stream.feed(cut[k : k + 3])[0] for k in range(0, len(cut), 3))
    rest, deltas, calls = stream.finish()
    assert (sent, rest, deltas, calls) == ("", "", [], [])
    auto = tool_use(TOOLS, "auto", None, QWEN_LIKE)
    assert auto is not None and split_reply("plain words", auto) == ("plain words", [])


def test_a_call_left_as_text_is_reported_with_the_reason() -> None:
    heard: list[str] = []
    use = tool_use(TOOLS, "auto", None, QWEN_LIKE)
    assert use is not None
    use = ToolUse(use.functions, use.declared, use.family, use.choice, use.parallel, use.native, heard.append)
    broken = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lisbon", "unit": "kelvin"}}\n</tool_call>'
    assert split_reply(broken, use) == (broken, [])
    assert len(heard) == 1 and "'kelvin' is not one of" in heard[0]
    stream = ToolStream(use)
    sent = "".join(stream.feed(broken[k : k + 5])[0] for k in range(0, len(broken), 5))
    rest, deltas, calls = stream.finish()
    assert (sent + rest, deltas, calls) == (broken, [], []) and len(heard) == 2


# -- a family of its own: Devstral's template, whose calls are [TOOL_CALLS]NAME[ARGS]{...} --


@pytest.fixture(scope="module")
def devstral(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    home = tmp_path_factory.mktemp("home")
    model = write_tiny_model(
        home / "devstral.gguf", n_ctx_train=8192, chat_template=template("unsloth-mistral-Devstral-Small-2507")
    )
    yield from start(home, "-m", str(model), "--ctx", "8192", "--api-key", "k")


def test_a_family_of_its_own_calls_in_its_format_and_they_reach_both_apis(devstral: Server) -> None:
    use = tool_use(TOOLS, "required", None, template("unsloth-mistral-Devstral-Small-2507"))
    assert use is not None and use.family is MISTRAL_FAMILY
    client = devstral.client()
    for seed in range(3):
        kw: Any = {"model": "devstral", "messages": QUESTION, "tools": TOOLS, "max_tokens": 200, "seed": seed}
        kw["parallel_tool_calls"] = False  # a random model would go on calling to the length limit
        reply = client.chat.completions.create(tool_choice="required", temperature=1.0, **kw)
        assert reply.choices[0].finish_reason == "tool_calls"
        check_calls(reply.choices[0].message)
        chunks = list(client.chat.completions.create(tool_choice="required", temperature=1.0, stream=True, **kw))
        streamed = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
        assert [(d.function.name, d.function.arguments) for d in streamed] == [
            (c.function.name, c.function.arguments) for c in reply.choices[0].message.tool_calls or []
        ]
    anthropic_tools: Any = [{"name": n, "input_schema": s} for n, s in SCHEMAS.items()]
    with anthropic.Anthropic(base_url=devstral.url, api_key="k", max_retries=0, timeout=120) as messages:
        answer = messages.messages.create(
            model="devstral",
            max_tokens=200,
            messages=QUESTION,
            tools=anthropic_tools,
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
        ).model_dump()
    uses = [b for b in answer["content"] if b["type"] == "tool_use"]
    assert answer["stop_reason"] == "tool_use" and uses
    for block in uses:
        jsonschema.validate(block["input"], SCHEMAS[block["name"]])


def test_a_required_call_cut_short_leaks_no_text_and_is_a_warning_in_the_log(devstral: Server) -> None:
    """The length limit cuts the call: no call, and its raw text is no content either."""
    client = devstral.client()
    reply = client.chat.completions.create(
        model="devstral", messages=QUESTION, tools=TOOLS, tool_choice="required", max_tokens=30, temperature=1.0, seed=1
    )
    assert reply.choices[0].message.tool_calls is None and reply.choices[0].finish_reason == "length"
    assert not reply.choices[0].message.content
    deadline = time.monotonic() + 10
    while "left as text" not in devstral.log and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "warning: " in devstral.log and "a tool call left as text" in devstral.log


@pytest.mark.parametrize("name", ["Mistral-Small-3.2-24B-Instruct-2506", "mistralai-Mistral-Nemo-Instruct-2407"])
def test_mistral_templates_get_the_call_ids_they_demand(name: str) -> None:
    """Their templates raise on an id that is not nine letters and digits; OpenAI's ids are longer."""
    source = template(name)
    use = tool_use(TOOLS, "auto", None, source)
    assert use is not None and use.native
    history: Any = [*HISTORY[:1], HISTORY[1] | {"tool_calls": [HISTORY[1]["tool_calls"][0] | {"id": "call_8f3a29c1"}]}]
    history.append(HISTORY[2] | {"tool_call_id": "call_8f3a29c1"})
    text = render_chat(source, conversation(history, use), bos_token="<s>", eos_token="</s>", tools=use.declared)
    assert "get_weather" in text and "18 degrees" in text
