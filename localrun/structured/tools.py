"""Tool calls: how each model family writes them (a table, not special
cases), the llguidance grammar that makes a call impossible to get wrong, and
the parse of the finished text into calls.

A call is always written as ``{"name": NAME, "arguments": ARGS}`` (the key
``arguments`` is ``parameters`` for Llama 3.x) between its family's markers.
The grammar constrains NAME to the declared functions and ARGS to that
function's JSON Schema. With ``required`` (or one named function) the reply is
calls from its first token; with ``auto`` it is free text, and once a call's
marker begins, the rest of the call is constrained. A marker that is a special
token of the model's vocabulary is referred to as that token (free text can
never contain it); otherwise it is matched as text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from localrun.errors import InvalidRequestError
from localrun.structured.spec import OutputSpec, json_problem

if TYPE_CHECKING:
    from localrun.structured.constraint import Tokenizer

Choice = Literal["auto", "required"]


@dataclass(frozen=True)
class Function:
    name: str
    parameters: dict[str, Any]  # a JSON Schema for the arguments object
    description: str = ""


@dataclass(frozen=True)
class CallFormat:
    """How one family writes calls: ``begin`` call (``between`` call)* ``end``,
    each call ``each`` + the JSON object + ``after_each``. ``triggers``: in free
    text (``auto``), each (text, rest) pair opens a call: ``text`` is what the
    model writes, ``rest`` is forced after it up to the function's name.
    ``leading``: calls can only open the reply (their marker renders as nothing)."""

    name: str
    detect: tuple[str, ...]  # text in a chat template that says its model writes this
    begin: str = ""
    each: str = ""
    between: str = "\n"
    after_each: str = ""
    end: str = ""
    key: str = "arguments"
    triggers: tuple[tuple[str, str], ...] = ()
    leading: bool = False

    @property
    def head(self) -> str:
        """What precedes the first call's name, as this family writes it."""
        return self.begin + self.each + '{"name": '


HERMES = CallFormat(
    "hermes",
    ("<tool_call>",),
    each="<tool_call>\n",
    after_each="\n</tool_call>",
    triggers=(("<tool_call>", '\n{"name": '),),
)
FORMATS: tuple[CallFormat, ...] = (
    HERMES,  # Qwen2.5, Hermes, and the fallback for templates that take no tools
    CallFormat("llama3", ("<|python_tag|>",), begin="<|python_tag|>", between="; ", key="parameters", leading=True),
    CallFormat("mistral", ("[TOOL_CALLS]",), begin="[TOOL_CALLS][", between=", ", end="]", leading=True),
)
# what models really write whatever their template says: a fenced JSON block
# (Qwen2.5-Coder does); its triggers end at `"name":` so that an ordinary
# JSON code block is left alone
FENCED = CallFormat(
    "fenced",
    (),
    each="```json\n",
    after_each="\n```",
    triggers=tuple(
        (f'```{lang}\n{{{space}"name":', " ") for lang in ("json", "") for space in ("", "\n  ", "\n    ", " ", "\n")
    ),
)


BARE = '{"name":'  # a call object with no marker, at the start of a reply


def call_format(template: str | None) -> CallFormat:
    """The family a chat template's model writes calls in (Hermes when none is recognised)."""
    for fmt in FORMATS:
        if template and any(mark in template for mark in fmt.detect):
            return fmt
    return HERMES


def takes_tools(template: str | None) -> bool:
    return bool(template) and "tools" in (template or "")


def tools_prompt(functions: list[Function]) -> str:
    """For a template that takes no tools: the system prompt's description of them, in Hermes' words."""
    lines = "\n".join(json.dumps({"type": "function", "function": _declared(f)}, ensure_ascii=False) for f in functions)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
        "\n</tool_call>"
    )


def _declared(f: Function) -> dict[str, Any]:
    return {"name": f.name, "description": f.description, "parameters": f.parameters}


# ---------------------------------------------------------------- grammar --

_MARKER = re.compile(r"(</?\|?[A-Za-z_][\w|.-]*\|?>|\[[A-Z_]+\])")


def _specials(engine: Tokenizer) -> set[str]:
    """The markers this vocabulary holds as one special token each."""
    from localrun.structured.constraint import tokenizer_for

    tok = tokenizer_for(engine)
    found = set()
    for fmt in (*FORMATS, FENCED):
        for text in (fmt.begin, fmt.each, fmt.after_each, fmt.end, *(t for t, _ in fmt.triggers)):
            for mark in _MARKER.findall(text):
                ids = engine.tokenize(mark, add_special=False, parse_special=True)
                if len(ids) == 1 and tok.is_special_token(ids[0]):
                    found.add(mark)
    return found


def _lark_text(text: str, specials: set[str]) -> str:
    """``text`` as a sequence of lark items: literals, and special tokens by name."""
    items = []
    for part in _MARKER.split(text):
        if not part:
            continue
        items.append(part if part in specials else json.dumps(part))
    return " ".join(items) or '""'


