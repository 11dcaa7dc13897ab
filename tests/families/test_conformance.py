"""Every vendored chat template against its chat format: an assistant turn
with one and with two tool calls (string, number, nested object and
unicode arguments), with and without reasoning, rendered by the template;
the part the model would have written (what follows the rendered prompt of
the conversation without that turn) read back by the format's own reader
gives the same calls, reasoning and content, whole and streamed in pieces
of 1 to 17 characters through serve's streamed path. What a template
cannot write is said by name, from the registry and the template's
capabilities; no template's calls are read with another family's finder.
Where the family's calls are constrained, its grammar takes the call as
the template writes it, but for the forms named."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from localrun import chatformat
from localrun.chatformat import ChatFormat
from localrun.runtime.engine import Engine
from localrun.runtime.reasoning import Reasoning, reasoning_for
from localrun.runtime.template_caps import template_caps
from localrun.runtime.templates import render_chat
from localrun.serve.tools import ToolStream, ToolUse
from localrun.structured.constraint import Constraint
from localrun.structured.toolcalls.calls import Function
from localrun.structured.toolcalls.split import split
from localrun.structured.tools import tool_grammar
from tests.helpers import engine_config
from tests.vendored import template, templates

WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "options": {
            "type": "object",
            "properties": {"units": {"type": "string"}, "hourly": {"type": "boolean"}},
        },
    },
    "required": ["city"],
}
TIME: dict[str, Any] = {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}
FUNCTIONS = [Function("get_weather", WEATHER), Function("get_time", TIME)]
TOOLS = [
    {"type": "function", "function": {"name": f.name, "description": "", "parameters": f.parameters}} for f in FUNCTIONS
]
Called = tuple[str, dict[str, Any]]
FIRST: Called = ("get_weather", {"city": "Zürich, 東京", "days": 3, "options": {"units": "metric", "hourly": True}})
SECOND: Called = ("get_time", {"tz": "Europe/Oslo"})
THOUGHT = "The user wants the weather; I should call the tool."
CONVERSATION = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Weather in Zürich?"}]
# what ends a turn: the end-of-generation tokens, which never reach a reply's text
TURN_END = re.compile(
    "|".join(
        re.escape(m)
        for m in (
            "<|im_end|>",
            "<|eot_id|>",
            "<|eom_id|>",
            "</s>",
            "<｜end▁of▁sentence｜>",
            "<|end_of_text|>",
            "<|tool_response>",
            "<turn|>",
            "<|call|>",
            "<|END_OF_TURN_TOKEN|>",
            "<end_of_turn>",
            "<|end|>",
            "<seed:eos>",
            "[e~[",
            "<|role_end|>",
            "</assistant>",
            "<end_of_sentence>",
            "<|eom|>",
            "<|eot|>",
            "<sep>",
            "<SPECIAL_12>",
            "<|end_of_msg|>",
            "<｜hy_eos:opensource｜>",
            "<|calls|>",
            "<|START_OF_TURN_TOKEN|>",
        )
    )
)
# where one of them ends a message of the turn, not the turn (its next message follows)
MESSAGE_ENDS = {"gpt-oss": "<|end|>", "muse-glimmer": "<|eom|>"}
# what ends a message and may also open one (GigaChat's separator): an end only at the end
TRAILING = re.compile(r"(<\|message_sep\|>\s*)+$")
NAMES = sorted(name.removesuffix(".jinja") for name in templates())


@pytest.fixture(autouse=True, scope="module")
def vendored() -> None:
    """The templates read once, from the real cache (before a test sends the user's directories to tmp)."""
    templates()


@dataclass(frozen=True)
class Written:
    """What the model of a template writes for an assistant turn: the text
    after the prompt, and how its thinking starts."""

    text: str
    reasoning: Reasoning | None


def _render(source: str, messages: list[dict[str, Any]], *, generation: bool) -> str:
    kw: dict[str, Any] = {"bos_token": "<s>", "eos_token": "</s>", "tools": TOOLS}
    return render_chat(source, messages, add_generation_prompt=generation, **kw)


def _turn(calls: list[tuple[str, dict[str, Any]]], thought: str) -> dict[str, Any]:
    turn: dict[str, Any] = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": f"call{i:05d}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(calls)
        ],
    }
    if thought:
        turn["reasoning_content"] = thought
    return turn


