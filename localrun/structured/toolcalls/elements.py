"""Calls written as element tags, family by family: ``<invoke name="NAME">``
with ``<parameter name="KEY">`` (MiniMax M2, DeepSeek V3.2 and V4, Muse),
GLM's ``<arg_key>``/``<arg_value>`` pairs (and Hunyuan's), MiniCPM's
``<param name="KEY">``, Seed-OSS's ``<function=NAME>``, Kimi K3's
``<|open|>argument ...``, MiniMax M3's one element per argument. Each is a
body for `markup.wrapped`; a value is read by its parameter's schema."""

from __future__ import annotations

import re
from typing import Any

from localrun.structured.toolcalls.markup import Body, schema_of
from localrun.structured.toolcalls.syntax import Context, Written, json_body, xml_calls
from localrun.structured.toolcalls.values import skip_space, typed

# ------------------------------------------------- <invoke name="..."> --


def invoke_body(prefix: str) -> Body:
    """``<invoke name="NAME"><parameter name="KEY">VALUE</parameter>...</invoke>``,
    the tags prefixed (MiniMax M2 none, DeepSeek V3.2 its DSML marker, Muse
    ``atem:``); a parameter's ``string="true"`` says its value is text, else
    it is read by the schema's type."""
    tag = re.escape(prefix)
    head = re.compile(rf'\s*<{tag}invoke name="([^"]*)">')
    param = re.compile(
        rf'\s*<{tag}parameter name="([^"]*)"(?: string="(true|false)")?>(.*?)</{tag}parameter>', re.DOTALL
    )
    closing = f"</{prefix}invoke>"

    def body(inner: str, ctx: Context) -> tuple[Written, ...] | str:
        calls = []
        at = 0
        while (found := head.match(inner, at)) is not None:
            name = found.group(1)
            args: dict[str, Any] = {}
            at = found.end()
            while (item := param.match(inner, at)) is not None:
                key, string, value = item.groups()
                args[key] = value if string == "true" else typed(value, schema_of(ctx, name, key))
                at = item.end()
            at = skip_space(inner, at)
            if not inner.startswith(closing, at):
                return f"no {closing} after the parameters"
            at += len(closing)
            calls.append(Written(name, args))
        if inner[at:].strip() or not calls:
            return "not an <invoke> call"
        return tuple(calls)

    return body


# ------------------------------------------ <arg_key>/<arg_value> (GLM) --


def arg_pairs_body(suffix: str = "", sep: str = "") -> Body:
    """GLM's ``NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...``
    (GLM 4.5 to 4.7, Ling, Laguna; Hunyuan's tags end in ``:opensource``
    and its name is followed by a separator): each value read by its
    parameter's type. A JSON call object in its place (what a model
    may write from other training) is read as Hermes' is."""
    pair = re.compile(
        rf"\s*<arg_key{suffix}>(.*?)</arg_key{suffix}>\s*<arg_value{suffix}>(.*?)</arg_value{suffix}>", re.DOTALL
    )
    first = f"<arg_key{suffix}>"

    def body(inner: str, ctx: Context) -> tuple[Written, ...] | str:
        if inner.lstrip().startswith("{"):
            return json_body(inner, 0, len(inner))
        cut = inner.find(first)
        name = (inner if cut < 0 else inner[:cut]).strip()
        name = name.removesuffix(sep).strip() if sep else name
        if not name or "<" in name or "\n" in name:
            return "no function name"
        args: dict[str, Any] = {}
        at = max(cut, 0) if cut >= 0 else len(inner)
        while (item := pair.match(inner, at)) is not None:
            key, value = item.group(1).strip(), item.group(2)
            args[key] = typed(value, schema_of(ctx, name, key))
            at = item.end()
        if inner[at:].strip():
            return "text after the arguments"
        return (Written(name, args),)

    return body


# --------------------------------------------- <function name="..."> --

_PARAM = re.compile(r'\s*<param name="([^"]*)">(.*?)</param>', re.DOTALL)


