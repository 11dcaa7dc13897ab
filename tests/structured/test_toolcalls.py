"""Tool calls in every family's own format: each vendored template's own
rendering of an assistant turn with calls, taken as the model's output,
parses back into those calls (whole, and streamed in any pieces); recorded
forms models really write parse too; what cannot be read stays content,
with the reason."""

from __future__ import annotations

import re
from typing import Any

import pytest

from localrun import chatformat
from localrun.runtime.templates import render_chat
from localrun.structured.toolcalls.calls import Call, Function
from localrun.structured.toolcalls.families import FAMILIES, Family
from localrun.structured.toolcalls.split import Split, split
from localrun.structured.toolcalls.values import INCOMPLETE, gemma_value, python_call, python_calls, read_object, typed
from tests.vendored import template, templates

WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer", "minimum": 1},
        "hourly": {"type": "boolean"},
        "fields": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["city"],
}
TIME: dict[str, Any] = {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}
FUNCTIONS = [Function("get_weather", WEATHER), Function("get_time", TIME)]
TOOLS = [
    {"type": "function", "function": {"name": f.name, "description": "", "parameters": f.parameters}} for f in FUNCTIONS
]
LISBON: dict[str, Any] = {"city": "Lisbon, PT", "days": 3, "hourly": True, "fields": ["temp", "wind"]}
OSLO: dict[str, Any] = {"tz": "Europe/Oslo"}
FAMILY = {f.name: f for f in FAMILIES}
QUESTION = "Weather in Lisbon?"

# each template, the family it is told to be, and whether it takes more than one call a turn
TEMPLATES = [
    ("Qwen-Qwen2.5-7B-Instruct", "hermes", True),
    ("Qwen-Qwen3-0.6B", "hermes", True),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "hermes", True),
    ("ibm-granite-granite-4.0", "hermes", True),
    ("Qwen3-Coder", "qwen3-coder", True),
    ("Qwen3.5-4B", "qwen3-coder", True),
    ("openai-gpt-oss-120b", "gpt-oss", False),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "deepseek-r1", True),
    ("deepseek-ai-DeepSeek-V3.1", "deepseek-v3.1", True),
    ("Mistral-Small-3.2-24B-Instruct-2506", "mistral", True),
    ("unsloth-mistral-Devstral-Small-2507", "mistral", True),
    ("mistralai-Ministral-3-14B-Reasoning-2512", "mistral", True),
    ("mistralai-Mistral-Nemo-Instruct-2407", "mistral-nemo", True),
    ("meta-llama-Llama-3.1-8B-Instruct", "llama3", False),
    ("meta-llama-Llama-3.2-3B-Instruct", "llama3", False),
    ("meta-llama-Llama-3.3-70B-Instruct", "llama3", False),
    ("google-gemma-4-31B-it", "gemma4", True),
    ("Kimi-K2-Instruct", "kimi-k2", True),
    ("LFM2.5-8B-A1B", "lfm2", True),
    ("MiniMax-M1", "minimax-m1", True),
    ("MiniMax-M2", "minimax-m2", True),
    ("meetkai-functionary-medium-v3.1", "functionary-v3.1", True),
    ("meetkai-functionary-medium-v3.2", "functionary-v3.2", True),
    ("GigaChat3.1-10B-A1.8B", "gigachat-v3.1", False),
    ("inclusionai-ling-3.0-flash", "glm", True),
    ("GLM-4.6", "glm", True),
    ("deepseek-ai-DeepSeek-V3.2", "deepseek-v3.2", True),
    ("deepseek-ai-DeepSeek-V4", "deepseek-v4", True),
    ("NVIDIA-Nemotron-Nano-v2", "nemotron-v2", True),
    ("ByteDance-Seed-OSS", "seed-oss", True),
]
# what ends a turn: an end-of-generation token, which never reaches the reply's text
TURN_END = re.compile(
    r"<\|im_end\|>|<\|eot_id\|>|<\|eom_id\|>|</s>|<｜end▁of▁sentence｜>|<\|end_of_text\|>|<\|tool_response>|<\|call\|>"
    r"|<\|END_OF_TURN_TOKEN\|>|<end_of_sentence>|\[e~\[|<\|role_end\|>|<SPECIAL_12>|<seed:eos>|<\|message_sep\|>"
)
# the thinking a reasoning parser takes off before the answer reaches the tool parser
THINKING = re.compile(r"^\s*(<think>)?[^<]*</think>\s*", re.DOTALL)


