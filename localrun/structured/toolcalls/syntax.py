"""Where calls are in a reply, syntax by syntax: each finder answers the
first `Region` at or after a position, the calls written in it, or a region
still being written (the text stops inside it, or inside what may begin one:
a stream holds it back).

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
    gemma_value,
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


def _open(start: int) -> Region:
    return Region(start, -1)


def _bad(start: int, end: int, problem: str) -> Region:
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


def _expect(text: str, at: int, literal: str) -> int | str:
    """The index after ``literal`` at ``at``; INCOMPLETE where the text stops inside it."""
    if text.startswith(literal, at):
        return at + len(literal)
    return INCOMPLETE if literal.startswith(text[at:]) else INVALID


_NAME_CHARS = re.compile(r'(?:[^"\\]|\\.)*')


def object_head(text: str, at: int) -> tuple[str, int] | str:
    """The function named by the call object opening at ``at``
    (``{"name": "NAME"``, a doubled brace allowed), and where its name ends."""
    i = _expect(text, at, "{")
    if isinstance(i, str):
        return i
    i = skip_space(text, i)
    if text.startswith("{", i):
        i = skip_space(text, i + 1)
    for literal in ('"name"', ":", '"'):
        i = _expect(text, skip_space(text, i), literal)
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


def _json_body(text: str, at: int, end: int) -> tuple[Written, ...] | str:
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


def _xml_calls(body: str, ctx: Context) -> tuple[Written, ...] | str:
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
        return _open(start)
    body = start + len("<tool_call>")
    close, closed = find_marker(text, body, "</tool_call>")
    if not closed:
        if not ctx.final:
            return _open(start)
        close = len(text)
    end = close + len("</tool_call>") if closed else len(text)
    inner = text[body:close]
    found = _xml_calls(inner, ctx) if _FUNCTION.match(inner.lstrip()) else _json_body(text, body, close)
    if isinstance(found, str):
        return _bad(start, end, found)
    return Region(start, end, found)


def function_tags(text: str, pos: int, ctx: Context) -> Region | None:
    """Qwen3-Coder's call with its ``<tool_call>`` left out (as llama.cpp
    notes the model sometimes does): ``<function=NAME>`` for a declared NAME."""
    while True:
        start, whole = find_marker(text, pos, "<function=")
        if start < 0:
            return None
        if not whole:
            return _open(start)
        head = _FUNCTION.match(text, start)
        if head is None:
            if "\n" in text[start:] or ">" in text[start:]:
                pos = start + 1
                continue
            return _open(start)
        if head.group(1).strip() not in ctx.names:
            pos = head.end()
            continue
        close, closed = find_marker(text, head.end(), "</function>")
        if not closed:
            return None if ctx.final else _open(start)
        end = close + len("</function>")
        tail, tail_whole = find_marker(text, end, "</tool_call>")
        if tail_whole and not text[end:tail].strip():
            end = tail + len("</tool_call>")
        elif tail >= 0 and not text[end:tail].strip() and not ctx.final:
            return _open(start)
        found = _xml_calls(text[start : close + len("</function>")], ctx)
        return _bad(start, end, found) if isinstance(found, str) else Region(start, end, found)


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
        return _open(start) if named is not False and not ctx.final else None
    if isinstance(found, str):
        return None
    calls = json_calls(found[0])
    if calls is None or not all(c.name in ctx.names for c in calls):
        return None
    return Region(start, found[1], calls)


def _bare_objects(text: str, start: int, ctx: Context) -> Region | None:
    calls: list[Written] = []
    i = end = start
    while (named := _declared(object_head(text, i), ctx)) is not False:
        if named is None or (found := read_object(text, i)) == INCOMPLETE:
            if not ctx.final:
                return _open(start)
            named = None
            break
        if isinstance(found, str):
            return _bad(start, len(text), "the call is not JSON")
        written = json_calls(found[0])
        if written is None:
            return _bad(start, found[1], 'the JSON is not {"name": ..., "arguments": {...}}')
        calls += written
        end = found[1]
        i = skip_space(text, end)
        if text.startswith(";", i):
            i = skip_space(text, i + 1)
        if i >= len(text) and not ctx.final:
            return _open(start)  # another may follow
    if not calls:
        return _bad(start, len(text), "the call is cut short") if named is None else None
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
            fence = _expect(text, start, opening)
            if not isinstance(fence, str) or fence == INCOMPLETE:
                break
        if fence == INCOMPLETE and not ctx.final:
            return _open(start)
        if isinstance(fence, str):
            pos = start + 3
            continue
        head = object_head(text, skip_space(text, fence))
        if head == INCOMPLETE:
            return None if ctx.final else _open(start)
        if head == INVALID or (isinstance(head, tuple) and head[0] not in ctx.names):
            pos = start + 3
            continue
        close, closed = find_marker(text, fence, "```")
        if not closed:
            return _bad(start, len(text), "the call is cut short") if ctx.final else _open(start)
        found = _json_body(text, fence, close)
        end = close + 3
        return _bad(start, end, found) if isinstance(found, str) else Region(start, end, found)


def tool_code(text: str, pos: int, ctx: Context) -> Region | None:
    """Gemma 3's convention when prompted for tools: a ``tool_code`` block of
    Python-style calls, ``get_weather(city="Lisbon")``."""
    opening = "```tool_code\n"
    start, whole = find_marker(text, pos, opening)
    if start < 0:
        return None
    if not whole:
        return _open(start)
    close, closed = find_marker(text, start + len(opening), "```")
    if not closed:
        return _bad(start, len(text), "the call is cut short") if ctx.final else _open(start)
    calls = []
    for line in text[start + len(opening) : close].strip().splitlines():
        found = python_call(line)
        if found is None:
            return _bad(start, close + 3, "not a call of name(key=value, ...)")
        calls.append(Written(*found))
    return Region(start, close + 3, tuple(calls))


# ------------------------------------------------------ marker + JSON calls --


def marker_then_json(marker: str) -> Finder:  # noqa: C901  one way out for each way the text may stand
    """``MARKER`` then JSON calls (one object, a list, or several):
    Llama 3.1's ``<|python_tag|>``, Granite 3's ``<|tool_call|>``,
    Mistral Nemo's ``[TOOL_CALLS]``."""

    def find(text: str, pos: int, ctx: Context) -> Region | None:  # noqa: C901, PLR0911  one way out for each way the text may stand
        start, whole = find_marker(text, pos, marker)
        if start < 0:
            return None
        if not whole:
            return _open(start)
        i = start + len(marker)
        calls: list[Written] = []
        end = i
        while True:
            found = read_object(text, i)
            if found == INCOMPLETE:
                if ctx.final:
                    break
                return _open(start)
            if isinstance(found, str):
                break
            written = json_calls(found[0])
            if written is None:
                return _bad(start, found[1], 'the JSON is not {"name": ..., "arguments": {...}}')
            calls += written
            end = found[1]
            i = skip_space(text, end)
            if text.startswith(";", i):
                i += 1
        if not calls:
            return _bad(start, len(text) if ctx.final else i, "no JSON call after " + marker)
        if skip_space(text, end) >= len(text) and not ctx.final:
            return _open(start)
        return Region(start, end, tuple(calls))

    return find


