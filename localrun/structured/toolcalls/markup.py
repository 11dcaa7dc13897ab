"""Where calls are in a reply, for the families that wrap them in markers
of their own: each call (or all of them) between an opening and a closing
marker (`wrapped`, `each`), the body read by the family's notation: JSON
here, Python-style calls (LFM2), element tags in `elements`. Markers that
frame a reply's parts and are no content are `layout`."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from localrun.structured.toolcalls.syntax import (
    Context,
    Finder,
    Region,
    Written,
    find_marker,
    json_body,
    not_calls,
    still_open,
)
from localrun.structured.toolcalls.values import python_calls, read_json, read_object, skip_space

Body = Callable[[str, Context], tuple[Written, ...] | str]


def wrapped(opening: str, closing: str, body: Body, ends: str = "") -> Finder:
    """``OPENING`` BODY ``CLOSING``, BODY read by ``body``; at the end of a
    finished reply a missing closing marker is forgiven (the end of the
    generation took its place). ``ends``: what ends each of several calls
    in BODY: a finished reply cut short during a call keeps the whole calls
    before it, and the cut one stays content."""

    def find(text: str, pos: int, ctx: Context) -> Region | None:
        if ends and ctx.final and (rest := _rest_of_cut(text, pos, ctx, opening, closing, body, ends)) is not None:
            return rest
        start, whole = find_marker(text, pos, opening)
        if start < 0:
            return None
        if not whole:
            return still_open(start)
        inner = start + len(opening)
        close, closed = find_marker(text, inner, closing)
        if not closed:
            if not ctx.final:
                return still_open(start)
            close = len(text)
        end = close + len(closing) if closed else len(text)
        found = body(text[inner:close], ctx)
        if isinstance(found, str) and not closed and (kept := _whole_calls(text[inner:], ctx, body, ends)) is not None:
            return Region(start, inner + kept[1], kept[0])
        return not_calls(start, end, found) if isinstance(found, str) else Region(start, end, found)

    return find


def _whole_calls(inner: str, ctx: Context, body: Body, ends: str) -> tuple[tuple[Written, ...], int] | None:
    """The calls of a body cut short before its cut, and where they end: its
    longest beginning up to the end of a call (``ends``) that reads as calls
    (a list the cut left open closed)."""
    if not ends:
        return None
    listed = inner.lstrip().startswith("[")
    cuts = [at + len(ends) for at in range(len(inner)) if inner.startswith(ends, at)]
    for cut in reversed(cuts):
        found = body(inner[:cut] + ("]" if listed else ""), ctx)
        if not isinstance(found, str):
            return found, cut
    return None


def _rest_of_cut(text: str, pos: int, ctx: Context, opening: str, closing: str, body: Body, ends: str) -> Region | None:
    """The call cut short at ``pos``, where the whole calls of an unclosed
    ``OPENING`` BODY before it end: content, with the reason."""
    start = text.rfind(opening, 0, pos)
    if start < 0 or not text[pos:].strip() or closing in text[start:]:
        return None
    inner = start + len(opening)
    if not isinstance(body(text[inner:], ctx), str):
        return None
    kept = _whole_calls(text[inner:], ctx, body, ends)
    return not_calls(pos, len(text), "the call is cut short") if kept and inner + kept[1] == pos else None


def schema_of(ctx: Context, name: str, key: str) -> Any:
    """The schema of parameter ``key`` of function ``name``, if declared."""
    return ((ctx.schemas.get(name) or {}).get("properties") or {}).get(key)


# ------------------------------------------------------------ JSON bodies --


def json_calls_body(inner: str, ctx: Context) -> tuple[Written, ...] | str:
    """Call objects, one after another or in a list: ``{"name": ..., "arguments": ...}``."""
    return json_body(inner, 0, len(inner))


def _named_objects(value: Any, name_key: str, args_key: str) -> tuple[Written, ...] | str:
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get(name_key), str):
            return f'the JSON is not {{"{name_key}": ..., "{args_key}": {{...}}}}'
        calls.append(Written(item[name_key], item.get(args_key, {})))
    return tuple(calls) if calls else "no call in it"


def keyed_json(name_key: str, args_key: str) -> Body:
    """A JSON list of calls whose name and arguments go by other keys
    (Command R's ``tool_name`` and ``parameters``)."""

    def body(inner: str, ctx: Context) -> tuple[Written, ...] | str:
        found = read_json(inner, 0)
        if isinstance(found, str) or inner[found[1] :].strip():
            return "the calls are not JSON"
        return _named_objects(found[0], name_key, args_key)

    return body


def name_keyed_json(inner: str, ctx: Context) -> tuple[Written, ...] | str:
    """A JSON list of ``{NAME: ARGS}`` objects (Apertus)."""
    found = read_json(inner, 0)
    if isinstance(found, str) or inner[found[1] :].strip():
        return "the calls are not JSON"
    items = found[0] if isinstance(found[0], list) else [found[0]]
    calls = []
    for item in items:
        if not isinstance(item, dict) or len(item) != 1:
            return "the JSON is not {NAME: {...}}"
        [(name, args)] = item.items()
        calls.append(Written(name, args))
    return tuple(calls) if calls else "no call in it"


# -------------------------------------------------------------- Kimi K2 --

_KIMI_HEAD = re.compile(
    r"\s*<\|tool_call_begin\|>\s*(?:functions\.)?([^\s:<]+)(?::\d+)?\s*<\|tool_call_argument_begin\|>"
)


def kimi_body(inner: str, ctx: Context) -> tuple[Written, ...] | str:
    """``<|tool_call_begin|>functions.NAME:INDEX<|tool_call_argument_begin|>{...}<|tool_call_end|>``, each call."""
    calls = []
    at = 0
    while (head := _KIMI_HEAD.match(inner, at)) is not None:
        found = read_object(inner, head.end())
        if isinstance(found, str):
            return "the arguments are not JSON"
        calls.append(Written(head.group(1), found[0]))
        at = skip_space(inner, found[1])
        if inner.startswith("<|tool_call_end|>", at):
            at += len("<|tool_call_end|>")
    if inner[at:].strip() or not calls:
        return "not a <|tool_call_begin|> call"
    return tuple(calls)


# ------------------------------------------------------------------ LFM2 --


def python_list_body(inner: str, ctx: Context) -> tuple[Written, ...] | str:
    """LFM2's ``[name(key='value', n=1), ...]``."""
    found = python_calls(inner)
    if found is None:
        return "not a list of name(key=value, ...) calls"
    return tuple(Written(name, args) for name, args in found)


# -------------------------------------------------- marker, name, JSON --


def named_json_body(inner: str, ctx: Context) -> tuple[Written, ...] | str:
    """Functionary 3.1's ``NAME>{...}`` (after ``<function=``)."""
    name, sep, rest = inner.partition(">")
    found = read_object(rest, 0) if sep else "no >"
    if isinstance(found, str) or rest[found[1] :].strip():
        return "the arguments are not JSON"
    return (Written(name.strip(), found[0]),)


# ---------------------------------------------------------- Solar Open --

_SOLAR = re.compile(r"\s*[^<]*<\|tool_call:name\|>\s*([^<\s]+)\s*<\|tool_call:args\|>")


def solar_body(inner: str, ctx: Context) -> tuple[Written, ...] | str:
    """Solar Open's ``ID<|tool_call:name|>NAME<|tool_call:args|>{...}`` (after ``<|tool_call:begin|>``)."""
    head = _SOLAR.match(inner)
    found = read_object(inner, head.end()) if head else "no name"
    if head is None or isinstance(found, str) or inner[found[1] :].strip():
        return "not a <|tool_call:name|> call"
    return (Written(head.group(1), found[0]),)


# ------------------------------------------------------ several wrapped --


def each(opening: str, closing: str, body: Body) -> Body:
    """A body of calls each wrapped in its own markers (Hunyuan's
    ``<tool_call:opensource>`` inside ``<tool_calls:opensource>``)."""

    def read(inner: str, ctx: Context) -> tuple[Written, ...] | str:
        calls: list[Written] = []
        at = skip_space(inner, 0)
        while inner.startswith(opening, at):
            close = inner.find(closing, at + len(opening))
            stop = close if close >= 0 else len(inner)
            found = body(inner[at + len(opening) : stop], ctx)
            if isinstance(found, str):
                return found
            calls += found
            at = skip_space(inner, stop + len(closing) if close >= 0 else stop)
        if inner[at:].strip() or not calls:
            return f"not {opening} calls"
        return tuple(calls)

    return read


def layout(*markers: str) -> Finder:
    """Markers that frame a reply's parts and are neither content nor calls
    (Kimi K3's ``<|open|>response<|sep|>``): each a region with no calls."""

    def find(text: str, pos: int, ctx: Context) -> Region | None:
        found = []
        for marker in markers:
            at, whole = find_marker(text, pos, marker)
            if at >= 0:
                found.append((at, whole, marker))
        if not found:
            return None
        at, whole, marker = min(found)
        if not whole:
            return None if ctx.final else still_open(at)
        return Region(at, at + len(marker))

    return find