@pytest.fixture(autouse=True, scope="module")
def vendored() -> None:
    """The templates read once, from the real cache (before a test sends the user's directories to tmp)."""
    templates()


def model_output(name: str, calls: list[tuple[str, dict[str, Any]]]) -> str:
    """What the model of template ``name`` writes for ``calls``: its template's
    rendering of the assistant turn, from after the generation prompt's
    header to before the end of the turn, the thinking taken off."""
    source = template(name)
    user = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": QUESTION}]
    tool_calls = [
        {"id": f"call{i:05d}", "type": "function", "function": {"name": n, "arguments": args}}
        for i, (n, args) in enumerate(calls)
    ]
    turn = {"role": "assistant", "content": "", "tool_calls": tool_calls}
    kw: dict[str, Any] = {"bos_token": "<s>", "eos_token": "</s>", "tools": TOOLS}
    prompt = render_chat(source, user, add_generation_prompt=True, **kw)
    full = render_chat(source, [*user, turn], add_generation_prompt=False, **kw)
    header = prompt[prompt.rindex(QUESTION) + len(QUESTION) :]
    out = full[full.rindex(QUESTION) + len(QUESTION) :]
    k = 0
    while k < min(len(header), len(out)) and header[k] == out[k]:
        k += 1
    if out[:k].count("<") > out[:k].count(">"):  # stopped inside a marker: the header ends before it
        k = out.rindex("<", 0, k)
    answer = out[k:]
    end = TURN_END.search(answer)
    return THINKING.sub("", answer[: end.start() if end else len(answer)].rstrip(), count=1)


def parsed(found: Split) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, c.arguments) for c in found.calls]


def streamed(text: str, fam: Family, size: int) -> tuple[str, list[Call], list[str]]:
    """``text`` fed in pieces of ``size``: the content sent, the calls sent, the problems at the end."""
    content, calls, sent = "", list[Call](), 0
    for end in [*range(size, len(text), size), len(text)]:
        now = split(text[:end], fam, FUNCTIONS, final=False)
        assert now.content.startswith(content), (end, now.content, content)
        assert now.calls[: len(calls)] == calls
        content, calls = now.content, now.calls
        assert now.held <= end
        sent = end
    whole = split(text[:sent], fam, FUNCTIONS)
    assert whole.content.startswith(content) and whole.calls[: len(calls)] == calls
    return whole.content, whole.calls, whole.problems


@pytest.mark.parametrize(("name", "expected", "parallel"), TEMPLATES, ids=[t[0] for t in TEMPLATES])
def test_each_template_is_told_its_family_and_its_own_calls_parse_back(
    name: str, expected: str, parallel: bool
) -> None:
    fam = chatformat.of(template(name)).tools
    assert fam.name == expected
    calls: list[tuple[str, dict[str, Any]]] = [("get_weather", LISBON), ("get_time", OSLO)][: 2 if parallel else 1]
    text = model_output(name, calls)
    assert text, name
    found = split(text, fam, FUNCTIONS)
    assert parsed(found) == calls, text
    assert found.content.strip() == "" and not found.problems, (text, found)
    for size in (1, 2, 5, 17):
        content, streamed_calls, problems = streamed(text, fam, size)
        assert (content, streamed_calls, problems) == (found.content, found.calls, []), size


# the families whose calls may follow text (Llama's and Mistral Nemo's open the reply;
# Functionary's text is a message of its own, below)
AFTER_TEXT = [t for t in TEMPLATES if t[1] not in ("llama3", "mistral-nemo", "functionary-v3.2")]


