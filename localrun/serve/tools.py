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
    scan,
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


def function_from(tool: Any, index: int) -> Function:
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
    functions = [function_from(t, i) for i, t in enumerate(tools)]
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
        described = tools_prompt([function_from(t, i) for i, t in enumerate(use.declared)])
        if out and out[0]["role"] == "system":
            out[0] = out[0] | {"content": out[0]["content"] + "\n\n" + described}
        else:
            out.insert(0, {"role": "system", "content": described})
    return out


# ----------------------------------------------------------- the reply --


def new_id() -> str:
    return uuid.uuid4().hex[:24]


def call_objects(calls: list[Call], ids: list[str] | None = None) -> list[dict[str, Any]]:
    """OpenAI's `message.tool_calls`, each with an id of its own; the
    arguments as the model wrote them."""
    ids = ids or [new_id() for _ in calls]
    return [
        {"id": "call_" + i, "type": "function", "function": {"name": c.name, "arguments": c.raw}}
        for c, i in zip(calls, ids, strict=False)
    ]


def split_reply(text: str, use: ToolUse | None) -> tuple[str, list[Call]]:
    """(the content, the calls) of a finished reply."""
    if use is None or use.choice is None:
        return text, []
    content, calls = parse_calls(text, use.fmt, use.functions)
    return content, calls if use.parallel else calls[:1]


@dataclass(frozen=True)
class CallDelta:
    """A piece of a call as it streams: the first one of a call has its id
    (without a prefix) and name; the others more of its arguments' text."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def openai(self) -> dict[str, Any]:
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        function = {"name": self.name, "arguments": self.arguments}
        return {"index": self.index, "id": "call_" + self.id, "type": "function", "function": function}


class ToolStream:
    """A reply as it streams: its content, with text that may begin a call
    held back until it does or cannot; then each call as it is written (its
    name once whole, then its arguments' text as it comes)."""

    def __init__(self, use: ToolUse) -> None:
        self.use = use
        self.text = ""
        self.sent = 0
        self.calling = use.choice == "required"
        self.names = frozenset(f.name for f in use.functions)
        self.pos = 0  # where the calls not finished yet are looked for
        self.ids: list[str] = []  # of the calls begun
        self.open = False  # whether the last call begun is still being written
        self.args_sent = 0  # its arguments' characters sent

    def feed(self, piece: str) -> tuple[str, list[CallDelta]]:
        """The content that can go out now, and the calls' new pieces."""
        self.text += piece
        content = ""
        if not self.calling:
            start, sure = find_start(self.text, self.use.fmt, self.names)
            if start >= 0:
                self.calling, self.pos = sure, start
                content = self._send(start)
            elif not (self.use.fmt.leading and not self.text.strip()):
                tail = self.text[self.sent :]
                content = self._send(self.sent + could_start(tail, self.use.fmt, first=not self.sent))
        return content, self._calls() if self.calling else []

    def _send(self, upto: int) -> str:
        out = self.text[self.sent : upto] if upto > self.sent else ""
        self.sent = max(self.sent, upto)
        return out

    def _calls(self) -> list[CallDelta]:
        out = []
        declared = {f.name for f in self.use.functions}
        for piece in scan(self.text, self.pos):
            if piece.name not in declared:
                break
            if not self.open:
                if self.ids and not self.use.parallel:
                    break
                self.ids.append(new_id())
                self.args_sent, self.open = 0, True
                out.append(CallDelta(len(self.ids) - 1, self.ids[-1], piece.name))
            end = piece.end if piece.end >= 0 else len(self.text)
            more = self.text[piece.start + self.args_sent : end]
            if more:
                out.append(CallDelta(len(self.ids) - 1, arguments=more))
                self.args_sent += len(more)
            if piece.end < 0:
                break
            self.pos, self.open = piece.end, False
        return out

    def finish(self) -> tuple[str, list[Call]]:
        """(the content not sent yet, the calls, validated)."""
        content, calls = split_reply(self.text, self.use)
        return content[self.sent :], calls