def _unmatched_header(header: str, out: str) -> int:
    """How much of ``out`` is the end of the generation prompt's ``header``
    where the history renders the turn's header alone (a marker or more)."""
    for i in range(len(header)):
        tail = header[i:]
        if tail[:1] in "<[" and out.startswith(tail):
            return len(tail)
    return 0


def written(name: str, calls: list[tuple[str, dict[str, Any]]], thought: str) -> Written:
    """The part of the assistant turn the model writes: what follows the
    generation prompt (from the last user message on, where the two
    renderings part), up to the end of the turn."""
    source = template(name)
    prompt = _render(source, CONVERSATION, generation=True)
    full = _render(source, [*CONVERSATION, _turn(calls, thought)], generation=False)
    question = CONVERSATION[-1]["content"]
    header = prompt[prompt.rindex(question) + len(question) :]
    out = full[full.rindex(question) + len(question) :]
    k = 0
    while k < min(len(header), len(out)) and header[k] == out[k]:
        k += 1
    if k < len(header) and out[:k].count("<") > out[:k].count(">"):  # parted inside a marker: before it
        k = out.rindex("<", 0, k)
    out = out[k:]
    if k < len(header):
        out = out[_unmatched_header(header[k:], out) :]
    reasoning = reasoning_for(source, prompt)
    channels = reasoning is not None and reasoning.format.channels
    ends = MESSAGE_ENDS.get(chatformat.of(source).name)
    end = (re.compile(TURN_END.pattern.replace("|" + re.escape(ends), "")) if ends else TURN_END).search(out)
    out = TRAILING.sub("", out[: end.start()] if end else out)
    if reasoning is not None and not channels and reasoning.starts_open and reasoning.format.end not in out:
        out = reasoning.format.end + out  # the history leaves out a thinking the prompt opened: it was closed
    return Written(out, reasoning)


@dataclass(frozen=True)
class Read:
    calls: list[tuple[str, Any]]
    reasoning: str
    content: str


def read_whole(fmt: ChatFormat, out: Written) -> Read:
    thinking, answer = "", out.text
    if out.reasoning is not None:
        splitter = out.reasoning.splitter()
        pieces = [*splitter.feed(out.text), *splitter.flush()]
        thinking = "".join(t for kind, t in pieces if kind == "reasoning")
        answer = "".join(t for kind, t in pieces if kind == "content")
    found = split(answer, fmt.tools, FUNCTIONS)
    assert not found.problems, found.problems
    return Read([(c.name, c.arguments) for c in found.calls], thinking.strip(), found.content.strip())


def read_streamed(fmt: ChatFormat, out: Written, size: int) -> Read:
    """As serve reads a streamed reply: the thinking split off, the answer held by a `ToolStream`."""
    stream = ToolStream(ToolUse(FUNCTIONS, TOOLS, fmt.tools, "auto", parallel=True, native=True))
    splitter = out.reasoning.splitter() if out.reasoning is not None else None
    thinking, content, calls = "", "", []
    for at in range(0, len(out.text), size):
        piece = out.text[at : at + size]
        pieces = splitter.feed(piece) if splitter is not None else [("content", piece)]
        for kind, text in pieces:
            if kind == "reasoning":
                thinking += text
            else:
                sent, deltas = stream.feed(text)
                content += sent
                calls += deltas
    for kind, text in splitter.flush() if splitter is not None else []:
        if kind == "reasoning":
            thinking += text
        else:
            sent, deltas = stream.feed(text)
            content += sent
            calls += deltas
    rest, deltas, _ = stream.finish()
    content += rest
    calls += deltas
    return Read([(c.name, json.loads(c.arguments)) for c in calls], thinking.strip(), content.strip())