def test_functionary_text_to_the_user_is_content_and_its_recipient_lines_are_not() -> None:
    fam = chatformat.of(template("meetkai-functionary-medium-v3.2")).tools
    text = 'all\nLet me look that up.>>>get_time\n{"tz": "Europe/Oslo"}'
    whole = split(text, fam, FUNCTIONS)
    assert (whole.content, parsed(whole), whole.problems) == ("Let me look that up.", [("get_time", OSLO)], [])
    for size in (1, 3, 7):
        content, calls, problems = streamed(text, fam, size)
        assert (content, [(c.name, c.arguments) for c in calls], problems) == (whole.content, parsed(whole), [])
    assert split("all\nJust text, no call.", fam, FUNCTIONS).content == "Just text, no call."


@pytest.mark.parametrize(("name", "expected", "parallel"), AFTER_TEXT, ids=[t[0] for t in AFTER_TEXT])
def test_text_before_a_call_streams_and_stays_content(name: str, expected: str, parallel: bool) -> None:
    fam = chatformat.of(template(name)).tools
    text = "Let me look that up.\n" + model_output(name, [("get_weather", LISBON)])
    whole = split(text, fam, FUNCTIONS)
    assert whole.content.strip() == "Let me look that up." and parsed(whole) == [("get_weather", LISBON)]
    # the text before the call goes out before the call is whole
    first = split(text[: len("Let me look that up.\n") + 2], fam, FUNCTIONS, final=False)
    assert first.content.startswith("Let me look that up.")
    assert split(text[:-3], fam, FUNCTIONS, final=False).calls == []


def test_a_template_without_tools_is_answered_in_hermes_words() -> None:
    assert chatformat.of(None).tools.name == "hermes"
    assert chatformat.of(template("google-gemma-2-2b-it")).tools.name == "hermes"


# -- recorded forms: what models write that their templates do not show --

RECORDED = [
    # Qwen2.5's templates show the format with doubled braces (a Jinja string
    # holding `{{\"name\": <function-name>, ...}}`); Qwen2.5-Coder copies them
    ("hermes", '<tool_call>\n{{"name": "get_time", "arguments": {"tz": "Europe/Oslo"}}}\n</tool_call>', ""),
    ("hermes", '{{"name": "get_time", "arguments": {"tz": "Europe/Oslo"}}}', ""),
    ("hermes", '{"name": "get_time", "arguments": {"tz": "Europe/Oslo"}}}', ""),
    ("hermes", 'Sure.\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Oslo"}}}\n</tool_call>', "Sure."),
    # arguments given as JSON text, as OpenAI's API carries them
    ("hermes", '<tool_call>\n{"name": "get_time", "arguments": "{\\"tz\\": \\"Europe/Oslo\\"}"}\n</tool_call>', ""),
    # the closing tag left out before the end of generation
    ("hermes", '<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Oslo"}}', ""),
    # a fenced block, as Qwen2.5-Coder writes whatever its template says
    ("hermes", 'Here:\n```json\n{\n  "name": "get_time",\n  "arguments": {"tz": "Europe/Oslo"}\n}\n```', "Here:"),
    # Qwen3-Coder leaving out <tool_call> (llama.cpp's parser allows for it)
    ("qwen3-coder", "<function=get_time>\n<parameter=tz>\nEurope/Oslo\n</parameter>\n</function>", ""),
    ("qwen3-coder", '<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Oslo"}}\n</tool_call>', ""),
    # gpt-oss as it writes a call: the recipient after the channel, and <|constrain|>
    (
        "gpt-oss",
        '<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{"tz":"Europe/Oslo"}<|call|>',
        "",
    ),
    # ... after its analysis channel (left for the reasoning parser, untouched)
    (
        "gpt-oss",
        "<|channel|>analysis<|message|>Need the time in Oslo.<|end|><|start|>assistant<|channel|>commentary"
        ' to=functions.get_time <|constrain|>json<|message|>{"tz":"Europe/Oslo"}',
        "<|channel|>analysis<|message|>Need the time in Oslo.<|end|>",
    ),
    # ... where its special tokens render as nothing
    (
        "gpt-oss",
        'analysisNeed the time.assistantcommentary to=functions.get_time json{"tz":"Europe/Oslo"}',
        "analysisNeed the time.assistantcommentary",
    ),
    # DeepSeek R1 leaving out the outer marker, and with the end markers cut by the end of generation
    (
        "deepseek-r1",
        '<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{"tz": "Europe/Oslo"}\n```<｜tool▁call▁end｜>',
        "",
    ),
    # Mistral where [TOOL_CALLS] and [ARGS] render as nothing
    ("mistral", '[{"name": "get_time", "arguments": {"tz": "Europe/Oslo"}}]', ""),
    ("mistral", 'get_time{"tz": "Europe/Oslo"}', ""),
    ("mistral-nemo", '[TOOL_CALLS] [{"name": "get_time", "arguments": {"tz": "Europe/Oslo"}, "id": "a1b2c3d4e"}]', ""),
    # Llama 3.1 with <|python_tag|>, and Llama's own `type` key
    ("llama3", '<|python_tag|>{"type": "function", "name": "get_time", "parameters": {"tz": "Europe/Oslo"}}', ""),
    # Granite 3.3: `<|tool_call|>` then a JSON list, as its template's system prompt asks
    ("granite", '<|tool_call|>[{"name": "get_time", "arguments": {"tz": "Europe/Oslo"}}]', ""),
    ("granite", '[{"name": "get_time", "arguments": {"tz": "Europe/Oslo"}}]', ""),
    # Gemma 3 prompted for tools: a tool_code block of Python-style calls
    ("hermes", 'I will check.\n```tool_code\nget_time(tz="Europe/Oslo")\n```', "I will check."),
    ("gemma4", '```tool_code\nprint(get_time(tz="Europe/Oslo"))\n```', ""),
    # GLM's tags around a Hermes-style JSON call
    ("glm", '<tool_call>{"name": "get_time", "arguments": {"tz": "Europe/Oslo"}}</tool_call>', ""),
    # GLM 4.5's layout: a new line after the name and after each tag
    ("glm", "<tool_call>get_time\n<arg_key>tz</arg_key>\n<arg_value>Europe/Oslo</arg_value>\n</tool_call>", ""),
    # LFM2 after text, its list of Python-style calls
    ("lfm2", "Sure.<|tool_call_start|>[get_time(tz='Europe/Oslo')]<|tool_call_end|>", "Sure."),
    # Kimi K2 without the functions. prefix
    (
        "kimi-k2",
        "<|tool_calls_section_begin|><|tool_call_begin|>get_time:0<|tool_call_argument_begin|>"
        '{"tz": "Europe/Oslo"}<|tool_call_end|><|tool_calls_section_end|>',
        "",
    ),
]


