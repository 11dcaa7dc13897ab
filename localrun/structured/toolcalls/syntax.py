"""Where calls are in a reply, syntax by syntax: each finder answers the
first `Region` at or after a position, the calls written in it, or a region
still being written (the text stops inside it, or inside what may begin one:
a stream holds it back). Here: the syntax many families share (Hermes'
``<tool_call>``, Qwen3-Coder's XML, a marker then JSON, bare and fenced JSON,
Gemma 3's ``tool_code``); the families' own are in `vendors`.

The finders read the markers as text: a marker that is a special token of
the vocabulary reaches them only where the output renders it (as llama.cpp's
server renders a format's "preserved tokens"); where it renders as nothing,
the calls that open a reply are still found by what follows the marker."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from localrun.structured.toolcalls.values import (
    INCOMPLETE,
    INVALID,
    call_object,
    python_call,
    read_json,
    read_object,
    skip_space,
    typed,
)


@dataclass(frozen=True)
class Written:
    """One call as written (its arguments not checked yet)."""

    name: str
    arguments: Any


@dataclass(frozen=True)
class Region:
    start: int
    end: int  # -1: still being written
    calls: tuple[Written, ...] = ()
    problem: str = ""  # why its text is not calls (it stays content)


@dataclass(frozen=True)
class Context:
    names: frozenset[str]
    schemas: dict[str, Any] = field(default_factory=dict)
    final: bool = False  # the reply is finished: nothing more will come


Finder = Callable[[str, int, Context], Region | None]


def still_open(start: int) -> Region:
    return Region(start, -1)


def not_calls(start: int, end: int, problem: str) -> Region:
    return Region(start, end, problem=problem)


def find_marker(text: str, pos: int, marker: str) -> tuple[int, bool]:
    """Where ``marker`` is from ``pos`` (True), or where a beginning of it
    ends the text (False), or (-1, False)."""
    at = text.find(marker, pos)
    if at >= 0:
        return at, True
    for k in range(min(len(marker) - 1, len(text) - pos), 0, -1):
        if text.endswith(marker[:k]):
            return len(text) - k, False
    return -1, False


def expect(text: str, at: int, literal: str) -> int | str:
    """The index after ``literal`` at ``at``; INCOMPLETE where the text stops inside it."""
    if text.startswith(literal, at):
        return at + len(literal)
    return INCOMPLETE if literal.startswith(text[at:]) else INVALID


_NAME_CHARS = re.compile(r'(?:[^"\\]|\\.)*')


def object_head(text: str, at: int) -> tuple[str, int] | str:
    """The function named by the call object opening at ``at``
    (``{"name": "NAME"``, a doubled brace allowed), and where its name ends."""
    i = expect(text, at, "{")
    if isinstance(i, str):
        return i
    i = skip_space(text, i)
    if text.startswith("{", i):
        i = skip_space(text, i + 1)
    for literal in ('"name"', ":", '"'):
        i = expect(text, skip_space(text, i), literal)
        if isinstance(i, str):
            return i
    match = _NAME_CHARS.match(text, i)
    assert match is not None
    if match.end() >= len(text):
        return INCOMPLETE
    return match.group().replace('\\"', '"'), match.end() + 1


# ------------------------------------------------------- JSON call bodies --


def json_calls(value: Any) -> tuple[Written, ...] | None:
    """The calls in a JSON value: one call object, or a list of them."""
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        found = call_object(item)
        if found is None:
            return None
        out.append(Written(found[0], found[1]))
    return tuple(out) if out else None


def json_body(text: str, at: int, end: int) -> tuple[Written, ...] | str:
    """The calls written as JSON in ``text[at:end]`` (one object, a list, or
    several objects one after another), or why not."""
    calls: list[Written] = []
    i = skip_space(text, at)
    while i < end:
        found = read_object(text[:end], i)
        if isinstance(found, str):
            return "the call is not JSON"
        written = json_calls(found[0])
        if written is None:
            return 'the JSON is not {"name": ..., "arguments": {...}}'
        calls += written
        i = skip_space(text, found[1])
        if i < end and text[i] in ",;":
            i = skip_space(text, i + 1)
    return tuple(calls) if calls else "no call in it"


# ------------------------------------------------ <tool_call> (Hermes, Qwen) --

_FUNCTION = re.compile(r"<function=([^>\n]*)>")
_PARAMETER = re.compile(r"<parameter=([^>\n]*)>")


def xml_calls(body: str, ctx: Context) -> tuple[Written, ...] | str:
    """Qwen3-Coder's calls: ``<function=NAME><parameter=P>value</parameter>...</function>``,
    each value typed by the parameter's schema."""
    calls = []
    pos = 0
    while (head := _FUNCTION.search(body, pos)) is not None:
        if body[pos : head.start()].strip():
            return "text between the calls"
        name = head.group(1).strip()
        close = body.find("</function>", head.end())
        inner = body[head.end() : close if close >= 0 else len(body)]
        properties = (ctx.schemas.get(name) or {}).get("properties") or {}
        args: dict[str, Any] = {}
        at = 0
        while (param := _PARAMETER.search(inner, at)) is not None:
            stop = inner.find("</parameter>", param.end())
            nxt = _PARAMETER.search(inner, param.end())
            if stop < 0 or (nxt is not None and nxt.start() < stop):  # a missing close tag: up to the next one
                stop = nxt.start() if nxt is not None else len(inner)
                at = stop
            else:
                at = stop + len("</parameter>")
            key = param.group(1).strip()
            args[key] = typed(inner[param.end() : stop], properties.get(key))
        calls.append(Written(name, args))
        pos = close + len("</function>") if close >= 0 else len(body)
    if body[pos:].strip() or not calls:
        return "not a <function=...> call"
    return tuple(calls)


def tool_call_tags(text: str, pos: int, ctx: Context) -> Region | None:
    """``<tool_call>`` BODY ``</tool_call>``: BODY is a JSON call (Hermes,
    Qwen2.5, Qwen3) or Qwen3-Coder's XML (a closing tag left out at the end is forgiven)."""
    start, whole = find_marker(text, pos, "<tool_call>")
    if start < 0:
        return None
    if not whole:
        return still_open(start)
    body = start + len("<tool_call>")
    close, closed = find_marker(text, body, "</tool_call>")
    if not closed:
        if not ctx.final:
            return still_open(start)
        close = len(text)
    end = close + len("</tool_call>") if closed else len(text)
    inner = text[body:close]
    found = xml_calls(inner, ctx) if _FUNCTION.match(inner.lstrip()) else json_body(text, body, close)
    if isinstance(found, str):
        return not_calls(start, end, found)
    return Region(start, end, found)


def function_tags(text: str, pos: int, ctx: Context) -> Region | None:
    """Qwen3-Coder's call with its ``<tool_call>`` left out (as llama.cpp
    notes the model sometimes does): ``<function=NAME>`` for a declared NAME."""
    while True:
        start, whole = find_marker(text, pos, "<function=")
        if start < 0:
            return None
        if not whole:
            return still_open(start)
        head = _FUNCTION.match(text, start)
        if head is None:
            if "\n" in text[start:] or ">" in text[start:]:
                pos = start + 1
                continue
            return still_open(start)
        if head.group(1).strip() not in ctx.names:
            pos = head.end()
            continue
        close, closed = find_marker(text, head.end(), "</function>")
        if not closed:
            return None if ctx.final else still_open(start)
        end = close + len("</function>")
        tail, tail_whole = find_marker(text, end, "</tool_call>")
        if tail_whole and not text[end:tail].strip():
            end = tail + len("</tool_call>")
        elif tail >= 0 and not text[end:tail].strip() and not ctx.final:
            return still_open(start)
        found = xml_calls(text[start : close + len("</function>")], ctx)
        return not_calls(start, end, found) if isinstance(found, str) else Region(start, end, found)


# ----------------------------------------------- bare and fenced JSON calls --


def bare_json(text: str, pos: int, ctx: Context) -> Region | None:
    """Call objects with no marker opening the reply (Llama 3.2's format,
    and what small models write): ``{"name": ...}``, several separated by
    new lines or ``;``, or a list of them (Mistral's and Granite's calls
    where their marker renders as nothing)."""
    start = skip_space(text, pos)
    if text[:start].strip() or start >= len(text):
        return None
    return _bare_list(text, start, ctx) if text[start] == "[" else _bare_objects(text, start, ctx)


def _declared(head: tuple[str, int] | str, ctx: Context) -> bool | None:
    """Whether a call object's head names a declared function (None: not known yet)."""
    if head == INCOMPLETE:
        return None
    return isinstance(head, tuple) and head[0] in ctx.names


def _bare_list(text: str, start: int, ctx: Context) -> Region | None:
    found = read_json(text, start)
    if found == INCOMPLETE:
        named = _declared(object_head(text, skip_space(text, start + 1)), ctx)
        return still_open(start) if named is not False and not ctx.final else None
    if isinstance(found, str):
        return None
    calls = json_calls(found[0])
    if calls is None or not all(c.name in ctx.names for c in calls):
        return None
    return Region(start, found[1], calls)


def _take_calls(text: str, start: int, found: tuple[Any, int], calls: list[Written]) -> Region | int:
    """The calls of a JSON object read from ``start``'s region (``found``:
    the value and where it ends) added to ``calls``, and where the next may
    begin (past a ``;``); or, when the object is not a call, the region saying so."""
    written = json_calls(found[0])
    if written is None:
        return not_calls(start, found[1], 'the JSON is not {"name": ..., "arguments": {...}}')
    calls += written
    i = skip_space(text, found[1])
    return skip_space(text, i + 1) if text.startswith(";", i) else i


def _bare_objects(text: str, start: int, ctx: Context) -> Region | None:
    calls: list[Written] = []
    i = end = start
    while (named := _declared(object_head(text, i), ctx)) is not False:
        if named is None or (found := read_object(text, i)) == INCOMPLETE:
            if not ctx.final:
                return still_open(start)
            named = None
            break
        if isinstance(found, str):
            return not_calls(start, len(text), "the call is not JSON")
        if isinstance(taken := _take_calls(text, start, found, calls), Region):
            return taken
        end, i = found[1], taken
        if i >= len(text) and not ctx.final:
            return still_open(start)  # another may follow
    if not calls:
        return not_calls(start, len(text), "the call is cut short") if named is None else None
    return Region(start, end, tuple(calls))


_FENCE_OPEN = ("```json\n", "```JSON\n", "```\n")


def fenced_json(text: str, pos: int, ctx: Context) -> Region | None:
    """A fenced JSON block holding a call of a declared function (what
    Qwen2.5-Coder writes whatever its template says); a block naming anything
    else is an ordinary code block."""
    while True:
        start, _ = find_marker(text, pos, "```")
        if start < 0:
            return None
        fence: int | str = INVALID
        for opening in _FENCE_OPEN:
            fence = expect(text, start, opening)
            if not isinstance(fence, str) or fence == INCOMPLETE:
                break
        if fence == INCOMPLETE and not ctx.final:
            return still_open(start)
        if isinstance(fence, str):
            pos = start + 3
            continue
        head = object_head(text, skip_space(text, fence))
        if head == INCOMPLETE:
            return None if ctx.final else still_open(start)
        if head == INVALID or (isinstance(head, tuple) and head[0] not in ctx.names):
            pos = start + 3
            continue
        close, closed = find_marker(text, fence, "```")
        if not closed:
            return not_calls(start, len(text), "the call is cut short") if ctx.final else still_open(start)
        found = json_body(text, fence, close)
        end = close + 3
        return not_calls(start, end, found) if isinstance(found, str) else Region(start, end, found)


def tool_code(text: str, pos: int, ctx: Context) -> Region | None:
    """Gemma 3's convention when prompted for tools: a ``tool_code`` block of
    Python-style calls, ``get_weather(city="Lisbon")``."""
    opening = "```tool_code\n"
    start, whole = find_marker(text, pos, opening)
    if start < 0:
        return None
    if not whole:
        return still_open(start)
    close, closed = find_marker(text, start + len(opening), "```")
    if not closed:
        return not_calls(start, len(text), "the call is cut short") if ctx.final else still_open(start)
    calls = []
    for line in text[start + len(opening) : close].strip().splitlines():
        found = python_call(line)
        if found is None:
            return not_calls(start, close + 3, "not a call of name(key=value, ...)")
        calls.append(Written(*found))
    return Region(start, close + 3, tuple(calls))


# ------------------------------------------------------ marker + JSON calls --


def _whole_items(text: str, at: int, calls: list[Written]) -> int:
    """A JSON list of calls at ``at`` that the end of the text cuts short:
    its whole call objects before the cut added to ``calls``, and where the
    last of them ends (``at`` where none is)."""
    i = skip_space(text, at)
    end = at
    if not text.startswith("[", i):
        return end
    i += 1
    while isinstance(found := read_object(text, i), tuple) and (written := json_calls(found[0])) is not None:
        calls += written
        end = found[1]
        i = skip_space(text, end)
        if not text.startswith(",", i):
            break
        i += 1
    return end


def marker_then_json(marker: str) -> Finder:  # noqa: C901  one way out for each way the text may stand
    """``MARKER`` then JSON calls (one object, a list, or several):
    Llama 3.1's ``<|python_tag|>``, Granite 3's ``<|tool_call|>``,
    Mistral Nemo's ``[TOOL_CALLS]``."""

    def find(text: str, pos: int, ctx: Context) -> Region | None:  # noqa: PLR0911  one way out for each way the text may stand
        start, whole = find_marker(text, pos, marker)
        if start < 0:
            return None
        if not whole:
            return still_open(start)
        i = start + len(marker)
        calls: list[Written] = []
        end = i
        while True:
            found = read_object(text, i)
            if found == INCOMPLETE:
                if ctx.final:
                    end = _whole_items(text, i, calls) if not calls else end
                    break
                return still_open(start)
            if isinstance(found, str):
                break
            if isinstance(taken := _take_calls(text, start, found, calls), Region):
                return taken
            end, i = found[1], taken
        if not calls:
            return not_calls(start, len(text) if ctx.final else i, "no JSON call after " + marker)
        if skip_space(text, end) >= len(text) and not ctx.final:
            return still_open(start)
        return Region(start, end, tuple(calls))

    return find