# -------------------------------------------------------- Mistral's [ARGS] --


_MISTRAL_NAME = re.compile(r"\s*([A-Za-z0-9_.\-]+)")
_CALL_ID = re.compile(r"[A-Za-z0-9]*")


def _mistral_head(text: str, at: int) -> tuple[str, int] | str:
    """``NAME[ARGS]`` or ``NAME[CALL_ID]id[ARGS]`` at ``at``: the name, and where the arguments begin."""
    name = _MISTRAL_NAME.match(text, at)
    if name is None:
        return INCOMPLETE if skip_space(text, at) >= len(text) else INVALID
    i = name.end()
    if text.startswith("[CALL_ID]", i):
        i = _CALL_ID.match(text, i + len("[CALL_ID]")).end()  # type: ignore[union-attr]
    elif i < len(text) and "[CALL_ID]".startswith(text[i:]):
        return INCOMPLETE
    if i >= len(text):
        return INCOMPLETE
    end = _expect(text, i, "[ARGS]")
    return end if isinstance(end, str) else (name.group(1), end)


def mistral(text: str, pos: int, ctx: Context) -> Region | None:  # noqa: C901, PLR0911, PLR0912  one way out for each way the text may stand
    """``[TOOL_CALLS]`` then a JSON list of calls (Mistral Nemo), or
    ``NAME[ARGS]{...}`` with an optional ``[CALL_ID]id`` (Mistral Small 3.2,
    Devstral, Ministral 3), each call with its own marker or one for all."""
    marker = "[TOOL_CALLS]"
    start, whole = find_marker(text, pos, marker)
    if start < 0:
        return None
    if not whole:
        return _open(start)
    i = skip_space(text, start + len(marker))
    if i >= len(text):
        return None if ctx.final else _open(start)
    if text[i] in "[{":
        return marker_then_json(marker)(text, start, ctx)
    calls: list[Written] = []
    end = i
    while True:
        head = _mistral_head(text, i)
        if head == INCOMPLETE and not ctx.final:
            return _open(start)
        if isinstance(head, str):
            break
        found = read_object(text, head[1])
        if found == INCOMPLETE:
            if not ctx.final:
                return _open(start)
            if calls:  # the calls before it stand
                break
            return _bad(start, len(text), "the call is cut short")
        if isinstance(found, str):
            return _bad(start, len(text), "the arguments are not JSON")
        calls.append(Written(head[0], found[0]))
        end = found[1]
        i = skip_space(text, end)
        if text.startswith(marker, i):
            i += len(marker)
        elif not ctx.final and marker.startswith(text[i:]):
            return _open(start)  # another call may follow
        else:
            break
    if not calls:
        return _bad(start, len(text) if ctx.final else i, "no call after [TOOL_CALLS]")
    return Region(start, end, tuple(calls))