@pytest.mark.parametrize(("name", "text", "content"), RECORDED)
def test_recorded_forms_parse(name: str, text: str, content: str) -> None:
    fam = FAMILY[name]
    found = split(text, fam, FUNCTIONS)
    assert (found.content, parsed(found), found.problems) == (content, [("get_time", OSLO)], [])
    for size in (1, 3, 8):
        assert streamed(text, fam, size) == (found.content, found.calls, [])


NOT_CALLS = [
    ("hermes", "Plain text, no call at all."),
    ("hermes", "a JSON block:\n```json\n[1, 2]\n```"),
    ("hermes", 'Use:\n```json\n{"name": "multiply", "arguments": {}}\n```'),
    ("hermes", '{"other": 1} is JSON, not a call'),
    ("hermes", "No call here, only a ``` fence and <tool_ text."),
    ("qwen3-coder", "#include <functional>\nint main() {}"),
    ("llama3", '{"name": "Lisbon", "population": 545000}'),
    ("mistral", "get_weather is the function I would use."),
    ("gpt-oss", "<|channel|>final<|message|>It is sunny."),
]


@pytest.mark.parametrize(("name", "text"), NOT_CALLS)
def test_what_is_no_call_is_content_without_a_warning(name: str, text: str) -> None:
    found = split(text, FAMILY[name], FUNCTIONS)
    assert (found.content, found.calls, found.problems) == (text, [], [])
    assert streamed(text, FAMILY[name], 2) == (text, [], [])


