"""Tool calls: each family's format parses, and the grammar makes every call
a declared function with valid arguments, whatever the model samples."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from localrun.chatformat.thinking import HARMONY as HARMONY_THINKING
from localrun.errors import InvalidRequestError
from localrun.runtime.engine import Engine
from localrun.runtime.generate import generate
from localrun.runtime.reasoning import split_reply
from localrun.runtime.sampling import SamplingParams
from localrun.structured.constraint import Constraint
from localrun.structured.toolcalls.families import (
    APERTUS,
    COMMAND_R,
    COMMAND_R_PLUS,
    DSML_V32,
    FAMILIES,
    FIREFUNCTION,
    FUNCTIONARY_V31,
    FUNCTIONARY_V32,
    GEMMA4,
    GIGACHAT_V3,
    GLM,
    GRAMMARS,
    HERMES,
    HUNYUAN,
    KIMI_K2,
    KIMI_K3,
    LFM2,
    LLAMA3,
    MINICPM,
    MINIMAX_M2,
    MINIMAX_M3,
    MINIMAX_SEP,
    MISTRAL_JSON,
    MUSE,
    SEED,
    SOLAR,
    CallFormat,
    Family,
)
from localrun.structured.toolcalls.families import HARMONY as HARMONY_CALLS
from localrun.structured.toolcalls.split import parse_calls
from localrun.structured.toolcalls.vendors import DS_CALL_BEGIN, DS_CALL_END, DS_CALLS_BEGIN, DS_CALLS_END, DS_SEP
from localrun.structured.tools import Call, Function, tool_grammar
from tests.helpers import collect, engine_config
from tests.synthmodels import BY_NAME, write_family_model

WEATHER = Function(
    "get_weather",
    {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
)
TIME = Function(
    "get_time",
    {"type": "object", "properties": {"tz": {"type": "integer", "minimum": -12, "maximum": 14}}, "required": ["tz"]},
)
FUNCTIONS = [WEATHER, TIME]


def reader(fmt: CallFormat) -> Family:
    """The family whose calls ``fmt`` writes."""
    return next(f for f in FAMILIES if f.grammar == fmt)


HERMES_READ = reader(HERMES)


@pytest.fixture(scope="module")
def engine(tiny_model: Path) -> Iterator[Engine]:
    with Engine(engine_config(tiny_model, n_ctx=1024, n_threads=2)) as engine:
        yield engine


@pytest.mark.parametrize(
    ("fmt", "text", "content"),
    [
        (HERMES, 'Sure.\n<tool_call>\n{"name": "get_time", "arguments": {"tz": 1}}\n</tool_call>', "Sure."),
        (HERMES, 'Here:\n```json\n{\n  "name": "get_time",\n  "arguments": {\n    "tz": 1\n  }\n}\n```', "Here:"),
        (LLAMA3, '{"name": "get_time", "parameters": {"tz": 1}}', ""),
        (MISTRAL_JSON, '[{"name": "get_time", "arguments": {"tz": 1}}]', ""),
    ],
)
def test_each_format_parses(fmt: CallFormat, text: str, content: str) -> None:
    found, calls = parse_calls(text, reader(fmt), FUNCTIONS)
    assert (found, [(c.name, c.arguments) for c in calls]) == (content, [("get_time", {"tz": 1})])


def test_what_is_not_a_whole_valid_call_is_content() -> None:
    whole = 'x <tool_call>\n{"name": "get_time", "arguments": {"tz": 1}}\n</tool_call>'
    cut = whole + '\n<tool_call>\n{"name": "get_ti'
    assert parse_calls(cut, HERMES_READ, FUNCTIONS) == (
        'x<tool_call>\n{"name": "get_ti',
        [Call("get_time", {"tz": 1}, '{"tz": 1}')],
    )
    undeclared = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    assert parse_calls(undeclared, HERMES_READ, FUNCTIONS) == (undeclared, [])
    invalid = '<tool_call>\n{"name": "get_time", "arguments": {"tz": 99}}\n</tool_call>'
    assert parse_calls(invalid, HERMES_READ, FUNCTIONS) == (invalid, [])
    plain = "a JSON block:\n```json\n[1, 2]\n```"
    assert parse_calls(plain, HERMES_READ, FUNCTIONS) == (plain, [])


def test_a_schema_that_cannot_be_compiled_is_refused_by_name(engine: Engine) -> None:
    bad = Function("broken", {"type": "object", "properties": {"x": {"type": "no-such-type"}}})
    with pytest.raises(InvalidRequestError, match="broken"):
        tool_grammar(engine, [WEATHER, bad], HERMES, "auto")


def test_once_a_call_begins_free_text_ends(engine: Engine) -> None:
    matcher = Constraint(engine, tool_grammar(engine, FUNCTIONS, HERMES, "auto")).matcher
    leaked = engine.tokenize("Hi <tool_call> not a call", add_special=False)
    assert matcher.validate_tokens(leaked) < len(leaked)
    for plain in ("Plain text, no call at all.", '{"other": 1} is JSON, not a call', '{"nam'):
        matcher = Constraint(engine, tool_grammar(engine, FUNCTIONS, HERMES, "auto")).matcher
        text = engine.tokenize(plain, add_special=False)
        assert matcher.validate_tokens(text) == len(text), plain


@pytest.mark.parametrize(
    "text",
    [
        '```json\n{\n  "name": "multiply",\n  "arguments": {"a": 17}\n}\n```',
        '{"name": "get_timezone", "arguments": {}}',
        '{"name": "get_tim", "x": 1}',
    ],
)
def test_a_fenced_or_bare_object_naming_no_declared_function_is_text(engine: Engine, text: str) -> None:
    """A model reaching for a function nobody declared is not forced into another one."""
    matcher = Constraint(engine, tool_grammar(engine, FUNCTIONS, HERMES, "auto")).matcher
    tokens = engine.tokenize(text, add_special=False)
    assert matcher.validate_tokens(tokens) == len(tokens)
    assert parse_calls(text, HERMES_READ, FUNCTIONS) == (text, [])


def test_a_bare_call_opening_the_reply_is_a_call(engine: Engine) -> None:
    """What small models write after a tool result: `{"name": ...}` with no marker."""
    bare = '{"name": "get_time", "arguments": {"tz": 4}}'
    matcher = Constraint(engine, tool_grammar(engine, FUNCTIONS, HERMES, "auto")).matcher
    tokens = engine.tokenize(bare, add_special=False)
    assert matcher.validate_tokens(tokens) == len(tokens) and matcher.consume_tokens(tokens)
    assert matcher.is_accepting()
    matcher = Constraint(engine, tool_grammar(engine, FUNCTIONS, HERMES, "auto")).matcher
    wrong = engine.tokenize('{"name": "get_time", "arguments": {"tz": 99}}', add_special=False)
    assert matcher.validate_tokens(wrong) < len(wrong)
    content, calls = parse_calls(bare, HERMES_READ, FUNCTIONS)
    assert content == "" and [(c.name, c.arguments) for c in calls] == [("get_time", {"tz": 4})]


@pytest.mark.parametrize("fmt", [*GRAMMARS], ids=lambda f: f.name)
def test_every_seed_at_temperature_one_calls_validly(request: pytest.FixtureRequest, fmt: Any) -> None:
    """A random model sampling hot: every reply is a declared call with valid
    arguments (for harmony, in gpt-oss's vocabulary, after any thinking, which its budget closes)."""
    engine: Engine = request.getfixturevalue("gpt_oss" if fmt.channels else "engine")
    spec = tool_grammar(engine, FUNCTIONS, fmt, "required", parallel=False, budget=8 if fmt.channels else None)
    prompt = engine.tokenize("call a tool:")
    thought = []
    for seed in range(8):
        constraint = Constraint(engine, spec)
        text, stats = collect(
            generate(engine, prompt, SamplingParams(temperature=1.0, seed=seed), max_tokens=600, constraint=constraint)
        )
        assert stats.stop_reason == "eos", (seed, text)
        thinking, answer = split_reply(text, HARMONY_THINKING if fmt.channels else None)
        thought.append(thinking)
        content, calls = parse_calls(answer, reader(fmt), FUNCTIONS)
        assert content == "" and len(calls) == 1, (seed, text)
        declared = {f.name: f.parameters for f in FUNCTIONS}
        jsonschema.validate(calls[0].arguments, declared[calls[0].name])
        assert json.loads(json.dumps(calls[0].arguments)) == calls[0].arguments
    assert fmt.channels or not any(thought)  # only harmony's grammar covers a thinking (its tests take one)


def test_a_doubled_brace_call_is_a_call_and_is_constrained(engine: Engine) -> None:
    """Qwen2.5's templates show the call as `{{"name": ...}}` and its models copy it: a call all the same."""
    doubled = '{{"name": "get_time", "arguments": {"tz": 4}}}'
    matcher = Constraint(engine, tool_grammar(engine, FUNCTIONS, HERMES, "auto")).matcher
    tokens = engine.tokenize(doubled, add_special=False)
    assert matcher.validate_tokens(tokens) == len(tokens) and matcher.consume_tokens(tokens)
    assert matcher.is_accepting()
    matcher = Constraint(engine, tool_grammar(engine, FUNCTIONS, HERMES, "auto")).matcher
    wrong = engine.tokenize('{{"name": "get_time", "arguments": {"tz": 99}}}', add_special=False)
    assert matcher.validate_tokens(wrong) < len(wrong)
    content, calls = parse_calls(doubled, HERMES_READ, FUNCTIONS)
    assert content == "" and [(c.name, c.arguments) for c in calls] == [("get_time", {"tz": 4})]


@pytest.mark.parametrize(
    ("fmt", "call"),
    [
        (GRAMMARS[1], "<tool_call>\n<function=get_time>\n<parameter=tz>\n4\n</parameter>\n</function>\n</tool_call>"),
        (GRAMMARS[4], '[TOOL_CALLS]get_time[ARGS]{"tz": 4}'),
        (
            GRAMMARS[6],
            f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}function{DS_SEP}get_time\n```json\n"
            f'{{"tz": 4}}\n```{DS_CALL_END}{DS_CALLS_END}',
        ),
        (GRAMMARS[7], f'{DS_CALLS_BEGIN}{DS_CALL_BEGIN}get_time{DS_SEP}{{"tz": 4}}{DS_CALL_END}{DS_CALLS_END}'),
        (
            KIMI_K2,
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>"
            '{"tz": 4}<|tool_call_end|><|tool_calls_section_end|>',
        ),
        (FUNCTIONARY_V31, '<function=get_time>{"tz": 4}</function>'),
        (GEMMA4, "<|tool_call>call:get_time{tz:4}<tool_call|>"),
        (GLM, "<tool_call>get_time\n<arg_key>tz</arg_key>\n<arg_value>4</arg_value>\n</tool_call>"),
        (
            MINIMAX_M2,
            '<minimax:tool_call>\n<invoke name="get_time">\n<parameter name="tz">4</parameter>\n</invoke>\n'
            "</minimax:tool_call>",
        ),
        (
            DSML_V32,
            '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_time">\n<｜DSML｜parameter name="tz" string="false">4'
            "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
        ),
        (LFM2, "<|tool_call_start|>[get_time(tz=4)]<|tool_call_end|>"),
        (
            COMMAND_R,
            '<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "get_time", "parameters": {"tz": 4}}\n]'
            "<|END_ACTION|>",
        ),
        (
            COMMAND_R_PLUS,
            'Action:\n```json\n[\n    {\n        "tool_name": "get_time",\n'
            '        "parameters": {"tz": 4}\n    }\n]```',
        ),
        (SEED, "<seed:tool_call>\n<function=get_time>\n<parameter=tz>4</parameter>\n</function>\n</seed:tool_call>"),
        (
            HUNYUAN,
            "<tool_calls:opensource>\n<tool_call:opensource>get_time<tool_sep:opensource>\n"
            "<arg_key:opensource>tz</arg_key:opensource>\n<arg_value:opensource>4</arg_value:opensource>\n"
            "</tool_call:opensource>\n</tool_calls:opensource>",
        ),
        (MINICPM, '<function name="get_time"><param name="tz">4</param></function>'),
        (
            SOLAR,
            '<|tool_calls|><|tool_call:begin|>a1b2<|tool_call:name|>get_time<|tool_call:args|>{"tz": 4}'
            "<|tool_call:end|>",
        ),
        (APERTUS, '<|tools_prefix|>[{"get_time": {"tz": 4}}]<|tools_suffix|>'),
        (FIREFUNCTION, ' functools[{"name": "get_time", "arguments": {"tz": 4}}]'),
        (
            MINIMAX_M3,
            f'{MINIMAX_SEP}<tool_call>\n{MINIMAX_SEP}<invoke name="get_time">{MINIMAX_SEP}<tz>4{MINIMAX_SEP}</tz>'
            f"{MINIMAX_SEP}</invoke>\n{MINIMAX_SEP}</tool_call>",
        ),
    ],
    ids=lambda v: v.name if isinstance(v, CallFormat) else "",
)
def test_text_then_a_call_in_a_named_format_is_constrained_once_its_marker_begins(
    engine: Engine, fmt: CallFormat, call: str
) -> None:
    matcher = Constraint(engine, tool_grammar(engine, FUNCTIONS, fmt, "auto")).matcher
    tokens = engine.tokenize("Let me check.\n" + call, add_special=False)
    assert matcher.validate_tokens(tokens) == len(tokens) and matcher.consume_tokens(tokens)
    assert matcher.is_accepting()
    wrong = call.replace("get_time", "get_tim")
    matcher = Constraint(engine, tool_grammar(engine, FUNCTIONS, fmt, "auto")).matcher
    tokens = engine.tokenize("Let me check.\n" + wrong, add_special=False)
    assert matcher.validate_tokens(tokens) < len(tokens)
    content, calls = parse_calls("Let me check.\n" + call, reader(fmt), FUNCTIONS)
    assert content == "Let me check." and [(c.name, c.arguments) for c in calls] == [("get_time", {"tz": 4})]


