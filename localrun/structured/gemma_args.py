"""Lark rules for a call's arguments in Gemma 4's notation,
``{key:<|"|>text<|"|>,n:1,list:[...]}``, from the function's JSON Schema:
an object's declared keys in the order Gemma's template writes them
(sorted), the required ones always; each value of its schema's type (a
string between ``<|"|>`` quotes, which is one special token in Gemma's
vocabulary); a value of no declared type any value of the notation. The
values' finer constraints (ranges, lengths) are the reader's to check."""

from __future__ import annotations

import json
from typing import Any

INTEGER = r"/-?(0|[1-9][0-9]*)/"
NUMBER = r"/-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?/"
KEY = r"/[A-Za-z_][A-Za-z0-9_.\-]*/"


class _Rules:
    def __init__(self, prefix: str, quote: str, quote_is_token: bool) -> None:
        self.prefix = prefix
        self.quote = quote  # the quote as a lark item
        self.quote_is_token = quote_is_token
        self.rules: list[str] = []
        self.count = 0

    def new(self) -> str:
        self.count += 1
        return f"{self.prefix}_{self.count}"

    def add(self, name: str, body: str) -> str:
        self.rules.append(f"{name}: {body}")
        return name

    def text(self, schema: Any = None) -> str:
        """A quoted string of the schema's length: any text up to the closing quote."""
        least = schema.get("minLength", 0) if isinstance(schema, dict) else 0
        most = schema.get("maxLength", "") if isinstance(schema, dict) else ""
        if self.quote_is_token:  # text never holds the token: the text runs up to it
            return f"{self.quote} /(.|\\n){{{least},{most}}}/ {self.quote}"
        return f"{self.quote} /[^<]{{{least},{most}}}/ {self.quote}"  # where the quote is text, no "<" in one

    def any_value(self) -> str:
        name = f"{self.prefix}_any"
        if not any(rule.startswith(name + ":") for rule in self.rules):
            self.add(
                name,
                f'{self.text()} | {NUMBER} | "true" | "false" | "null" | "[" ({name} ("," {name})*)? "]"'
                f' | "{{" ({KEY} ":" {name} ("," {KEY} ":" {name})*)? "}}"',
            )
        return name

    def value(self, schema: Any) -> str:  # noqa: C901, PLR0911  one way for each kind of schema
        if not isinstance(schema, dict):
            return self.any_value()
        options = schema.get("anyOf") or schema.get("oneOf")
        if isinstance(options, list) and options:
            return self.add(self.new(), " | ".join(self.value(o) for o in options))
        if "enum" in schema and isinstance(schema["enum"], list):
            return self.add(self.new(), " | ".join(self.literal(v) for v in schema["enum"]) or '""')
        if "const" in schema:
            return self.add(self.new(), self.literal(schema["const"]))
        kind = schema.get("type")
        if isinstance(kind, list):
            return self.add(self.new(), " | ".join(self.value(schema | {"type": k}) for k in kind))
        if kind == "string":
            return self.add(self.new(), self.text(schema))
        if kind == "integer":
            return INTEGER
        if kind == "number":
            return NUMBER
        if kind == "boolean":
            return '("true" | "false")'
        if kind == "null":
            return '"null"'
        if kind == "array":
            item = self.value(schema.get("items"))
            return self.add(self.new(), f'"[" ({item} ("," {item})*)? "]"')
        if kind == "object" or "properties" in schema:
            return self.object(schema)
        return self.any_value()

    def literal(self, value: Any) -> str:
        if isinstance(value, str):
            return f"{self.quote} {json.dumps(value)} {self.quote}"
        if isinstance(value, bool) or value is None:
            return json.dumps(json.dumps(value))
        if isinstance(value, int | float):
            return json.dumps(json.dumps(value))
        return self.any_value()

    def object(self, schema: dict[str, Any]) -> str:
        """``{k:v,...}``: the declared keys sorted, each optional one left out or written."""
        properties = schema.get("properties") or {}
        if not properties:
            return self.add(
                self.new(), f'"{{" ({KEY} ":" {self.any_value()} ("," {KEY} ":" {self.any_value()})*)? "}}"'
            )
        required = set(schema.get("required") or [])
        items = [(f"{json.dumps(k + ':')} {self.value(properties[k])}", k in required) for k in sorted(properties)]
        name = self.new()
        rules, listed = separated(name, items, '","')
        self.rules += rules
        return self.add(name, f'"{{" {listed} "}}"')


def separated(name: str, items: list[tuple[str, bool]], sep: str) -> tuple[list[str], str]:
    """``items`` (each a lark expression, and whether it is required) in
    their order, each optional one written or left out, ``sep`` (a lark
    item) between those written: the rules it takes (named ``NAME_tI``) and
    the lark expression."""
    # tail_i: the items from i on, each after a separator; the first written item takes none
    tails = [f"{name}_t{i}" for i in range(len(items) + 1)]
    rules = [f'{tails[-1]}: ""']
    for i in range(len(items) - 1, -1, -1):
        item, needed = items[i]
        after = f"{sep} {item} {tails[i + 1]}"
        rules.append(f"{tails[i]}: {after if needed else f'{after} | {tails[i + 1]}'}")
    heads = []
    for i, (item, needed) in enumerate(items):
        heads.append(f"{item} {tails[i + 1]}")
        if needed:
            break
    else:
        heads.append('""')
    return rules, f"({' | '.join(heads)})"


def gemma_rules(schema: dict[str, Any], rule: str, quote: str, *, quote_is_token: bool) -> list[str]:
    """Rules whose rule ``rule`` is arguments of ``schema`` (an object) in
    Gemma's notation; ``quote`` is its string quote as a lark item."""
    rules = _Rules(rule, quote, quote_is_token)
    top = rules.object(schema if "properties" in schema else {"type": "object"})
    return [*rules.rules, f"{rule}: {top}"]
