"""What a chat template sees: an OpenAI-style conversation and tool list
brought into the shape llama.cpp's ``--jinja`` renderer gives its templates
(common/chat.cpp), so that localrun renders every template as llama-server does.

The steps, in llama.cpp's order: each message rebuilt with its fields in a
fixed order (content always a string, or text parts; tool-call arguments a
JSON string); the content made a string or a list of parts as the template
expects; ``developer`` made ``system``; a system message merged into the next
one where the template ignores the system role; tool-call arguments given as
strings parsed into objects where the template reads them as objects; and
what the template's family wants of its own (`localrun.chatformat`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from localrun.chatformat import ChatFormat
from localrun.chatformat.messages import trimmed
from localrun.errors import UsageError
from localrun.runtime.template_caps import TemplateCaps

Json = dict[str, Any]


def _fail(message: str) -> UsageError:
    return UsageError(f"the conversation cannot be rendered: {message}")


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise _fail(f"{what} must be a string")
    return value


def _parts(content: list[Any]) -> list[Json]:
    parts: list[Json] = []
    for part in content:
        if not isinstance(part, Mapping) or "type" not in part:
            raise _fail(f"a content part without a type: {json.dumps(part)}")
        if part["type"] not in ("text", "media_marker"):
            raise _fail(f"unsupported content part type {part['type']!r}")
        parts.append({"type": part["type"], "text": _text(part.get("text"), "a content part's text")})
    return parts


def _tool_call(call: Any) -> Json:
    if not isinstance(call, Mapping) or call.get("type") != "function" or not isinstance(call.get("function"), Mapping):
        raise _fail(f"a tool call must be a function call: {json.dumps(call, default=str)}")
    function = call["function"]
    if "name" not in function:
        raise _fail("a tool call without a name")
    arguments = function.get("arguments")
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    result: Json = {"type": "function", "function": {"name": _text(function["name"], "a tool name"), "arguments": text}}
    if call.get("id"):
        result["id"] = call["id"]
    return result


def message_fields(message: Mapping[str, Any]) -> Json:
    """One message as llama.cpp passes it on: ``role``, ``content`` (a string,
    ``""`` when absent or null, or text parts), then ``reasoning_content``,
    ``name``, ``tool_call_id`` and ``tool_calls`` where they are not empty."""
    if "role" not in message:
        raise _fail("a message without a role")
    if "content" not in message and "tool_calls" not in message:
        raise _fail("a message needs content or tool_calls")
    content = message.get("content")
    out: Json = {"role": message["role"]}
    if isinstance(content, list) and content:
        out["content"] = _parts(content)
    elif content is None or content == [] or isinstance(content, str):
        out["content"] = content or ""
    else:
        raise _fail("content must be a string or a list of parts")
    if message.get("reasoning_content"):
        out["reasoning_content"] = _text(message["reasoning_content"], "reasoning_content")
    if message.get("name"):
        out["name"] = _text(message["name"], "a message's name")
    if message.get("tool_call_id"):
        out["tool_call_id"] = _text(message["tool_call_id"], "tool_call_id")
    if message.get("tool_calls"):
        out["tool_calls"] = [_tool_call(call) for call in message["tool_calls"]]
    return out


def tool_fields(tools: Sequence[Mapping[str, Any]] | None) -> list[Json]:
    """OpenAI tool objects as templates see them: ``type``, and a function's
    ``name``, ``description`` (``""`` if none) and ``parameters`` (``{}``)."""
    result: list[Json] = []
    for tool in tools or ():
        function = tool.get("function")
        if tool.get("type") != "function" or not isinstance(function, Mapping) or "name" not in function:
            raise _fail(f"unsupported tool: {json.dumps(tool, default=str)}")
        result.append(
            {
                "type": "function",
                "function": {
                    "name": function["name"],
                    "description": function.get("description", ""),
                    "parameters": function.get("parameters", {}),
                },
            }
        )
    return result


def _joined_parts(parts: list[Json]) -> str:
    """Text parts joined by newlines, none next to a media marker."""
    text = ""
    after_marker = False
    for part in parts:
        if part.get("type") == "text":
            if text and not after_marker:
                text += "\n"
            after_marker = False
        elif part.get("type") == "media_marker":
            after_marker = True
        else:
            continue
        text += str(part.get("text", ""))
    return text


def _content_kind(messages: list[Json], caps: TemplateCaps) -> None:
    only_string = caps.string_content and not caps.typed_content
    only_typed = caps.typed_content and not caps.string_content
    for message in messages:
        content = message.get("content")
        if only_typed and isinstance(content, str):
            message["content"] = [{"type": "text", "text": content}]
        elif only_string and isinstance(content, list):
            message["content"] = _joined_parts(content)


def _merge_system(messages: list[Json]) -> None:
    if messages and messages[0].get("role") == "system":
        first = messages.pop(0)
        if messages:
            messages[0]["content"] = f"{first['content']}\n{messages[0]['content']}"


def _object_arguments(messages: list[Json]) -> None:
    for message in messages:
        for call in message.get("tool_calls", ()):
            arguments = call["function"].get("arguments")
            if isinstance(arguments, str):
                try:
                    call["function"]["arguments"] = json.loads(arguments)
                except json.JSONDecodeError as exc:
                    raise _fail(f"tool call arguments are not JSON: {exc}") from exc


def template_messages(
    messages: Sequence[Mapping[str, Any]], source: str, caps: TemplateCaps, fmt: ChatFormat
) -> list[Json]:
    """The conversation as the template ``source`` (with ``caps``, of format ``fmt``) gets it from llama.cpp."""
    prepared = [message_fields(m) for m in messages]
    if fmt.trims:
        prepared = [trimmed(m) for m in prepared]
    _content_kind(prepared, caps)
    if not fmt.keeps_developer:
        for message in prepared:
            if message["role"] == "developer":
                message["role"] = "system"
    if not caps.system_role:
        _merge_system(prepared)
    if caps.object_arguments:
        _object_arguments(prepared)
    return fmt.prepare(prepared, source)