K3_CALL = (
    '<|open|>tools<|sep|><|open|>call tool="get_time" index="1"<|sep|><|open|>argument key="tz" type="number"<|sep|>'
    "4<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>"
)
MUSE_CALL = (
    ' to=get_time<|message|><atem:function_calls>\n<atem:invoke name="get_time">\n'
    '<atem:parameter name="tz">4</atem:parameter>\n</atem:invoke>\n</atem:function_calls>'
)
GIGACHAT_CALL = '<|message_sep|>\n\nfunction call<|role_sep|>\n{"name": "get_time", "arguments": {"tz": 4}}'


@pytest.mark.parametrize(
    ("fmt", "replies", "wrong"),
    [
        (
            FUNCTIONARY_V32,
            # text to the user after its recipient line, then a call; a call opening the reply; text only
            ['all\nLet me check.>>>get_time\n{"tz": 4}', 'get_time\n{"tz": 4}', "all\nHello."],
            ['get_tim\n{"tz": 4}', 'all\nLet me check.>>>get_time\n{"tz": 99}', 'Hello.>>>get_time\n{"tz": 4}'],
        ),
        (
            MUSE,
            # a message to the user, or a call: a message to the function, named again in its invoke;
            # either after messages to itself (its thinking)
            [
                " to=user<|message|>Hello.",
                MUSE_CALL,
                " to=self<|message|>The time, then.<|eom|><|start|>assistant" + MUSE_CALL,
                " to=self<|message|>Just answer.<|eom|><|start|>assistant to=user<|message|>Hello.",
            ],
            [
                MUSE_CALL.replace("to=get_time", "to=get_tim"),
                MUSE_CALL.replace('name="get_time"', 'name="get_weather"'),
            ],
        ),
        (
            KIMI_K3,
            # the response, then the calls after it, or none
            [
                "<|open|>response<|sep|>Let me check.<|close|>response<|sep|>" + K3_CALL,
                "<|open|>response<|sep|>Hello.<|close|>response<|sep|><|close|>message<|sep|>",
            ],
            [
                "<|open|>response<|sep|><|close|>response<|sep|>" + K3_CALL.replace(">4<", ">99<"),
                "<|open|>response<|sep|><|close|>response<|sep|>" + K3_CALL.replace('"number"', '"string"'),
                K3_CALL,
            ],
        ),
        (
            GIGACHAT_V3,
            # a message, then the call in a message of its own, or none
            ["Let me check." + GIGACHAT_CALL, "Hello.<|message_sep|>", "Hello."],
            ["Let me check." + GIGACHAT_CALL.replace("get_time", "get_tim")],
        ),
    ],
    ids=lambda v: v.name if isinstance(v, CallFormat) else "",
)
def test_a_reply_of_messages_or_sections_is_free_text_where_it_is_text_and_calls_are_held(
    engine: Engine, fmt: CallFormat, replies: list[str], wrong: list[str]
) -> None:
    """The families whose text has a place of its own (a message to the
    user, a response section): there it is free; a call is held to the
    declared functions; what the grammar takes reads back."""
    for reply in replies:
        matcher = Constraint(engine, tool_grammar(engine, FUNCTIONS, fmt, "auto")).matcher
        tokens = engine.tokenize(reply, add_special=False)
        assert matcher.validate_tokens(tokens) == len(tokens) and matcher.consume_tokens(tokens), reply
        assert matcher.is_accepting(), reply
    for reply in wrong:
        matcher = Constraint(engine, tool_grammar(engine, FUNCTIONS, fmt, "auto")).matcher
        tokens = engine.tokenize(reply, add_special=False)
        assert matcher.validate_tokens(tokens) < len(tokens), reply
    content, calls = parse_calls(replies[0], reader(fmt), FUNCTIONS)
    called = [(c.name, c.arguments) for c in calls]
    assert called == ([] if "Hello." in replies[0] else [("get_time", {"tz": 4})]), replies[0]
    assert content == ("Hello." if "Hello." in replies[0] else "Let me check."), replies[0]


