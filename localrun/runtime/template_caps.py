"""What a chat template supports, found as llama.cpp finds it (common/jinja/caps.cpp):
by rendering small probe conversations and watching which values the template used.
llama.cpp adapts the conversation to the answers (``template_input``)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from jinja2 import TemplateError

from localrun.chatformat.thinking import THINKING_MARKERS
from localrun.runtime.jinja_env import Tracked, render, tracked


@dataclass(frozen=True)
class TemplateCaps:
    tools: bool = True  # describes the tools offered
    tool_calls: bool = True  # renders an assistant's tool calls
    system_role: bool = True
    parallel_tool_calls: bool = True
    preserve_reasoning: bool = False  # keeps reasoning_content of earlier turns
    reasoning_effort: bool = False
    string_content: bool = True
    typed_content: bool = False  # takes content as a list of parts
    object_arguments: bool = False  # reads tool-call arguments as an object


@dataclass
class _Probe:
    ok: bool
    output: str
    context: dict[str, Any]


def _run(source: str, messages: list[Any], tools: list[Any] | None = None, **extra: object) -> _Probe:
    context = {
        "messages": tracked(messages),
        "tools": tracked(tools or []),
        "bos_token": "",
        "eos_token": "",
        "add_generation_prompt": True,
        **extra,
    }
    if context["add_generation_prompt"] is False:
        del context["add_generation_prompt"]  # as llama.cpp leaves it: undefined
    try:
        return _Probe(True, render(source, context), context)
    except (TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError, ArithmeticError):
        return _Probe(False, "", context)


def _at(value: Any, *path: str | int) -> Any:
    for key in path:
        value = value[key]
    return value


def _used(value: Any) -> bool:
    return isinstance(value, Tracked) and value.used


def _ops(value: Any) -> set[str]:
    return value.ops if isinstance(value, Tracked) else set()


_TOOLS = [
    {
        "name": "tool",
        "type": "function",
        "function": {
            "name": "tool1",
            "description": "Tool description",
            "parameters": {
                "type": "object",
                "properties": {"arg": {"type": "string", "description": "Arg description"}},
                "required": ["arg"],
            },
        },
    }
]


def _tool_conversation(arguments: Any, calls: int = 1) -> list[Any]:
    return [
        {"role": "user", "content": "User message"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": f"call0000{n + 1}", "type": "function", "function": {"name": "tool1", "arguments": arguments}}
                for n in range(calls)
            ],
        },
        {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
        {"role": "assistant", "content": "The tool response was 'tool response'"},
        {"role": "user", "content": "User message"},
    ]


def _content_caps(source: str) -> dict[str, bool]:
    found: dict[str, bool] = {}
    marker = "STRING_MARKER"
    probe = _run(source, [{"role": "user", "content": marker}])
    content = _at(probe.context["messages"], 0, "content")
    as_array = bool(_ops(content) & {"selectattr", "array_access"})
    if as_array:
        found["typed_content"] = True
    if not probe.ok or (as_array and marker not in probe.output):
        found["string_content"] = False
    if "test_is_string" in _ops(content):
        probe = _run(source, [{"role": "user", "content": []}])
        content = _at(probe.context["messages"], 0, "content")
        if probe.ok and _ops(content) & {"selectattr", "array_access"}:
            found["typed_content"] = True
    return found


def _tool_caps(source: str) -> dict[str, bool]:
    found: dict[str, bool] = {}
    probe = _run(source, _tool_conversation({"arg": "value"}), _TOOLS)
    if probe.ok:
        if not _used(_at(probe.context["tools"], 0, "function", "name")):
            found["tools"] = False
        calls = _at(probe.context["messages"], 1, "tool_calls")
        if not _used(calls):
            found["tool_calls"] = False
        elif _used(_at(calls, 0, "function", "arguments", "arg")):
            found["object_arguments"] = True
    if not found.get("object_arguments"):
        probe = _run(source, _tool_conversation('{"arg": "value"}'), _TOOLS)
        if not probe.ok:
            found["tool_calls"] = found["tools"] = False
        else:
            if not _used(_at(probe.context["tools"], 0, "function", "name")):
                found["tools"] = False
            if not _used(_at(probe.context["messages"], 1, "tool_calls")):
                found["tool_calls"] = False
    arguments: Any = {"arg": "value"} if found.get("object_arguments") else '{"arg": "value"}'
    probe = _run(source, _tool_conversation(arguments, calls=2), _TOOLS)
    if not probe.ok or not _used(_at(probe.context["messages"], 1, "tool_calls", 1, "function")):
        found["parallel_tool_calls"] = False
    return found


def _reasoning_caps(source: str) -> dict[str, bool]:
    found: dict[str, bool] = {}
    placeholder = "<REASONING_CONTENT_PLACEHOLDER>"
    turns = [
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "Assistant message", "reasoning_content": placeholder},
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "Assistant message", "reasoning_content": "Reasoning content"},
        {"role": "user", "content": "User message"},
    ]
    switches: dict[str, object] = {"enable_thinking": True, **preserve_reasoning_switches(True)}
    probe = _run(source, turns, None, **switches)
    if placeholder in probe.output:
        found["preserve_reasoning"] = True
    effort = tracked("low")
    _run(
        source,
        [{"role": "user", "content": "User message"}],
        enable_thinking=True,
        reasoning_effort=effort,
        reasoning_strength=effort,
    )
    found["reasoning_effort"] = _used(effort)
    return found


def preserve_reasoning_switches(enabled: bool) -> dict[str, bool]:
    """The names templates use for keeping earlier turns' reasoning, as llama.cpp sets them."""
    return {
        "preserve_thinking": enabled,
        "clear_thinking": not enabled,
        "truncate_history_thinking": not enabled,
        "drop_thinking": not enabled,
    }


@functools.lru_cache(maxsize=128)
def template_caps(source: str) -> TemplateCaps:
    """What the template ``source`` supports (cached per template)."""
    found = _content_caps(source)
    probe = _run(source, [{"role": "system", "content": "System message"}, {"role": "user", "content": "User message"}])
    if not _used(_at(probe.context["messages"], 0, "content")):
        found["system_role"] = False
    found.update(_tool_caps(source))
    found.update(_reasoning_caps(source))
    return TemplateCaps(**found)


@functools.lru_cache(maxsize=128)
def supports_thinking(source: str) -> bool:
    """Whether the template writes a reasoning section (llama-server turns
    ``enable_thinking`` on by default for these, off for the rest): it shows an
    assistant's ``reasoning_content``, or its generation prompt opens or closes one."""
    placeholder = "<REASONING_CONTENT_PLACEHOLDER>"
    turns = [
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "Assistant message", "reasoning_content": placeholder},
    ]
    switches: dict[str, object] = {"enable_thinking": True, **preserve_reasoning_switches(True)}
    if placeholder in _run(source, turns, None, **switches, add_generation_prompt=False).output:
        return True
    user = [{"role": "user", "content": "User message"}]
    bare = _run(source, user, None, enable_thinking=True, add_generation_prompt=False).output
    opened = {t: _run(source, user, None, enable_thinking=t).output for t in (True, False)}
    tails = [text.removeprefix(bare) for text in opened.values()]
    if opened[True] != opened[False]:  # a switch that writes a reasoning section's markers
        same = next((i for i, (a, b) in enumerate(zip(*opened.values(), strict=False)) if a != b), 0)
        tails += [text[same:] for text in opened.values()]
    return any(m in tail for tail in tails for m in THINKING_MARKERS)