def name_then_json(text: str, pos: int, ctx: Context) -> Region | None:
    """Declared NAMEs each followed by its JSON arguments, opening the reply:
    Mistral's ``[TOOL_CALLS]NAME[ARGS]{...}`` where ``[TOOL_CALLS]`` and
    ``[ARGS]`` render as nothing. With any text after them they are not
    calls, so they are held back to the end."""
    start = skip_space(text, pos)
    if text[:start].strip() or start >= len(text):
        return None
    calls: list[Written] = []
    i = start
    while i < len(text):
        head = _declared_name(text, i, ctx)
        if head == INCOMPLETE and not ctx.final:
            return _open(start)
        if isinstance(head, str):
            return None
        found = read_object(text, head[1])
        if found == INCOMPLETE:
            return _bad(start, len(text), "the call is cut short") if ctx.final else _open(start)
        if isinstance(found, str):
            return None
        calls.append(Written(head[0], found[0]))
        i = skip_space(text, found[1])
    return Region(start, len(text), tuple(calls)) if ctx.final else _open(start)


def _declared_name(text: str, at: int, ctx: Context) -> tuple[str, int] | str:
    """A declared name followed by ``{`` at ``at``: the name and where its ``{`` is."""
    for name in ctx.names:
        if text.startswith(name, at):
            brace = skip_space(text, at + len(name))
            if brace >= len(text):
                return INCOMPLETE
            if text[brace] == "{":
                return name, brace
    return INCOMPLETE if any(name.startswith(text[at:]) for name in ctx.names) else INVALID