# ------------------------------------------------------------ capability --


def cannot(name: str, calls: int, thought: bool) -> str | None:
    """Why the template of ``name`` cannot write this turn, by name; None: it can."""
    source = template(name)
    fmt = chatformat.of(source)
    caps = template_caps(source)
    if not caps.tool_calls:
        return "no tool calls"
    if calls > 1 and not (caps.parallel_tool_calls and fmt.parallel):
        return "one call a turn"
    if thought and fmt.reasoning is None:
        return "no reasoning"
    if thought and THOUGHT not in _render(source, [*CONVERSATION, _turn([FIRST], THOUGHT)], generation=False):
        return "no reasoning in a turn with calls"
    return None


CASES = [(name, calls, thought) for name in NAMES for calls in (1, 2) for thought in (False, True)]


def _id(case: tuple[str, int, bool]) -> str:
    return f"{case[0]}-{case[1]}call{'-thinking' if case[2] else ''}"


@pytest.mark.parametrize(("name", "ncalls", "thought"), CASES, ids=[_id(c) for c in CASES])
def test_each_template_reads_back_what_it_writes(name: str, ncalls: int, thought: bool) -> None:
    fmt = chatformat.of(template(name))
    why = cannot(name, ncalls, thought)
    if why is not None:
        assert why in ("no tool calls", "one call a turn", "no reasoning", "no reasoning in a turn with calls")
        return
    flat: Called = (FIRST[0], {k: v for k, v in FIRST[1].items() if k != "options"})
    first = FIRST if fmt.nested_arguments else flat  # its template writes an object argument as nothing
    calls = [first, SECOND][:ncalls]
    out = written(name, calls, THOUGHT if thought else "")
    expected = Read(calls, THOUGHT if thought else "", "")
    assert read_whole(fmt, out) == expected, out.text
    for size in range(1, 18):
        assert read_streamed(fmt, out, size) == expected, (size, out.text)


CUT_CASES = [name for name in NAMES if cannot(name, 2, thought=False) is None]
# the readers that forgive a parameter left open at the end of a reply (Qwen3-Coder's
# XML, as llama.cpp reads it): the cut call stands, with the value as far as it came
OPEN_VALUE_FORGIVEN = {"qwen3-coder", "seed-oss"}


@pytest.mark.parametrize("name", CUT_CASES)
def test_a_reply_cut_short_in_its_second_call_keeps_the_first(name: str) -> None:
    """The generation stopped (its token limit) inside the second call's
    arguments: the first call, whole, is a call, whole and streamed; the cut one is none."""
    fmt = chatformat.of(template(name))
    first = FIRST if fmt.nested_arguments else (FIRST[0], {k: v for k, v in FIRST[1].items() if k != "options"})
    out = written(name, [first, SECOND], "")
    cut = Written(out.text[: out.text.index("Europe/") + len("Europe/")], out.reasoning)
    expected = [first, (SECOND[0], {"tz": "Europe/"})] if fmt.tools.name in OPEN_VALUE_FORGIVEN else [first]
    assert read_whole_calls(fmt, cut) == expected, cut.text
    for size in (1, 3, 7, 17):
        assert read_streamed(fmt, cut, size).calls == expected, (size, cut.text)


def read_whole_calls(fmt: ChatFormat, out: Written) -> list[tuple[str, Any]]:
    answer = out.text
    if out.reasoning is not None:
        splitter = out.reasoning.splitter()
        answer = "".join(t for kind, t in [*splitter.feed(out.text), *splitter.flush()] if kind == "content")
    return [(c.name, c.arguments) for c in split(answer, fmt.tools, FUNCTIONS).calls]