BROKEN = [
    ("hermes", '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>', "no function is named 'rm_rf'"),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"days": 2}}\n</tool_call>', "'city' is a required"),
    ("hermes", '<tool_call>\n{"name": "get_time", "arguments": {"tz": "Eur', "not JSON"),
    ("hermes", '{"name": "get_time", "arguments": {"tz": ', "cut short"),
    (
        "qwen3-coder",
        "<tool_call>\n<function=get_weather>\n<parameter=days>\n0\n</parameter>\n</function>\n</tool_call>",
        "get_weather",
    ),
    ("gpt-oss", '<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{"tz": "Eu', "cut short"),
    (
        "deepseek-v3.1",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{tz: oslo}<｜tool▁call▁end｜>",
        "not JSON",
    ),
    ("mistral", '[TOOL_CALLS]get_time[ARGS]{"tz": 5}', "is not of type 'string'"),
    ("gemma4", "<|tool_call>call:get_time{tz:Oslo}<tool_call|>", "Gemma"),
]


@pytest.mark.parametrize(("name", "text", "why"), BROKEN)
def test_a_call_that_cannot_be_read_or_checked_stays_content_with_the_reason(name: str, text: str, why: str) -> None:
    found = split(text, FAMILY[name], FUNCTIONS)
    assert found.content == text and found.calls == []
    assert len(found.problems) == 1 and why in found.problems[0], found.problems
    content, calls, problems = streamed(text, FAMILY[name], 4)
    assert (content, calls) == (text, []) and problems == found.problems


def test_a_call_split_across_pieces_is_held_back_until_whole() -> None:
    fam = FAMILY["hermes"]
    text = 'Checking.\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Oslo"}}\n</tool_call>'
    cut = text.index('"tz"')
    now = split(text[:cut], fam, FUNCTIONS, final=False)
    assert (now.content, now.calls, now.held) == ("Checking.", [], text.index("\n<tool_call>"))
    marker = split("Checking. <tool_c", fam, FUNCTIONS, final=False)
    assert marker.content == "Checking."  # what may begin the marker is held back, the rest goes
    assert split(text, fam, FUNCTIONS, final=False).calls == [Call("get_time", OSLO, '{"tz": "Europe/Oslo"}')]


def test_parallel_calls_of_each_kind() -> None:
    two = [("get_time", OSLO), ("get_weather", {"city": "Oslo"})]
    texts = {
        "hermes": "<tool_call>\n"
        + '{"name": "get_time", "arguments": {"tz": "Europe/Oslo"}}\n</tool_call>\n<tool_call>\n'
        + '{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
        "llama3": '{"name": "get_time", "parameters": {"tz": "Europe/Oslo"}}; '
        '{"name": "get_weather", "parameters": {"city": "Oslo"}}',
        "mistral": '[TOOL_CALLS]get_time[ARGS]{"tz": "Europe/Oslo"}[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}',
        "gemma4": '<|tool_call>call:get_time{tz:<|"|>Europe/Oslo<|"|>}<tool_call|>'
        '<|tool_call>call:get_weather{city:<|"|>Oslo<|"|>}<tool_call|>',
    }
    vanished = 'get_time{"tz": "Europe/Oslo"}get_weather {"city": "Oslo"}'  # Mistral's markers rendered as nothing
    for name, text in [*texts.items(), ("mistral", vanished)]:
        found = split(text, FAMILY[name], FUNCTIONS)
        assert parsed(found) == two and found.content.strip() == "", name
        assert streamed(text, FAMILY[name], 3)[1] == found.calls, name


# -- the values inside calls --


def test_json_objects_as_models_write_them() -> None:
    assert read_object('{{"a": {"b": 1}}}', 0) == ({"a": {"b": 1}}, 17)
    assert read_object('{"a": 1}}} tail', 0) == ({"a": 1}, 10)
    assert read_object('{"a": "}{"}', 0) == ({"a": "}{"}, 11)
    assert read_object("{", 0) == INCOMPLETE
    assert read_object('{{"a": 1', 0) == INCOMPLETE


