"""What the output must be: `--schema` and `--grammar`, parsed and checked
before the model loads (an unusable one is a usage error naming the problem).

The concise schema form, for quick use: comma-separated fields, each a name
and an optional type (``str`` by default): ``str``, ``int``, ``float``,
``bool``, ``list[T]`` of one of those, or a choice ``a|b|c``. For example
``'name, age int, tags list[str], kind cat|dog'``. Every field is required
and no other field is allowed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from localrun.errors import UsageError
from localrun.paths import why_failed
from localrun.units import json_error

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

_SCALARS = {"str": "string", "string": "string", "int": "integer", "float": "number", "bool": "boolean"}
_FIELD = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:\s+(\S.*))?$")
_LIST = re.compile(r"^list\[(\w+)\]$")
# JSON on one line, laid out as Python's json.dumps lays it out: with no choice of
# whitespace the grammar decides every key and separator (jump-forward takes them
# without a sampling step); a schema's own "x-guidance" options take precedence
JSON_LAYOUT: JsonCompileOptions = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


@dataclass(frozen=True)
class OutputSpec:
    kind: Literal["json_schema", "grammar"]
    grammar: str  # llguidance's grammar (a JSON document)
    schema: dict[str, Any] | None = None  # to validate the result against (JSON Schema only)
    source: str = ""  # where it came from, for messages
    whole: bool = False  # the grammar covers the whole output, thinking included (not only the answer)


def _type(name: str, text: str) -> dict[str, Any]:
    if text in _SCALARS:
        return {"type": _SCALARS[text]}
    listed = _LIST.match(text)
    if listed and listed.group(1) in _SCALARS:
        return {"type": "array", "items": {"type": _SCALARS[listed.group(1)]}}
    if "|" in text and all(part.strip() for part in text.split("|")):
        return {"enum": [part.strip() for part in text.split("|")]}
    raise UsageError(
        f"--schema: field {name!r} has an unknown type {text!r}",
        hint="use str, int, float, bool, list[T] or a|b|c (docs/structured.md)",
    )


def concise_schema(text: str) -> dict[str, Any]:
    """The concise form (see the module docstring) as a JSON Schema."""
    properties: dict[str, Any] = {}
    for raw in text.split(","):
        field = raw.strip()
        match = _FIELD.match(field)
        if not match:
            raise UsageError(f"--schema: {field!r} is not a field (a name, then an optional type)")
        name, kind = match.group(1), (match.group(2) or "str").strip()
        if name in properties:
            raise UsageError(f"--schema: field {name!r} is given twice")
        properties[name] = _type(name, kind)
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def _schema_document(value: str) -> tuple[dict[str, Any], str]:
    """(the schema, where it came from) for `--schema VALUE`."""
    text, source = value, "--schema"
    if not value.lstrip().startswith(("{", "[")):
        path = Path(value)
        if path.suffix == ".json" or path.is_file():
            try:
                text, source = path.read_text(encoding="utf-8"), str(path)
            except (OSError, UnicodeDecodeError) as exc:
                raise UsageError(f"--schema {value}: cannot read it: {why_failed(exc)}") from None
        else:
            return concise_schema(value), "--schema (concise form)"
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{source}: not valid JSON: {json_error(exc)}") from None
    if not isinstance(schema, dict):
        raise UsageError(f"{source}: a JSON Schema is an object")
    return schema, source


def _check_schema(schema: dict[str, Any], source: str) -> None:
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "the top level"
        raise UsageError(f"{source}: not a valid JSON Schema at {where}: {exc.message}") from None


def json_problem(schema: dict[str, Any], text: str) -> str | None:
    """Why ``text`` is not a JSON document that follows ``schema`` (None: it is),
    naming where in the document the first problem is."""
    import jsonschema

    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"not JSON: {json_error(exc)}"
    error = jsonschema.exceptions.best_match(jsonschema.validators.validator_for(schema)(schema).iter_errors(document))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"at {where}: {error.message}" if where else error.message


def _compiled(grammar: str, source: str) -> str:
    """Check ``grammar`` with llguidance (every keyword supported, every rule defined)."""
    import llguidance

    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, None)
    if is_error:
        raise UsageError(f"{source}: cannot be used: {'; '.join(messages)}")
    return grammar


def parse_schema(value: str) -> OutputSpec:
    schema, source = _schema_document(value)
    return schema_spec(schema, source)


def schema_spec(schema: dict[str, Any], source: str) -> OutputSpec:
    """A JSON Schema document (already parsed) as an OutputSpec."""
    import llguidance

    _check_schema(schema, source)
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
    except ValueError as exc:
        raise UsageError(f"{source}: cannot be used: {exc}") from None
    return OutputSpec("json_schema", _compiled(grammar, source), schema, source)


def parse_grammar(path: Path) -> OutputSpec:
    """A grammar file: GBNF as llama.cpp writes it (``root ::= ...``), else Lark."""
    import llguidance
    from llguidance.gbnf_to_lark import GbnfToLarkError, gbnf_to_lark

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--grammar {path}: cannot read it: {why_failed(exc)}") from None
    try:
        lark = gbnf_to_lark(text) if "::=" in text else text
    except (GbnfToLarkError, ValueError) as exc:
        raise UsageError(f"--grammar {path}: not a GBNF grammar: {exc}") from None
    except Exception as exc:  # the converter raises a bare Exception for an undefined rule
        raise UsageError(f"--grammar {path}: cannot be used: {exc}") from None
    return OutputSpec("grammar", _compiled(llguidance.LLMatcher.grammar_from_lark(lark), str(path)), None, str(path))


def response_format(value: Any, source: str = "response_format") -> OutputSpec | None:
    """OpenAI's ``response_format``: ``{"type": "text"}`` (None),
    ``{"type": "json_object"}`` (any JSON object) or ``{"type": "json_schema",
    "json_schema": {"schema": {...}}}``. Anything else is an error naming the field."""
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise UsageError(f"{source} must be an object with a 'type'")
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return schema_spec({"type": "object"}, source)
    if kind == "json_schema":
        body = value.get("json_schema")
        schema = body.get("schema") if isinstance(body, dict) else None
        if not isinstance(schema, dict):
            raise UsageError(f"{source}.json_schema.schema must be a JSON Schema object")
        return schema_spec(schema, f"{source}.json_schema")
    raise UsageError(f"{source}.type {kind!r} is not text, json_object or json_schema")