def test_gemma4_arguments_are_held_to_the_schema_in_its_own_notation(engine: Engine) -> None:
    """Keys in the order Gemma's template writes them (sorted), the required ones always, values by type."""
    weather = Function(
        "get_weather",
        {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "options": {"type": "object", "properties": {"units": {"enum": ["metric", "imperial"]}}},
                "fields": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["city"],
        },
    )
    spec = tool_grammar(engine, [weather], GEMMA4, "required")
    good = (
        '<|tool_call>call:get_weather{city:<|"|>Zürich, 東京<|"|>,days:3,fields:[<|"|>temp<|"|>],'
        'options:{units:<|"|>metric<|"|>}}<tool_call|>'
    )
    assert _takes(engine, spec, good)
    assert _takes(engine, spec, '<|tool_call>call:get_weather{city:<|"|>Oslo<|"|>}<tool_call|>')
    assert not _takes(engine, spec, "<|tool_call>call:get_weather{days:3}<tool_call|>")  # city is required
    assert not _takes(engine, spec, good.replace("days:3", 'days:<|"|>3<|"|>'))
    assert not _takes(engine, spec, good.replace("metric", "kelvin"))
    content, calls = parse_calls(good, reader(GEMMA4), [weather])
    assert content == "" and calls[0].arguments["options"] == {"units": "metric"}