# JSON inside a call: the layout models write (a space, or a new line and an
# indent), bounded so that a sampled reply cannot wander off into whitespace
ARGS_LAYOUT = {"whitespace_flexible": True, "whitespace_pattern": r"[ ]?|\n {0,16}"}
WS = "/( |\\n {0,16})?/"


def _grammar_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema the grammar follows: an object's undeclared keys left out
    (as OpenAI's strict mode does; a model otherwise invents parameters), the
    call's layout added."""
    if "properties" in schema and "additionalProperties" not in schema:
        schema = schema | {"additionalProperties": False}
    return schema | {"x-guidance": ARGS_LAYOUT | dict(schema.get("x-guidance") or {})}


def _compile_args(f: Function) -> str:
    """The function's schema for an inline %json, checked: one that cannot be used is a 400 naming it."""
    import llguidance

    from localrun.errors import UsageError
    from localrun.structured.spec import _check_schema

    schema = _grammar_schema(f.parameters)
    try:
        _check_schema(f.parameters, f"the parameters of function {f.name!r}")
        llguidance.LLMatcher.grammar_from_json_schema(schema)
    except (UsageError, ValueError) as exc:
        message = exc.message if isinstance(exc, UsageError) else f"function {f.name!r}: cannot be used: {exc}"
        raise InvalidRequestError(message, "tools") from None
    return json.dumps(schema, ensure_ascii=False)


def _call_rules(fmt: CallFormat, functions: list[Function], specials: set[str], tag: str) -> list[str]:
    """Rules for one call of ``fmt`` from after `"name": ` on (rule ``{tag}_rest``)."""
    choices = []
    rules = []
    for i, f in enumerate(functions):
        choices.append(
            f"{json.dumps(json.dumps(f.name) + ',')} {WS} {json.dumps(json.dumps(fmt.key) + ': ')} {tag}_a{i}"
        )
        rules.append(f"{tag}_a{i}: %json {_compile_args(f)}")
    rules.append(f'{tag}_rest: ({" | ".join(choices)}) {WS} "}}" {_lark_text(fmt.after_each, specials)}')
    opening = _lark_text(fmt.each + '{"name": ', specials)
    rules.append(f"{tag}_call: {opening} {tag}_rest")
    return rules


def tool_grammar(
    engine: Tokenizer,
    functions: list[Function],
    fmt: CallFormat,
    choice: Choice,
    *,
    parallel: bool = True,
) -> OutputSpec:
    """The constraint for a reply: calls only (``required``), or free text
    whose calls are constrained once their marker begins (``auto``)."""
    import llguidance

    from localrun.structured.spec import _compiled

    specials = _specials(engine)
    rules = ["%llguidance {}", "TEXT: /(.|\\n)*/"]
    rules += _call_rules(fmt, functions, specials, "c")
    more = f"({_lark_text(fmt.between, specials)} c_call)*" if parallel else ""
    calls = f"{_lark_text(fmt.begin, specials)} c_call {more} {_lark_text(fmt.end, specials)}"
    if choice == "required":
        rules.insert(1, f"start: {calls}")
    else:
        # plain text may not start the way a call does: with the family's
        # leading marker, or with a bare call object (what small models write)
        text = "([^{\\[<](.|\\n)*)?" if fmt.leading else _not_starting(BARE)
        rules[1] = f"TEXT: /{text}/"
        alternatives = [calls] if fmt.leading else []
        # a fenced block or bare object naming an undeclared function is text
        rules.append(f'OTHER: /"{_not_named([f.name for f in functions])}"(.|\\n)*/')
        if not fmt.leading:
            rules += _call_rules(CallFormat("bare", (), key=fmt.key), functions, specials, "b")
            bare_more = ' ("\\n" b_call)*' if parallel else ""
            alternatives.append(f"{json.dumps(BARE + ' ')} (b_rest{bare_more} | OTHER)")
        for k, (trigger, rest) in enumerate(fmt.triggers):
            rules.append(_trigger_rule(f"t{k}", trigger, specials, text))
            alternatives.append(f"t{k} {_lark_text(rest, specials)} c_rest {more}")
        rules += _call_rules(FENCED, functions, specials, "f")
        for k, (trigger, rest) in enumerate(FENCED.triggers):
            rules.append(_trigger_rule(f"ft{k}", trigger, specials, text))
            alternatives.append(f"ft{k} {_lark_text(rest, specials)} (f_rest | OTHER)")
        rules.insert(1, f"start: TEXT | {' | '.join(alternatives)}")
    grammar = llguidance.LLMatcher.grammar_from_lark("\n".join(rules))
    return OutputSpec("grammar", _compiled(grammar, "tools"), None, "tools")


def _regex(text: str) -> str:
    """``text`` matched literally, inside a lark /regex/."""
    return re.escape(text).replace("\\\n", "\\n").replace("/", "\\/")


def _not_starting(prefix: str) -> str:
    """A regex for any text that does not start with ``prefix``."""
    parts = [_regex(prefix[:i]) for i in range(len(prefix))]
    parts += [f"{_regex(prefix[:i])}[^{_regex(c)}](.|\\n)*" for i, c in enumerate(prefix)]
    return "(" + "|".join(parts) + ")"


def _not_named(names: list[str]) -> str:
    """A regex for a JSON string's content that is none of ``names``."""
    trie: dict[str, Any] = {}
    for name in names:
        node = trie
        for c in name:
            node = node.setdefault(c, {})
        node[""] = {}

    def below(node: dict[str, Any]) -> str:
        chars = "".join(_regex(c) for c in node if c)
        options = [f'[^"\\\\{chars}]([^"\\\\]|\\\\.)*', *(_regex(c) + below(child) for c, child in node.items() if c)]
        if "" not in node:
            options.append("")
        return "(" + "|".join(options) + ")"

    return below(trie)


def _trigger_rule(name: str, trigger: str, specials: set[str], text: str) -> str:
    if trigger in specials:
        return f"{name}: TEXT {trigger}"
    return f"{name}[lazy]: /{text}{_regex(trigger)}/"


# ------------------------------------------------------------------ parse --


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict[str, Any]
    raw: str = ""  # the arguments as the model wrote them


_NAME = re.compile(r' ?"((?:[^"\\]|\\.)*)(")?')


def find_start(text: str, fmt: CallFormat, names: frozenset[str]) -> tuple[int, bool]:
    """Where the first call begins in ``text`` (-1: nowhere), and whether it
    is sure to be one. A fenced block or a bare object is a call only when it
    names a declared function (its name may not be whole yet: not sure); one
    that names another is text. In a stream, text from here is held back."""
    starts = [(text.find(t), True) for t, _ in fmt.triggers]
    for trigger, _ in FENCED.triggers:
        at = text.find(trigger)
        while at >= 0:
            sure = _named(text, at + len(trigger), names)
            if sure is not False:
                starts.append((at, bool(sure)))
                break
            at = text.find(trigger, at + 1)
    if fmt.leading and _opens_leading(text, fmt):
        starts.append((0, True))
    elif not fmt.leading and text.startswith(BARE) and (sure := _named(text, len(BARE), names)) is not False:
        starts.append((0, bool(sure)))
    return min(((i, sure) for i, sure in starts if i >= 0), default=(-1, False))


def _named(text: str, at: int, names: frozenset[str]) -> bool | None:
    """Whether the name written from ``at`` is declared (None: not whole yet)."""
    match = _NAME.match(text, at)
    if match is None or match.group(2) is None:
        return None if len(text) - at < 2 or match is not None else False
    return match.group(1) in names


def _opens_leading(text: str, fmt: CallFormat) -> bool:
    stripped = text.lstrip()
    return any(stripped.startswith(v) for v in (fmt.begin + fmt.each, "[", "{")) and stripped[:1] in "{[<"


def could_start(tail: str, fmt: CallFormat, *, first: bool = False) -> int:
    """The earliest index in ``tail`` from which a trigger may still be being
    written (len: none); ``first``: ``tail`` is the reply's beginning, where a bare call may be."""
    if first and not fmt.leading and BARE.startswith(tail[: len(BARE)]):
        return 0
    triggers = [t for t, _ in (*fmt.triggers, *FENCED.triggers)]
    for i in range(len(tail)):
        piece = tail[i:]
        if any(t.startswith(piece) for t in triggers):
            return i
    return len(tail)


# a call's object up to its arguments, on one line or several (the key is
# `parameters` for Llama 3.x); it matches once the arguments' `{` has come
_HEAD = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)')