def test_xml_parameters_take_their_schema_types() -> None:
    assert typed("\n3\n", {"type": "integer"}) == 3
    assert typed("\n3\n", {"type": "string"}) == "3"
    assert typed("\ntrue\n", {"type": ["boolean", "null"]}) is True
    assert typed('\n["a", "b"]\n', {"type": "array"}) == ["a", "b"]
    assert typed("\nnot json\n", {"type": "object"}) == "not json"
    assert typed("\nline one\nline two\n", None) == "line one\nline two"
    assert typed("['a', 'b']", {"type": "array"}) == ["a", "b"]  # Python's spelling
    assert typed("{'a': {1, 2}}", {"type": "object"}) == "{'a': {1, 2}}"  # a set JSON cannot carry stays text


def test_gemma_notation_and_python_calls() -> None:
    text = '{city:<|"|>Lisbon, "PT"<|"|>,days:3,ok:true,tags:[<|"|>a<|"|>,<|"|>b<|"|>],at:{x:1.5}}'
    assert gemma_value(text, 0) == (
        {"city": 'Lisbon, "PT"', "days": 3, "ok": True, "tags": ["a", "b"], "at": {"x": 1.5}},
        len(text),
    )
    assert gemma_value('{city:<|"|>Lis', 0) == INCOMPLETE
    assert python_call('get_weather(city="Lisbon", days=3, fields=["a"])') == (
        "get_weather",
        {"city": "Lisbon", "days": 3, "fields": ["a"]},
    )
    assert python_call("get_weather(__import__('os').system('x'))") is None
    assert python_call("get_weather(city=open('f'))") is None
    # LFM2's lists of calls, an object argument in JSON's words
    assert python_calls('[a(x={"on": true, "off": null}), b(y=\'é\')]') == [
        ("a", {"x": {"on": True, "off": None}}),
        ("b", {"y": "é"}),
    ]
    assert python_calls("[a(x=1), print]") is None
    # a typed XML value written as Python writes it
    assert typed("['temp', 'wind']", {"type": "array"}) == ["temp", "wind"]
    assert typed("Lisbon", {"type": "integer"}) == "Lisbon"


def test_the_calls_before_one_cut_short_stand() -> None:
    texts = {
        "mistral": '[TOOL_CALLS]get_time[ARGS]{"tz": "Europe/Oslo"}[TOOL_CALLS]get_weather[ARGS]{"city": "Os',
        "deepseek-v3.1": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>"
        '{"tz": "Europe/Oslo"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"ci',
        "gemma4": '<|tool_call>call:get_time{tz:<|"|>Europe/Oslo<|"|>}<tool_call|><|tool_call>call:get_weather{ci',
        "hermes": '<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Oslo"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"ci',
        # the calls inside one pair of markers, the closing one never written
        "kimi-k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>"
        '{"tz": "Europe/Oslo"}<|tool_call_end|>'
        '<|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{"ci',
        "minimax-m2": '<minimax:tool_call>\n<invoke name="get_time">\n<parameter name="tz">Europe/Oslo</parameter>\n'
        '</invoke>\n<invoke name="get_weather">\n<parameter name="ci',
        "lfm2": "<|tool_call_start|>[get_time(tz='Europe/Oslo'), get_weather(ci",
        "command-r": '<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "get_time", "parameters": '
        '{"tz": "Europe/Oslo"}},\n    {"tool_call_id": "1", "tool_name": "get_weather", "parameters": {"ci',
    }
    for name, text in texts.items():
        found = split(text, FAMILY[name], FUNCTIONS)
        assert parsed(found) == [("get_time", OSLO)], name
        assert found.content and text.endswith(found.content) and len(found.problems) == 1, (name, found)


MARKER = re.compile(r"<\|[\w\"]+\|>|<\|\w+>|<\w+\|>|\[[A-Z_]+\]|<｜[^｜<>]+｜>|</?tool_call>")


@pytest.mark.parametrize(("name", "expected", "parallel"), TEMPLATES, ids=[t[0] for t in TEMPLATES])
def test_each_family_names_the_markers_its_calls_need_as_text(name: str, expected: str, parallel: bool) -> None:
    """The markers in a family's calls (special tokens that a plain rendering drops) are its `preserved`."""
    text = model_output(name, [("get_weather", LISBON)])
    assert set(MARKER.findall(text)) <= set(chatformat.of(template(name)).tools.preserved), text
