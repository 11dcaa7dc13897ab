"""What a chat template sees: an OpenAI-style conversation and tool list
brought into the shape llama.cpp's ``--jinja`` renderer gives its templates
(common/chat.cpp), so that localrun renders every template as llama-server does.

The steps, in llama.cpp's order: each message rebuilt with its fields in a
fixed order (content always a string, or text parts; tool-call arguments a
JSON string); the content made a string or a list of parts as the template
expects; ``developer`` made ``system``; a system message merged into the next
one where the template ignores the system role; tool-call arguments given as
strings parsed into objects where the template reads them as objects; and the
few families whose templates want their own fields (gpt-oss and LFM2's
``thinking``, Ministral's content blocks, Gemma 4's tool responses, DeepSeek
V4's tool results in call order)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

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


def _trimmed(message: Json) -> Json:
    """StepFun's templates get their contents without surrounding whitespace."""
    if isinstance(message.get("content"), str):
        message["content"] = message["content"].strip(" \t\n\r")
    elif isinstance(message.get("content"), list):
        for part in message["content"]:
            if part["type"] == "text":
                part["text"] = part["text"].strip(" \t\n\r")
    if "reasoning_content" in message:
        message["reasoning_content"] = message["reasoning_content"].strip(" \t\n\r")
        if not message["reasoning_content"]:
            del message["reasoning_content"]
    return message


def template_messages(messages: Sequence[Mapping[str, Any]], source: str, caps: TemplateCaps) -> list[Json]:
    """The conversation as the template ``source`` (with ``caps``) gets it from llama.cpp."""
    prepared = [message_fields(m) for m in messages]
    if "You have access to the following functions in JSONSchema format" in source:
        prepared = [_trimmed(m) for m in prepared]
    _content_kind(prepared, caps)
    if "<|channel|>" not in source:
        for message in prepared:
            if message["role"] == "developer":
                message["role"] = "system"
    if not caps.system_role:
        _merge_system(prepared)
    if caps.object_arguments:
        _object_arguments(prepared)
    return family_messages(prepared, source)


_FAMILIES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    # llama.cpp's specialized handlers in the order it tries them: (family, all of, none of)
    ("ministral3", ("[SYSTEM_PROMPT]", "[TOOL_CALLS]", "[ARGS]"), ("[CALL_ID]",)),
    ("gpt-oss", ("<|channel|>",), ()),
    ("muse-glimmer", ("<atem:function_calls>", "<|eom|>"), ()),
    ("functionary-v3.2", (">>>all", ">>>${recipient}"), ()),
    ("kimi-k2", ("<|tool_calls_section_begin|>", "<|tool_call_begin|>"), ()),
    ("kimi-k3", ("<|open|>", "<|close|>", "<|end_of_msg|>"), ()),
    ("ling3", ("<role>ASSISTANT</role>", "<arg_key>"), ()),
    ("cohere2moe", ("<|START_TEXT|>", "<|START_ACTION|>"), ()),
    ("lfm2", ("<|tool_list_start|>", "<|tool_list_end|>"), ()),
    ("lfm2.5", ("List of tools: [",), ("<|tool_list_start|>",)),
    ("gigachat-v3", ("<|role_sep|>", "<|message_sep|>"), ("<|function_call|>",)),
    ("minimax-m3", ("]<]minimax[>[", "<tool_call>", "<invoke name="), ()),
    ("deepseek-v3.2", ("dsml_token", "DSML"), ()),
    ("gemma4", ("'<|tool_call>call:'",), ()),
    ("minicpm5", ("Tool usage guidelines:", '<function name="', '<param name="'), ()),
    ("qwen3-coder", ("<tool_call>", "<function=", "<parameter="), ("'<tool_call><function=' ~ tool_call.name ~ '>'",)),
)


def template_family(source: str) -> str | None:
    """The family llama.cpp gives a template its own handler for, if any."""
    for name, present, absent in _FAMILIES:
        if all(m in source for m in present) and not any(m in source for m in absent):
            if name == "deepseek-v3.2" and "function_calls" not in source and "tool_calls" not in source:
                continue
            return name
    return None


