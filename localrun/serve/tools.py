"""OpenAI's tools on /v1/chat/completions: the request's `tools` and
`tool_choice` as functions and a constraint, the conversation's tool calls
and results as the chat template takes them, and the reply's calls in its
model family's own format (whole, or as a stream that holds back a call
until it is whole, and only what may be the start of one)."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localrun import chatformat
from localrun.errors import InvalidRequestError
from localrun.structured.toolcalls.families import HERMES, Family
from localrun.structured.toolcalls.split import Memo, Split, split
from localrun.structured.tools import Call, Choice, Function, takes_tools, tools_prompt


@dataclass(frozen=True)
class ToolUse:
    """What a request with tools asks for: ``choice`` None is `none` (no call can be made)."""

    functions: list[Function]  # the ones the reply may call (one, for a named function)
    declared: list[dict[str, Any]]  # every tool, as the template is given them
    family: Family
    choice: Choice | None
    parallel: bool
    native: bool  # whether the chat template takes tools itself
    warn: Callable[[str], None] | None = None  # hears of each call left as text, and why

    def note(self, found: Split) -> None:
        if self.warn is not None:
            for problem in found.problems:
                self.warn(problem)


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
    """The request's tools, or None when it has none (today's path); an unusable field is a 400 naming it.
    Several calls in one reply only where the request asks for them
    (``parallel`` True), as llama-server: given the choice, a small model
    goes on calling (a city after another) until its context is full."""
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
    fmt = chatformat.of(template if native else None)
    return ToolUse(chosen, tools, fmt.tools, choice, parallel is True, native)


# ---------------------------------------------------------- the prompt --


def call_arguments(given: Any) -> Any:
    """A call's arguments as JSON values: its JSON text parsed (text that is
    not JSON stays as it is; arguments given as values already, as they are)."""
    if not isinstance(given, str):
        return given
    try:
        return json.loads(given)
    except json.JSONDecodeError:
        return given


def render_call(name: str, arguments: Any) -> str:
    """A past call in Hermes' words (for templates that take no tools: the way their tools are described)."""
    return HERMES.each + json.dumps({"name": name, HERMES.key: arguments}, ensure_ascii=False) + HERMES.after_each


def short_id(call_id: str) -> str:
    """A call's id as Mistral's templates demand it: nine letters and digits
    (the same for the call and its result)."""
    return call_id if len(call_id) == 9 and call_id.isalnum() else hashlib.sha256(call_id.encode()).hexdigest()[:9]


def conversation(messages: list[dict[str, Any]], use: ToolUse | None) -> list[dict[str, Any]]:
    """The messages as the template takes them: calls and results as its own
    fields where it takes tools, else as Hermes-style text, with the tools
    described in the system prompt."""
    out: list[dict[str, Any]] = []
    native = use is None or use.native
    short = use is not None and use.family.short_ids
    for m in messages:
        calls = m.get("tool_calls") or []
        if m["role"] == "assistant" and calls:
            if native:
                converted = [
                    {
                        "id": short_id(c["id"]) if short else c["id"],
                        "type": "function",
                        "function": {
                            "name": c["function"]["name"],
                            "arguments": call_arguments(c["function"]["arguments"]),
                        },
                    }
                    for c in calls
                ]
                out.append({"role": "assistant", "content": m["content"], "tool_calls": converted})
            else:
                assert use is not None
                text = "\n".join(
                    render_call(c["function"]["name"], call_arguments(c["function"]["arguments"])) for c in calls
                )
                out.append({"role": "assistant", "content": (m["content"] + "\n" if m["content"] else "") + text})
        elif m["role"] == "tool" and not native:
            out.append({"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"})
        elif m["role"] == "tool" and short and m.get("tool_call_id"):
            out.append(m | {"tool_call_id": short_id(m["tool_call_id"])})
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
    """(the content, the calls) of a finished reply; what could not be read as a call stays content."""
    if use is None or use.choice is None:
        return text, []
    found = split(text, use.family, use.functions)
    use.note(found)
    return _content(found, use), found.calls if use.parallel else found.calls[:1]


def _content(found: Split, use: ToolUse) -> str:
    """A reply's content: none where the calls were required (the grammar
    allows nothing else, so what is left is a call cut short by the length
    limit, which is no content)."""
    return "" if use.choice == "required" else found.content


@dataclass(frozen=True)
class CallDelta:
    """A call as it streams: whole, with its id (without a prefix), name and arguments."""

    index: int
    id: str
    name: str
    arguments: str

    def openai(self) -> dict[str, Any]:
        function = {"name": self.name, "arguments": self.arguments}
        return {"index": self.index, "id": "call_" + self.id, "type": "function", "function": function}


class ToolStream:
    """A reply as it streams: its content, with text that may begin a call
    held back until it does or cannot; each call once it is whole and checked."""

    def __init__(self, use: ToolUse) -> None:
        self.use = use
        self.text = ""
        self.sent = 0  # characters of the content sent
        self.ids: list[str] = []  # of the calls sent
        self.memo: Memo = {}  # the calls' checks, kept from one split of the reply to the next

    def feed(self, piece: str) -> tuple[str, list[CallDelta]]:
        """The content that can go out now, and the calls finished since."""
        self.text += piece
        return self._out(split(self.text, self.use.family, self.use.functions, final=False, memo=self.memo))

    def _out(self, found: Split) -> tuple[str, list[CallDelta]]:
        whole = _content(found, self.use)
        content = whole[self.sent :]
        self.sent = max(self.sent, len(whole))
        calls = found.calls if self.use.parallel else found.calls[:1]
        deltas = []
        for call in calls[len(self.ids) :]:
            self.ids.append(new_id())
            deltas.append(CallDelta(len(self.ids) - 1, self.ids[-1], call.name, call.raw))
        return content, deltas

    def finish(self) -> tuple[str, list[CallDelta], list[Call]]:
        """(the content not sent yet, the calls not sent yet, all the calls)."""
        found = split(self.text, self.use.family, self.use.functions, memo=self.memo)
        self.use.note(found)
        content, deltas = self._out(found)
        return content, deltas, found.calls if self.use.parallel else found.calls[:1]
