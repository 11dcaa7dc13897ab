"""The input of `generate --batch`: one prompt per line, or JSON Lines objects.

The format is set by the first non-blank line: a line starting with `{` makes
the whole input JSON Lines, one object per line, `{"id", "prompt" or
"messages", and settings that override the command line}`. Otherwise every
non-blank line is a prompt, its id the line number. A line that cannot run
(bad JSON, an unknown key, a wrong type, no prompt, a repeated id) is kept,
with the reason, so the run can report it under its id and go on.

A JSON line with a `custom_id` is in OpenAI's Batch format (what `vllm
run-batch` reads): `{"custom_id", "method": "POST", "url":
"/v1/chat/completions" or "/v1/completions", "body": {the request}}`; its
result is written in the same format.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from localrun.errors import UsageError
from localrun.structured.spec import OutputSpec
from localrun.units import json_error

LineId = str | int

# per-line settings (each overrides the command-line option of the same name) and the type each must have
_INT, _NUMBER, _STR = ((int,), "an integer"), ((int, float), "a number"), ((str,), "a string")
SETTINGS: dict[str, tuple[tuple[type, ...], str]] = {
    "max_tokens": _INT,
    "temperature": _NUMBER,
    "top_p": _NUMBER,
    "top_k": _INT,
    "min_p": _NUMBER,
    "repeat_penalty": _NUMBER,
    "seed": _INT,
    "system": _STR,
}
KEYS = {"id", "prompt", "messages", "stop", "schema", "response_format", *SETTINGS}
OPENAI_KEYS = {"custom_id", "method", "url", "body"}
OPENAI_URLS = {"/v1/chat/completions": "messages", "/v1/completions": "prompt"}
# body fields taken (model: the command's -m decides), and those accepted at their neutral value only
OPENAI_BODY = {"model", "messages", "prompt", "stop", "response_format", "max_completion_tokens", *SETTINGS} - {
    "system"
}
OPENAI_NEUTRAL: dict[str, tuple[object, ...]] = {"n": (1,), "stream": (False,), "logprobs": (False,)}


@dataclass(frozen=True)
class BatchLine:
    """One input line, read: its id and what it asks for, or why it cannot run."""

    number: int  # 1-based line number in the input
    id: LineId
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    settings: dict[str, Any] = field(default_factory=dict)  # overrides of the command line's settings
    stop: tuple[str, ...] | None = None
    output: OutputSpec | None = None  # the line's schema or response_format
    error: str | None = None
    format: str = "localrun"  # or "openai": OpenAI's Batch format, in and out
    raw: bool = False  # the prompt as is, without the chat template (an OpenAI line to /v1/completions)


class _BadLine(Exception):
    pass


def _check(key: str, value: Any, kind: tuple[tuple[type, ...], str]) -> None:
    types, expected = kind
    if isinstance(value, bool) or not isinstance(value, types):
        raise _BadLine(f"{key!r} must be {expected}, not {json.dumps(value)}")


def _messages(value: Any) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise _BadLine("'messages' must be a non-empty list of {role, content} objects")
    out = []
    for m in value:
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise _BadLine("each message must be an object with string 'role' and 'content'")
        out.append({"role": m["role"], "content": m["content"]})
    if not any(m["content"].strip() for m in out):
        raise _BadLine("the messages are empty")
    return out


def _stop(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(value)
    raise _BadLine("'stop' must be a string or a list of strings")


def _output(obj: dict[str, Any]) -> OutputSpec | None:
    """The line's ``schema`` (a JSON Schema object, or a string as `--schema`
    takes it) or ``response_format`` (OpenAI's)."""
    from localrun.structured.spec import parse_schema, response_format, schema_spec

    if "schema" in obj and "response_format" in obj:
        raise _BadLine("give either 'schema' or 'response_format'")
    try:
        if "response_format" in obj:
            return response_format(obj["response_format"])
        if "schema" not in obj:
            return None
        value = obj["schema"]
        if isinstance(value, dict):
            return schema_spec(value, "'schema'")
        _check("schema", value, _STR)
        return parse_schema(value)
    except UsageError as exc:
        raise _BadLine(exc.message) from None


def _openai_body(body: Any, url: Any) -> dict[str, Any]:
    """An OpenAI Batch line's body as the keys of localrun's own line."""
    if url not in OPENAI_URLS:
        raise _BadLine(f"'url' must be one of {', '.join(sorted(OPENAI_URLS))}, not {json.dumps(url)}")
    if not isinstance(body, dict):
        raise _BadLine("'body' must be an object")
    for key, allowed in OPENAI_NEUTRAL.items():
        if key in body and body[key] not in allowed:
            raise _BadLine(f"body field {key!r} is not supported (only {json.dumps(allowed[0])})")
    unknown = sorted(set(body) - OPENAI_BODY - set(OPENAI_NEUTRAL))
    if unknown:
        raise _BadLine(f"body field {unknown[0]!r} is not supported")
    wanted = OPENAI_URLS[url]
    if wanted not in body:
        raise _BadLine(f"a {url} body needs {wanted!r}")
    fields = {k: v for k, v in body.items() if k in OPENAI_BODY and k != "model"}
    limit = fields.pop("max_completion_tokens", None)
    if limit is not None:
        fields["max_tokens"] = min(limit, fields.get("max_tokens", limit))
    if wanted == "messages" and isinstance(fields.get("messages"), list):
        fields["messages"] = [_text_message(m) for m in fields["messages"]]
    if wanted == "prompt" and "messages" in fields:
        raise _BadLine("a /v1/completions body takes 'prompt', not 'messages'")
    return fields


def _text_message(message: Any) -> Any:
    """A message whose content is a list of text parts, as one string; OpenAI's `developer` role as `system`."""
    if not isinstance(message, dict):
        return message
    content = message.get("content")
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        message = {**message, "content": "".join(str(p.get("text", "")) for p in content)}
    if message.get("role") == "developer":
        message = {**message, "role": "system"}
    return message


def _openai_line(number: int, obj: dict[str, Any]) -> BatchLine:
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return BatchLine(number, number, error="'custom_id' must be a non-empty string", format="openai")
    try:
        unknown = sorted(set(obj) - OPENAI_KEYS)
        if unknown:
            raise _BadLine(f"unknown key {unknown[0]!r} (known: {', '.join(sorted(OPENAI_KEYS))})")
        if obj.get("method", "POST") != "POST":
            raise _BadLine("'method' must be POST")
        fields = _openai_body(obj.get("body"), obj.get("url"))
    except _BadLine as exc:
        return BatchLine(number, custom_id, error=str(exc), format="openai")
    line = _object_line(number, json.dumps({"id": custom_id, **fields}))
    raw = obj.get("url") == "/v1/completions"
    return replace(line, format="openai", raw=raw)


def _object_line(number: int, text: str) -> BatchLine:  # noqa: C901, PLR0912  one check per key of a line
    line_id: LineId = number
    try:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise _BadLine(f"invalid JSON: {json_error(exc, line=False)}") from None
        if not isinstance(obj, dict):
            raise _BadLine("expected a JSON object")
        if "custom_id" in obj:
            return _openai_line(number, obj)
        if "id" in obj:
            if isinstance(obj["id"], bool) or not isinstance(obj["id"], str | int):
                raise _BadLine("'id' must be a string or an integer")
            line_id = obj["id"]
        unknown = sorted(set(obj) - KEYS)
        if unknown:
            raise _BadLine(f"unknown key {unknown[0]!r} (known: {', '.join(sorted(KEYS))})")
        if ("prompt" in obj) == ("messages" in obj):
            raise _BadLine("give either 'prompt' or 'messages'")
        prompt = obj.get("prompt")
        if prompt is not None:
            _check("prompt", prompt, _STR)
            if not prompt.strip():
                raise _BadLine("the prompt is empty")
        messages = _messages(obj["messages"]) if "messages" in obj else None
        settings: dict[str, Any] = {}
        for key, kind in SETTINGS.items():
            if key in obj and not (key == "seed" and obj[key] is None):
                _check(key, obj[key], kind)
                settings[key] = obj[key]
        if settings.get("max_tokens", 1) < 1:
            raise _BadLine("'max_tokens' must be at least 1")
        stop = _stop(obj["stop"]) if "stop" in obj else None
        output = _output(obj)
        return BatchLine(number, line_id, prompt=prompt, messages=messages, settings=settings, stop=stop, output=output)
    except _BadLine as exc:
        return BatchLine(number, line_id, error=str(exc))


def read_lines(lines: Iterable[str]) -> list[BatchLine]:
    """Parse the input; blank lines are skipped, a repeated id is an error for its later line."""
    out: list[BatchLine] = []
    json_lines: bool | None = None
    seen: set[LineId] = set()
    for number, raw in enumerate(lines, start=1):
        text = raw.rstrip("\r\n")
        if not text.strip():
            continue
        if json_lines is None:
            json_lines = text.lstrip().startswith("{")
        if not _is_utf8(text):
            line = BatchLine(number, number, error=f"line {number} is not UTF-8 text")
        else:
            line = _object_line(number, text) if json_lines else BatchLine(number, number, prompt=text)
        if line.error is None and line.id in seen:
            line = BatchLine(number, line.id, error=f"duplicate id {json.dumps(line.id)}")
        seen.add(line.id)
        out.append(line)
    return out


def _is_utf8(text: str) -> bool:
    """False for a line read with errors="surrogateescape" that held bytes UTF-8 does not allow."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def finished_ids(path: Path) -> set[LineId]:
    """The ids of the records already in a batch output file (unreadable lines are ignored)."""
    ids: set[LineId] = set()
    if not path.exists():
        return ids
    with path.open(encoding="utf-8", errors="replace") as f:
        for text in f:
            try:
                record = json.loads(text)
            except json.JSONDecodeError:
                continue  # a line cut short when the last run was killed
            if isinstance(record, dict) and isinstance(record.get("custom_id"), str):
                ids.add(record["custom_id"])  # OpenAI's Batch format
            elif isinstance(record, dict) and isinstance(record.get("id"), str | int):
                ids.add(record["id"])
    return ids
