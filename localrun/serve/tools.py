"""OpenAI's tools on /v1/chat/completions: the request's `tools` and
`tool_choice` as functions and a constraint, the conversation's tool calls
and results as the chat template takes them, and the reply's calls (whole,
or as a stream that holds back only what may be the start of a call)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from localrun.errors import InvalidRequestError
from localrun.structured.tools import (
    Call,
    CallFormat,
    Choice,
    Function,
    call_format,
    could_start,
    find_start,
    parse_calls,
    takes_tools,
    tools_prompt,
)


@dataclass(frozen=True)
class ToolUse:
    """What a request with tools asks for: ``choice`` None is `none` (no call can be made)."""

    functions: list[Function]  # the ones the reply may call (one, for a named function)
    declared: list[dict[str, Any]]  # every tool, as the template is given them
    fmt: CallFormat
    choice: Choice | None
    parallel: bool
    native: bool  # whether the chat template takes tools itself


def _function(tool: Any, index: int) -> Function:
    where = f"tools.{index}"
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise InvalidRequestError(f"{where}: a tool is {{'type': 'function', 'function': {{...}}}}", "tools")
    body = tool["function"]
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequestError(f"{where}.function.name: a function needs a name", "tools")
    parameters = body.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise InvalidRequestError(f"function {name!r}: parameters must be a JSON Schema object", "tools")
    return Function(name, parameters, str(body.get("description") or ""))


def tool_use(
    tools: list[Any] | None, tool_choice: str | dict[str, Any] | None, parallel: bool | None, template: str | None
) -> ToolUse | None:
    """The request's tools, or None when it has none (today's path); an unusable field is a 400 naming it."""
    if not tools:
        if tool_choice not in (None, "none", "auto"):
            raise InvalidRequestError("tool_choice needs tools", "tool_choice")
        return None
    functions = [_function(t, i) for i, t in enumerate(tools)]
    names = [f.name for f in functions]
    if len(set(names)) != len(names):
        raise InvalidRequestError("tools: two functions have the same name", "tools")
    choice: Choice | None
    chosen = functions
    if tool_choice in (None, "auto"):
        choice = "auto"
    elif tool_choice == "none":
        choice = None
    elif tool_choice == "required":
        choice = "required"
    elif isinstance(tool_choice, dict) and isinstance(tool_choice.get("function"), dict):
        name = tool_choice["function"].get("name")
        chosen = [f for f in functions if f.name == name]
        if not chosen:
            raise InvalidRequestError(f"tool_choice: no tool is named {name!r}", "tool_choice")
        choice = "required"
    else:
        raise InvalidRequestError("tool_choice: none, auto, required or {'type': 'function', ...}", "tool_choice")
    native = takes_tools(template)
    return ToolUse(chosen, tools, call_format(template if native else None), choice, parallel is not False, native)


# ---------------------------------------------------------- the prompt --


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def render_call(fmt: CallFormat, name: str, arguments: Any) -> str:
    """A past call as this family writes it (for templates that take no tools)."""
    return fmt.each + json.dumps({"name": name, fmt.key: arguments}, ensure_ascii=False) + fmt.after_each


def conversation(messages: list[dict[str, Any]], use: ToolUse | None) -> list[dict[str, Any]]:
    """The messages as the template takes them: calls and results as its own
    fields where it takes tools, else as Hermes-style text, with the tools
    described in the system prompt."""
    out: list[dict[str, Any]] = []
    native = use is None or use.native
    for m in messages:
        calls = m.get("tool_calls") or []
        if m["role"] == "assistant" and calls:
            if native:
                converted = [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {
                            "name": c["function"]["name"],
                            "arguments": _arguments(c["function"]["arguments"]),
                        },
                    }
                    for c in calls
                ]
                out.append({"role": "assistant", "content": m["content"], "tool_calls": converted})
            else:
                assert use is not None
                text = "\n".join(
                    render_call(use.fmt, c["function"]["name"], _arguments(c["function"]["arguments"])) for c in calls
                )
                out.append({"role": "assistant", "content": (m["content"] + "\n" if m["content"] else "") + text})
        elif m["role"] == "tool" and not native:
            out.append({"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"})
        else:
            out.append({k: v for k, v in m.items() if k != "tool_calls" or v})
    if use is not None and not native and use.choice is not None:
        described = tools_prompt([_function(t, i) for i, t in enumerate(use.declared)])
        if out and out[0]["role"] == "system":
            out[0] = out[0] | {"content": out[0]["content"] + "\n\n" + described}
        else:
            out.insert(0, {"role": "system", "content": described})
    return out


# ----------------------------------------------------------- the reply --


def call_objects(calls: list[Call]) -> list[dict[str, Any]]:
    """OpenAI's `message.tool_calls`, each with an id of its own."""
    return [
        {
            "id": "call_" + uuid.uuid4().hex[:24],
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
        }
        for c in calls
    ]


def split_reply(text: str, use: ToolUse | None) -> tuple[str, list[Call]]:
    """(the content, the calls) of a finished reply."""
    if use is None or use.choice is None:
        return text, []
    content, calls = parse_calls(text, use.fmt, use.functions)
    return content, calls if use.parallel else calls[:1]


class ToolStream:
    """A reply's content as it streams: text that may begin a call is held
    back until it does (then the rest is the call's) or cannot."""

    def __init__(self, use: ToolUse) -> None:
        self.use = use
        self.text = ""
        self.sent = 0
        self.calling = use.choice == "required"

    def feed(self, piece: str) -> str:
        """The content that can go out now."""
        self.text += piece
        if self.calling:
            return ""
        start = find_start(self.text, self.use.fmt)
        if start >= 0:
            self.calling = True
            return self._send(start)
        tail = self.text[self.sent :]
        if self.use.fmt.leading and not self.text.strip():
            return ""
        return self._send(self.sent + could_start(tail, self.use.fmt))

    def _send(self, upto: int) -> str:
        out = self.text[self.sent : upto] if upto > self.sent else ""
        self.sent = max(self.sent, upto)
        return out

    def finish(self) -> tuple[str, list[Call]]:
        """(the content not sent yet, the calls)."""
        content, calls = split_reply(self.text, self.use)
        return content[self.sent :], calls