# ---------------------------------------------------------------- harmony --

HARMONY_CALL = '<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{"tz": 4}<|call|>'
HARMONY_THOUGHT = "<|channel|>analysis<|message|>The user wants the time.<|end|><|start|>assistant"
# the recipient in the role header, as the chat template renders a past call
HARMONY_HEADER_CALL = ' to=functions.get_time<|channel|>commentary json<|message|>{"tz": 4}<|call|>'


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """gpt-oss's vocabulary: its channel markers are special tokens."""
    path = write_family_model(BY_NAME["gpt-oss"], tmp_path_factory.mktemp("gpt-oss") / "gpt-oss.gguf")
    with Engine(engine_config(path, n_ctx=512, n_threads=2)) as engine:
        yield engine


def _takes(engine: Engine, spec: Any, text: str) -> bool:
    """Whether the grammar takes all of ``text`` (special tokens as themselves) and may end there."""
    matcher = Constraint(engine, spec).matcher
    tokens = engine.tokenize(text, add_special=False, parse_special=True)
    return matcher.validate_tokens(tokens) == len(tokens) and matcher.consume_tokens(tokens) and matcher.is_accepting()


@pytest.mark.parametrize("call", [HARMONY_CALL, HARMONY_HEADER_CALL], ids=["channel", "role-header"])
@pytest.mark.parametrize("thought", ["", HARMONY_THOUGHT])
def test_a_required_harmony_call_is_a_declared_one_after_any_thinking(gpt_oss: Engine, thought: str, call: str) -> None:
    spec = tool_grammar(gpt_oss, FUNCTIONS, HARMONY_CALLS, "required")
    assert spec.whole  # it covers the thinking too: the channel of a call is not the final answer's
    assert _takes(gpt_oss, spec, thought + call)
    assert not _takes(gpt_oss, spec, thought + call.replace("get_time", "get_tim"))
    assert not _takes(gpt_oss, spec, thought + call.replace('"tz": 4', '"tz": 99'))
    assert not _takes(gpt_oss, spec, thought + "<|channel|>final<|message|>It is noon.")
    thinking, answer = split_reply(thought + call, HARMONY_THINKING, starts_open=True)
    assert thinking == ("The user wants the time." if thought else "")
    content, calls = parse_calls(answer, reader(HARMONY_CALLS), FUNCTIONS)
    assert content == "" and [(c.name, c.arguments) for c in calls] == [("get_time", {"tz": 4})]