@dataclass(frozen=True)
class Piece:
    """A call found in text: its name, and where its arguments' text begins
    and ends (-1: not yet, the text stops inside them)."""

    name: str
    start: int
    end: int


def scan(text: str, pos: int) -> Iterator[Piece]:
    """The calls in ``text`` from ``pos`` on, the last one possibly unfinished."""
    decoder = json.JSONDecoder()
    while (match := _HEAD.search(text, pos)) is not None:
        try:
            name = json.loads(f'"{match.group(1)}"')
            _, end = decoder.raw_decode(text, match.end())
        except json.JSONDecodeError:
            yield Piece(match.group(1), match.end(), -1)
            return
        yield Piece(name, match.end(), end)
        pos = end


def parse_calls(text: str, fmt: CallFormat, functions: list[Function]) -> tuple[str, list[Call]]:
    """(the text before the calls, the complete calls): each call's name is
    declared and its arguments validate (a call cut short is left out)."""
    declared = {f.name: f for f in functions}
    start, _ = find_start(text, fmt, frozenset(declared))
    if start < 0:
        return text, []
    calls: list[Call] = []
    for piece in scan(text, start):
        if piece.end < 0:
            break
        raw = text[piece.start : piece.end]
        function = declared.get(piece.name)
        if function is not None and json_problem(function.parameters, raw) is None:
            calls.append(Call(function.name, json.loads(raw), raw))
    return text[:start], calls
