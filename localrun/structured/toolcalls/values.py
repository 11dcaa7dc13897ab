"""Reading the values inside a call as models really write them: JSON
objects (a doubled opening brace and stray closing braces forgiven), the
typed text of an XML parameter, Gemma 4's own notation, and the keyword
arguments of a Python-style call.

Each reader answers with a value, `INCOMPLETE` (the text stops inside it:
more may come) or `INVALID` (no more text can make it one)."""

from __future__ import annotations

import ast
import json
import re
from typing import Any, Final

INCOMPLETE: Final = "incomplete"
INVALID: Final = "invalid"

_WS = " \t\r\n"


def skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at] in _WS:
        at += 1
    return at


def balanced_end(text: str, at: int) -> int | None:
    """Where the JSON object or array opening at ``at`` closes (the index
    after its last bracket), counting brackets outside strings; None: the
    text stops before it does."""
    depth = 0
    in_string = escaped = False
    for i in range(at, len(text)):
        c = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def read_json(text: str, at: int) -> tuple[Any, int] | str:
    """The JSON object or array at ``at`` (after spaces) and where it ends."""
    at = skip_space(text, at)
    if at >= len(text):
        return INCOMPLETE
    if text[at] not in "{[":
        return INVALID
    end = balanced_end(text, at)
    if end is None:
        return INCOMPLETE
    try:
        return json.loads(text[at:end]), end
    except json.JSONDecodeError:
        return INVALID


def read_object(text: str, at: int) -> tuple[Any, int] | str:
    """Like `read_json`, forgiving what models write: an object opened with
    a doubled brace, ``{{"name": ...}}`` (Qwen2.5's chat templates show the
    call format that way, inside a Jinja string: ``{{\\"name\\": <function-name>,
    ...}}``, and Qwen2.5-Coder copies it), and closing braces beyond the
    object's own (``...}}}`` where the opening was single)."""
    at = skip_space(text, at)
    if text.startswith("{", at) and (inner := skip_space(text, at + 1)) < len(text) and text[inner] == "{":
        found = read_json(text, inner)
        if isinstance(found, tuple):
            return found[0], stray_braces(text, found[1])
        if found == INCOMPLETE:
            return INCOMPLETE
    elif text.startswith("{", at) and skip_space(text, at + 1) >= len(text):
        return INCOMPLETE  # a lone `{`: maybe the first of two
    found = read_json(text, at)
    if isinstance(found, tuple):
        return found[0], stray_braces(text, found[1])
    return found


def stray_braces(text: str, end: int) -> int:
    """``end`` past any closing braces that follow it (spaces between allowed)."""
    while (nxt := skip_space(text, end)) < len(text) and text[nxt] == "}":
        end = nxt + 1
    return end


def call_object(value: Any) -> tuple[str, Any] | None:
    """(name, arguments) of ``{"name": ..., "arguments"|"parameters": ...}``
    (arguments given as JSON text are read), or None when ``value`` is not one."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    if "function" in value and isinstance(value["function"], dict):  # OpenAI's own shape
        return call_object(value["function"])
    args = value.get("arguments", value.get("parameters", {}))
    return value["name"], arguments(args)


def arguments(args: Any) -> Any:
    """Arguments written as JSON text (a string holding an object) read as the object."""
    if isinstance(args, str):
        try:
            return json.loads(args)
        except json.JSONDecodeError:
            return args
    return args


# -- XML parameters (Qwen3-Coder) --


def _types(schema: Any) -> set[str]:
    if not isinstance(schema, dict):
        return set()
    kind = schema.get("type")
    found = {kind} if isinstance(kind, str) else set(kind) if isinstance(kind, list) else set()
    for key in ("anyOf", "oneOf"):
        for option in schema.get(key) or []:
            found |= _types(option)
    if "enum" in schema and not found:
        found = {"string" if isinstance(v, str) else "json" for v in schema["enum"]}
    return found


_PYTHON_WORDS: dict[str, Any] = {"True": True, "False": False, "None": None}


def string_valued(schema: Any) -> bool:
    """Whether a parameter's value is only ever a string (its XML text is the value)."""
    return _types(schema) == {"string"}


def typed(text: str, schema: Any) -> Any:
    """An XML parameter's text as its schema's type: a string stays text
    (one new line either side is the layout's, not the value's); anything
    else is read as JSON, and stays text where it is not."""
    if text.startswith("\n"):
        text = text[1:]
    if text.endswith("\n"):
        text = text[:-1]
    if string_valued(schema):
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    # Python's spelling, which chat templates rendered by Python (`value | string`) show the model
    if text.strip() in _PYTHON_WORDS:
        return _PYTHON_WORDS[text.strip()]
    try:
        value = ast.literal_eval(text.strip())
        json.dumps(value)  # a value JSON can carry (not a set, bytes, a complex number)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return text
    return value