def param_body(inner: str, ctx: Context) -> tuple[Written, ...] | str:
    """MiniCPM's ``NAME"><param name="KEY">VALUE</param>...`` (after ``<function name="``)."""
    name, sep, rest = inner.partition('">')
    if not sep or not name:
        return "no function name"
    args: dict[str, Any] = {}
    at = 0
    while (item := _PARAM.match(rest, at)) is not None:
        args[item.group(1)] = typed(item.group(2), schema_of(ctx, name, item.group(1)))
        at = item.end()
    if rest[at:].strip():
        return "text after the parameters"
    return (Written(name, args),)


def seed_body(inner: str, ctx: Context) -> tuple[Written, ...] | str:
    """Seed-OSS: Qwen3-Coder's ``<function=NAME><parameter=KEY>...`` elements."""
    return xml_calls(inner, ctx)


# -------------------------------------------------------------- Kimi K3 --

_K3_ARG = re.compile(
    r'\s*<\|open\|>argument key="([^"]*)" type="([^"]*)"<\|sep\|>(.*?)<\|close\|>argument<\|sep\|>', re.DOTALL
)


def kimi3_body(inner: str, ctx: Context) -> tuple[Written, ...] | str:
    """Kimi K3's ``NAME" index="N"<|sep|>`` (after ``<|open|>call tool="``), then each
    ``<|open|>argument key="K" type="T"<|sep|>V<|close|>argument<|sep|>``."""
    head = re.match(r'([^"]+)"(?: index="\d+")?<\|sep\|>', inner)
    if head is None:
        return "no function name"
    args: dict[str, Any] = {}
    at = head.end()
    while (item := _K3_ARG.match(inner, at)) is not None:
        key, kind, value = item.groups()
        args[key] = value if kind == "string" else typed(value, schema_of(ctx, head.group(1), key))
        at = item.end()
    if inner[at:].strip():
        return "text after the arguments"
    return (Written(head.group(1), args),)


# ------------------------------------------------------------ MiniMax M3 --

MINIMAX_SEP = "]<]minimax[>["
_ELEMENT = re.compile(r"\s*<([^\s<>/]+)>")


def _element_value(text: str, at: int, tag: str, schema: Any) -> tuple[Any, int] | str:
    """The value of element ``tag`` whose content starts at ``at``: child
    elements (``<item>`` ones a list, others an object), or its text."""
    close = f"</{tag}>"
    child = _ELEMENT.match(text, at)
    if child is None or text.startswith(close, at):
        end = text.find(close, at)
        if end < 0:
            return "an element is not closed"
        return typed(text[at:end], schema), end + len(close)
    items: list[Any] = []
    fields: dict[str, Any] = {}
    while (child := _ELEMENT.match(text, at)) is not None:
        key = child.group(1)
        sub = (schema or {}).get("items") if key == "item" else ((schema or {}).get("properties") or {}).get(key)
        found = _element_value(text, child.end(), key, sub)
        if isinstance(found, str):
            return found
        if key == "item":
            items.append(found[0])
        else:
            fields[key] = found[0]
        at = found[1]
    at = skip_space(text, at)
    if not text.startswith(close, at):
        return "an element is not closed"
    return (items if items and not fields else fields), at + len(close)


def minimax_m3_body(inner: str, ctx: Context) -> tuple[Written, ...] | str:
    """MiniMax M3: ``<invoke name="NAME">`` with each argument an element
    (``<city>Lisbon</city>``, a list's values ``<item>`` elements), the
    tags apart by its separator token."""
    text = inner.replace(MINIMAX_SEP, "")
    calls = []
    at = 0
    while (head := re.compile(r'\s*<invoke name="([^"]*)">').match(text, at)) is not None:
        name = head.group(1)
        schema = {"properties": (ctx.schemas.get(name) or {}).get("properties") or {}}
        found = _element_value(text, head.end(), "invoke", schema)
        if isinstance(found, str):
            return found
        calls.append(Written(name, found[0] if isinstance(found[0], dict) else {}))
        at = found[1]
    if text[at:].strip() or not calls:
        return "not an <invoke> call"
    return tuple(calls)