# ------------------------------------------------------- DeepSeek R1 and V3 --

DS_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
DS_CALLS_END = "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN = "<｜tool▁call▁begin｜>"
DS_CALL_END = "<｜tool▁call▁end｜>"
DS_SEP = "<｜tool▁sep｜>"
_DS_FENCE = re.compile(r"\s*```(?:json)?\s*\n?")


def _deepseek_call(body: str) -> Written | str:
    """One call between DeepSeek's call markers: R1's ``function<sep>NAME``
    and a fenced JSON block, or V3.1's ``NAME<sep>`` and the JSON itself."""
    left, sep, right = body.partition(DS_SEP)
    if not sep:
        return "no <｜tool▁sep｜> in the call"
    if right.lstrip().startswith(("{", "[")):
        name, args_at = left.strip(), 0
    else:
        line, _, _ = right.partition("\n")
        name = line.strip()
        fence = _DS_FENCE.match(right, len(line))
        args_at = fence.end() if fence else len(line)
    found = read_object(right, args_at)
    if isinstance(found, str):
        return "the arguments are not JSON"
    tail = right[found[1] :].strip()
    if tail not in ("", "```"):
        return "text after the arguments"
    return Written(name, found[0])


def deepseek(text: str, pos: int, ctx: Context) -> Region | None:  # noqa: C901, PLR0911, PLR0912  one way out for each way the text may stand
    """DeepSeek R1 / V3 / V3.1: the calls' opening marker (left out at times),
    each call between its own markers, then the calls' closing marker (`DS_*`)."""
    outer, outer_whole = find_marker(text, pos, DS_CALLS_BEGIN)
    inner, inner_whole = find_marker(text, pos, DS_CALL_BEGIN)
    candidates = [(at, whole) for at, whole in ((outer, outer_whole), (inner, inner_whole)) if at >= 0]
    if not candidates:
        return None
    start, whole = min(candidates)
    if not whole:
        return _open(start)
    i = start + len(DS_CALLS_BEGIN) if text.startswith(DS_CALLS_BEGIN, start) else start
    calls: list[Written] = []
    while True:
        i = skip_space(text, i)
        if text.startswith(DS_CALLS_END, i):
            i += len(DS_CALLS_END)
            break
        if not text.startswith(DS_CALL_BEGIN, i):
            if not ctx.final and (DS_CALL_BEGIN.startswith(text[i:]) or DS_CALLS_END.startswith(text[i:])):
                return _open(start)
            if not ctx.final and i < len(text):
                break  # text after the calls with no closing marker: they end here
            if not ctx.final:
                return _open(start)
            break
        close, closed = find_marker(text, i, DS_CALL_END)
        if not closed:
            if not ctx.final:
                return _open(start)
            if calls:  # the calls before it stand
                break
            return _bad(start, len(text), "the call is cut short")
        found = _deepseek_call(text[i + len(DS_CALL_BEGIN) : close])
        if isinstance(found, str):
            return _bad(start, close + len(DS_CALL_END), found)
        calls.append(found)
        i = close + len(DS_CALL_END)
    if not calls:
        return _bad(start, i, "no call between the markers")
    return Region(start, i, tuple(calls))


# ---------------------------------------------------------- gpt-oss harmony --

# a message header addressed to a function: `<|start|>assistant<|channel|>commentary
# to=functions.NAME <|constrain|>json<|message|>` as the model writes it, or
# `<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>` as
# the chat template renders a past call; where the special tokens render as
# nothing, `to=functions.NAME ... json`
_HARMONY_CALL = re.compile(
    r"(?:<\|start\|>assistant\s*)?(?:<\|channel\|>(?:commentary|analysis)\s*)?to=functions\.([\w.\-]+)"
    r"(?:\s*<\|channel\|>\s*(?:commentary|analysis))?\s*(?:<\|constrain\|>\s*)?(?:json\s*)?(?:<\|message\|>)?"
)
_HEADER_START = re.compile(r"<\|start\|>|<\|channel\|>")