# -- Gemma 4's notation: {key:<|"|>text<|"|>,n:1,list:[...]} --

GEMMA_QUOTE = '<|"|>'
_GEMMA_SCALAR = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?|true|false|null")


def gemma_value(text: str, at: int) -> tuple[Any, int] | str:  # noqa: PLR0911  one way out for each way the text may stand
    """One value of Gemma 4's call notation at ``at``, and where it ends."""
    at = skip_space(text, at)
    if at >= len(text):
        return INCOMPLETE
    if text.startswith(GEMMA_QUOTE, at):
        close = text.find(GEMMA_QUOTE, at + len(GEMMA_QUOTE))
        if close < 0:
            return INCOMPLETE
        return text[at + len(GEMMA_QUOTE) : close], close + len(GEMMA_QUOTE)
    if GEMMA_QUOTE.startswith(text[at:]):
        return INCOMPLETE
    if text[at] == "{":
        return _gemma_items(text, at + 1, "}", keyed=True)
    if text[at] == "[":
        return _gemma_items(text, at + 1, "]", keyed=False)
    match = _GEMMA_SCALAR.match(text, at)
    if match is None:
        rest = text[at:]
        return (
            INCOMPLETE if rest == "-" or any(word.startswith(rest) for word in ("true", "false", "null")) else INVALID
        )
    if match.end() == len(text):
        return INCOMPLETE  # a number may go on
    return json.loads(match.group()), match.end()


def _gemma_items(text: str, at: int, close: str, *, keyed: bool) -> tuple[Any, int] | str:  # noqa: PLR0911  one way out for each way the text may stand
    items: list[Any] = []
    keys: list[str] = []
    at = skip_space(text, at)
    if text.startswith(close, at):
        return ({} if keyed else []), at + 1
    while True:
        if keyed:
            colon = text.find(":", at)
            if colon < 0:
                return INCOMPLETE if "}" not in text[at:] else INVALID
            key = text[at:colon].strip()
            if not key or "}" in key or "," in key:
                return INVALID
            keys.append(key.removeprefix(GEMMA_QUOTE).removesuffix(GEMMA_QUOTE))
            at = colon + 1
        found = gemma_value(text, at)
        if isinstance(found, str):
            return found
        items.append(found[0])
        at = skip_space(text, found[1])
        if at >= len(text):
            return INCOMPLETE
        if text[at] == ",":
            at = skip_space(text, at + 1)
            continue
        if text[at] == close:
            return (dict(zip(keys, items, strict=True)) if keyed else items), at + 1
        return INVALID


# -- Python-style calls (Gemma 3's tool_code, Llama's built-in tools) --


def python_call(source: str) -> tuple[str, dict[str, Any]] | None:
    """``name(a="x", b=1)`` (or wrapped in ``print(...)``): the name and the
    keyword arguments, literals only (nothing is evaluated)."""
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError:
        return None
    node = tree.body
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "print"
        and len(node.args) == 1
        and not node.keywords
    ):
        node = node.args[0]
    if not isinstance(node, ast.Call) or node.args:
        return None
    name = _dotted(node.func)
    if name is None:
        return None
    args: dict[str, Any] = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            return None
        try:
            args[keyword.arg] = ast.literal_eval(_JsonWords().visit(keyword.value))
        except ValueError:
            return None
    return name, args


class _JsonWords(ast.NodeTransformer):
    """JSON's ``true``, ``false`` and ``null`` inside a Python-style call (as
    LFM2 writes an object argument) read as Python's."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        words = {"true": True, "false": False, "null": None}
        return ast.Constant(words[node.id]) if node.id in words else node


def python_calls(source: str) -> list[tuple[str, dict[str, Any]]] | None:
    """``[a(x=1), b(y="z")]`` or one call alone (LFM2's notation): each name and its keyword arguments."""
    text = source.strip()
    if not (text.startswith("[") and text.endswith("]")):
        found = python_call(text)
        return None if found is None else [found]
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return None
    if not isinstance(tree.body, ast.List):
        return None
    calls = []
    for item in tree.body.elts:
        found = python_call(ast.unparse(item))
        if found is None:
            return None
        calls.append(found)
    return calls or None


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None