def is_gpt_oss(source: str) -> bool:
    return template_family(source) == "gpt-oss"


def is_gemma4(source: str) -> bool:
    return template_family(source) == "gemma4"


def _thinking_field(messages: list[Json], *, without_content_for_calls: bool) -> list[Json]:
    """``reasoning_content`` copied to ``thinking``, the field gpt-oss and LFM2 templates read."""
    for m in messages:
        if isinstance(m.get("reasoning_content"), str):
            m["thinking"] = m["reasoning_content"]
            if without_content_for_calls and m.get("tool_calls"):
                m.pop("content", None)
    return messages


def family_messages(messages: list[Json], source: str) -> list[Json]:
    """The changes llama.cpp's handler for the template's family makes before rendering."""
    family = template_family(source)
    if family == "ministral3":
        return [_ministral_blocks(m) for m in messages]
    if family == "gpt-oss":
        return _thinking_field(messages, without_content_for_calls=True)
    if family in ("lfm2", "lfm2.5"):
        return _thinking_field(messages, without_content_for_calls=False)
    if family == "deepseek-v3.2" and "function_calls" not in source:  # V4 names its block tool_calls
        return _tool_results_in_call_order(messages)
    if family == "gemma4" and "{#- OpenAI Chat Completions:" not in source:
        return _gemma4_tool_responses(messages)
    return messages


def _ministral_blocks(message: Json) -> Json:
    if message.get("role") not in ("system", "assistant"):
        return message
    blocks: list[Json] = []
    if isinstance(message.get("reasoning_content"), str):
        blocks.append({"type": "thinking", "thinking": message["reasoning_content"]})
    content = message.get("content")
    if isinstance(content, str):
        blocks.append({"type": "text", "text": content})
    elif isinstance(content, list):
        blocks.extend(content)
    adjusted = dict(message)
    adjusted["content"] = blocks
    adjusted.pop("reasoning_content", None)
    return adjusted


def _tool_results_in_call_order(messages: list[Json]) -> list[Json]:
    """DeepSeek V4 renders a run of tool results in the order of the calls they answer."""
    order: dict[str, int] = {}
    i = 0
    while i < len(messages):
        role = messages[i].get("role")
        if role == "assistant" and messages[i].get("tool_calls"):
            order = {c["id"]: n for n, c in enumerate(messages[i]["tool_calls"]) if c.get("id")}
            i += 1
            continue
        if role not in ("user", "tool"):
            i += 1
            continue
        end = i
        while end < len(messages) and messages[end].get("role") in ("user", "tool"):
            end += 1
        positions = [p for p in range(i, end) if messages[p].get("role") == "tool"]
        if len(positions) > 1 and order:
            results = sorted((messages[p] for p in positions), key=lambda m: order.get(m.get("tool_call_id", ""), 0))
            for p, result in zip(positions, results, strict=True):
                messages[p] = result
        i = end
    return messages


def _gemma4_tool_responses(messages: list[Json]) -> list[Json]:
    """Older Gemma 4 templates take tool results inside the assistant turn that called them."""
    result: list[Json] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        if m.get("role") != "assistant" or not m.get("tool_calls"):
            result.append(m)
            i += 1
            continue
        calls = m["tool_calls"]
        responses: list[Json] = []
        i += 1
        while i < len(messages) and messages[i].get("role") == "tool":
            content = messages[i].get("content")
            response: Any = content
            if isinstance(content, str):
                try:
                    response = json.loads(content)
                except json.JSONDecodeError:
                    response = content
            name = calls[len(responses)]["function"].get("name", "") if len(responses) < len(calls) else ""
            responses.append({"name": name or messages[i].get("tool_call_id", ""), "response": response})
            i += 1
        turn: Json = {"role": "assistant", "tool_calls": calls}
        if responses:
            turn["tool_responses"] = responses
        answer = messages[i] if i < len(messages) else {}
        if answer.get("role") == "assistant" and not answer.get("tool_calls") and answer.get("content"):
            turn["content"] = answer["content"]  # the answer after the results joins the turn
            i += 1
        if isinstance(m.get("reasoning_content"), str):
            turn["reasoning_content"] = m["reasoning_content"]
        result.append(turn)
    return result