def test_no_template_is_read_with_another_familys_finder() -> None:
    borrowed = [name for name in NAMES if not chatformat.of(template(name)).own_tools]
    assert borrowed == []


# -------------------------------------------------------------- grammars --

# what a template writes that its family's grammar does not, by name
UNCONSTRAINED_FORMS = {
    "Mistral-Small-3.2-24B-Instruct-2506": "a call id ([CALL_ID]) the grammar leaves out",
    "mistralai-Mistral-Nemo-Instruct-2407": "a call id in the call object the grammar leaves out",
    "Reka-Edge": "non-ASCII arguments escaped (\\u00fc), which the grammar writes as they are",
}
# what a template writes of an object argument that its family's grammar writes otherwise:
# the grammar is held to the call without it
OBJECT_FORMS = {
    "ByteDance-Seed-OSS": "an object argument as Python writes it ({'units': ..., 'hourly': True}), "
    "which the grammar writes as JSON (its reader takes both)",
}
# templates that write two calls back to back, which their family's grammar writes a new line apart
PARALLEL_FORMS = dict.fromkeys(
    ("GLM-4.7-Flash", "Spark2.5", "poolside-Laguna-S-2.1", "StepFun3.5-Flash"), "two calls back to back"
)
CONSTRAINED = [
    name
    for name in NAMES
    if (grammar := chatformat.of(template(name)).tools.grammar) is not None
    and not grammar.channels  # harmony's grammar covers the whole reply: its own vocabulary's tests
    and cannot(name, 1, thought=False) is None
]


@pytest.fixture(scope="module")
def engine(tiny_model: Path) -> Iterator[Engine]:
    with Engine(engine_config(tiny_model, n_ctx=1024, n_threads=2)) as engine:
        yield engine


def _answer(out: Written) -> str:
    """What the grammar holds of a written turn: its answer, the thinking split off."""
    if out.reasoning is None:
        return out.text
    splitter = out.reasoning.splitter()
    return "".join(text for kind, text in [*splitter.feed(out.text), *splitter.flush()] if kind == "content")


def _taken(engine: Engine, fmt: ChatFormat, answer: str, *, parallel: bool) -> bool:
    """Whether the grammar (``required``) takes ``answer`` whole, to its end."""
    assert fmt.tools.grammar is not None
    spec = tool_grammar(engine, FUNCTIONS, fmt.tools.grammar, "required", parallel=parallel)
    matcher = Constraint(engine, spec).matcher
    # new lines around the calls are the turn's layout; a space before them is the call's
    # own (FireFunction's ` functools`, Muse's ` to=`)
    tokens = engine.tokenize(answer.strip("\n"), add_special=False)
    return matcher.validate_tokens(tokens) == len(tokens) and matcher.consume_tokens(tokens) and matcher.is_accepting()


@pytest.mark.parametrize("name", CONSTRAINED)
def test_a_constrained_familys_grammar_takes_the_call_its_template_writes(engine: Engine, name: str) -> None:
    """And the two calls, where its template writes two; the grammar of one call takes one only."""
    fmt = chatformat.of(template(name))
    whole = fmt.nested_arguments and name not in OBJECT_FORMS
    first: Called = FIRST if whole else (FIRST[0], {k: v for k, v in FIRST[1].items() if k != "options"})
    answer = _answer(written(name, [first], ""))
    expected = name not in UNCONSTRAINED_FORMS
    assert _taken(engine, fmt, answer, parallel=fmt.parallel) == expected, UNCONSTRAINED_FORMS.get(name, answer)
    if cannot(name, 2, thought=False) is None:
        answer = _answer(written(name, [first, SECOND], ""))
        expected = expected and name not in PARALLEL_FORMS
        assert _taken(engine, fmt, answer, parallel=True) == expected, PARALLEL_FORMS.get(name, answer)
        assert not _taken(engine, fmt, answer, parallel=False), answer