def test_an_auto_harmony_reply_is_free_until_a_call_begins(gpt_oss: Engine) -> None:
    spec = tool_grammar(gpt_oss, FUNCTIONS, HARMONY_CALLS, "auto")
    assert _takes(gpt_oss, spec, HARMONY_THOUGHT + "<|channel|>final<|message|>It is noon, I think.")
    assert _takes(gpt_oss, spec, "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant" + HARMONY_CALL)
    assert _takes(gpt_oss, spec, HARMONY_THOUGHT + HARMONY_CALL)
    assert not _takes(gpt_oss, spec, HARMONY_THOUGHT + HARMONY_CALL.replace("get_time", "get_tim"))
    assert not _takes(gpt_oss, spec, HARMONY_CALL.replace('{"tz": 4}', '{"zone": 4}'))


def test_a_harmony_thinking_budget_closes_into_the_call(gpt_oss: Engine) -> None:
    """Past its budget the thinking's end and the next message's start are forced, then a call."""
    spec = tool_grammar(gpt_oss, FUNCTIONS, HARMONY_CALLS, "required", budget=3)
    matcher = Constraint(gpt_oss, spec).matcher
    head = gpt_oss.tokenize("<|channel|>analysis<|message|>", add_special=False, parse_special=True)
    thinking = gpt_oss.tokenize(" a b c d e f", add_special=False)[:3]
    assert matcher.consume_tokens([*head, *thinking])
    forced = matcher.compute_ff_tokens()
    assert gpt_oss.detokenize(forced) == "<|end|><|start|>assistant"  # then the call, in either header
    assert matcher.consume_tokens(forced)
    for call in (HARMONY_CALL, HARMONY_HEADER_CALL):
        tokens = gpt_oss.tokenize(call, add_special=False, parse_special=True)
        assert matcher.validate_tokens(tokens) == len(tokens)