def harmony(text: str, pos: int, ctx: Context) -> Region | None:  # noqa: PLR0911  one way out for each way the text may stand
    """gpt-oss: a commentary message to ``functions.NAME`` whose body is the
    JSON arguments (then ``<|call|>``, which ends the generation). Other
    channels (``analysis``, ``final``) are left as they are."""
    recipient = text.find("to=functions.", pos)
    # the header's beginning is at most a few markers before its recipient
    match = _HARMONY_CALL.search(text, max(pos, recipient - 64)) if recipient >= 0 else None
    if match is not None and skip_space(text, match.end()) >= len(text) and not ctx.final:
        return _open(match.start())
    if match is None or not text.startswith("{", skip_space(text, match.end())):
        held = None if ctx.final else _harmony_held(text, pos)
        if held is not None:
            return _open(held)
        return None if match is None else _bad(match.start(), match.end(), "no JSON arguments after the header")
    found = read_object(text, match.end())
    if found == INCOMPLETE:
        return _bad(match.start(), len(text), "the call is cut short") if ctx.final else _open(match.start())
    if isinstance(found, str):
        return _bad(match.start(), len(text), "the arguments are not JSON")
    end = found[1]
    after = skip_space(text, end)
    if text.startswith("<|call|>", after):
        end = after + len("<|call|>")
    elif not ctx.final and "<|call|>".startswith(text[after:]):
        return _open(match.start())  # its <|call|> may follow
    return Region(match.start(), end, (Written(match.group(1), found[0]),))


def _harmony_held(text: str, pos: int) -> int | None:
    """Where a header still being written begins (one not yet at its
    ``<|message|>``, or a recipient whose JSON has not begun), or where a
    beginning of ``to=functions.`` ends the text."""
    held = []
    after = max(pos, text.rfind("<|message|>") + 1, text.rfind("<|end|>") + 1)
    header = _HEADER_START.search(text, after)
    if header is not None:
        held.append(header.start())
    for marker in ("<|start|>", "<|channel|>", "<|message|>"):
        at, whole = find_marker(text, pos, marker)
        if at >= 0 and not whole:
            held.append(at)
    recipient, whole = find_marker(text, pos, "to=functions.")
    if recipient >= 0 and (not whole or "{" not in text[recipient:]):
        held.append(recipient)
    return min(held, default=None)


# --------------------------------------------------------------- Gemma 4 --


def gemma4(text: str, pos: int, ctx: Context) -> Region | None:  # noqa: C901, PLR0911  one way out for each way the text may stand
    """Gemma 4: ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:1}<tool_call|>``
    (its own notation, not JSON)."""
    opening = "<|tool_call>call:"
    start, whole = find_marker(text, pos, opening)
    if start < 0:
        return None
    if not whole:
        return _open(start)
    calls: list[Written] = []
    i = start
    end = start
    while text.startswith(opening, i):
        brace = text.find("{", i)
        if brace < 0:
            return None if ctx.final else _open(start)
        name = text[i + len(opening) : brace].strip()
        found = gemma_value(text, brace)
        if found == INCOMPLETE:
            if not ctx.final:
                return _open(start)
            if calls:  # the calls before it stand
                break
            return _bad(start, len(text), "the call is cut short")
        if isinstance(found, str):
            return _bad(start, len(text), "the arguments are not in Gemma's notation")
        calls.append(Written(name, found[0]))
        end = found[1]
        close, closed = find_marker(text, end, "<tool_call|>")
        if close == end and closed:
            end += len("<tool_call|>")
        elif close == end and not ctx.final:
            return _open(start)
        i = end
        if not ctx.final and opening.startswith(text[i:]):
            return _open(start)  # another call may follow
    return Region(start, end, tuple(calls))
