"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens)
on the same engines: a request becomes the OpenAI-shaped `ChatRequest` the
rest of the server runs (system, text, `tool_use` and `tool_result` blocks,
tools and tool_choice), and the reply goes back as a message, or as
Anthropic's server-sent events (message_start, content_block_start, _delta
and _stop, message_delta, message_stop)."""

from __future__ import annotations

import json
import uuid
from typing import Any

from localrun.errors import InvalidRequestError
from localrun.events import Stats
from localrun.serve.errors import ApiError
from localrun.serve.schemas import ChatRequest, json_object, media_refused, parse_data, refuse_unknown
from localrun.serve.tools import CallDelta, ToolStream, ToolUse, new_id, split_reply
from localrun.structured.tools import Call

# fields that change nothing here (prompt caching is always on)
IGNORED = frozenset({"metadata", "service_tier", "cache_control", "inference_geo", "user_profile_id", "workspace_id"})
KNOWN = frozenset(
    {"model", "messages", "system", "max_tokens", "stop_sequences", "temperature", "top_p", "top_k", "stream"}
    | {"tools", "tool_choice", "thinking"}
)
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def error_body(error: ApiError) -> dict[str, Any]:
    """Anthropic's error shape."""
    return {"type": "error", "error": {"type": ERROR_TYPES.get(error.status, "api_error"), "message": error.message}}


def _text(content: Any, where: str) -> str:
    """A block list's text (or a plain string)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequestError(f"{where}: content is a string or a list of blocks", where)
    parts = []
    for block in content:
        if not isinstance(block, dict) or block.get("type") != "text":
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise InvalidRequestError(f"{where}: a {kind} block is not supported here", where)
        parts.append(str(block.get("text", "")))
    return "".join(parts)


def _turn(m: Any, where: str, out: list[dict[str, Any]]) -> None:
    """One turn's blocks appended to ``out`` as OpenAI's messages."""
    if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
        raise InvalidRequestError(f"{where}.role: user or assistant", where)
    content = m.get("content")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    if not isinstance(blocks, list):
        raise InvalidRequestError(f"{where}.content: a string or a list of blocks", where)
    text, calls, results, thought = [], [], [], []
    for block in blocks:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            text.append(str(block.get("text", "")))
        elif kind in ("thinking", "redacted_thinking") and m["role"] == "assistant":
            thought.append(str(block.get("thinking", "")))  # a redacted block's is not for us to read
        elif kind == "tool_use" and m["role"] == "assistant":
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            function = {"name": block["name"], "arguments": arguments}
            calls.append({"id": block["id"], "type": "function", "function": function})
        elif kind == "tool_result" and m["role"] == "user":
            result = _text(block.get("content", ""), f"{where}.content")
            results.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": result})
        else:
            raise InvalidRequestError(media_refused(kind) or f"{where}.content: a {kind} block is not supported", where)
    out += results
    reasoning = {"reasoning_content": "".join(thought)} if any(thought) else {}
    if calls:
        out.append({"role": "assistant", "content": "".join(text) or None, "tool_calls": calls, **reasoning})
    elif text or reasoning or not results:
        out.append({"role": m["role"], "content": "".join(text), **reasoning})


def _messages(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Anthropic's turns as OpenAI's messages: tool results become `tool` messages."""
    out: list[dict[str, Any]] = []
    system = data.get("system")
    if system:
        out.append({"role": "system", "content": _text(system, "system")})
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("messages: at least one message is needed", "messages")
    for i, m in enumerate(messages):
        _turn(m, f"messages.{i}", out)
    return out


def _tools(data: dict[str, Any]) -> dict[str, Any]:
    tools = data.get("tools")
    if not tools:
        return {}
    converted = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or "input_schema" not in tool:
            raise InvalidRequestError(f"tools.{i}: only custom tools (with an input_schema) are supported", "tools")
        function = {
            "name": tool.get("name"),
            "description": tool.get("description", ""),
            "parameters": tool["input_schema"],
        }
        converted.append({"type": "function", "function": function})
    # Anthropic's default lets a reply make several calls; where a call is
    # required (any, tool), one call ends it: given no way out but another
    # call, a small model calls on until its context is full
    out: dict[str, Any] = {"tools": converted, "parallel_tool_calls": True}
    choice = data.get("tool_choice")
    if isinstance(choice, dict):
        kind = choice.get("type")
        names = {"auto": "auto", "any": "required", "none": "none"}
        if kind == "tool":
            out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        elif kind in names:
            out["tool_choice"] = names[kind]
        else:
            raise InvalidRequestError(f"tool_choice.type {kind!r} is not auto, any, tool or none", "tool_choice")
        if choice.get("disable_parallel_tool_use") or kind in ("any", "tool"):
            out["parallel_tool_calls"] = False
    return out


def chat_request(body: bytes, *, counting: bool = False) -> ChatRequest:
    """A Messages API request as the chat request the server runs; a field
    it cannot honour is refused by name."""
    data = json_object(body)
    refuse_unknown(data, KNOWN | IGNORED)
    if not counting and not isinstance(data.get("max_tokens"), int):
        raise InvalidRequestError("max_tokens: required", "max_tokens")
    chat: dict[str, Any] = {"messages": _messages(data), **_tools(data)}
    for ours, theirs in (("model", "model"), ("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k")):
        if data.get(theirs) is not None:
            chat[ours] = data[theirs]
    if not counting:
        chat |= {"max_tokens": data["max_tokens"], "stream": bool(data.get("stream"))}
    if data.get("stop_sequences"):
        chat["stop"] = data["stop_sequences"]
    chat |= _thinking(data.get("thinking"))
    return parse_data(ChatRequest, chat)


def _thinking(thinking: Any) -> dict[str, Any]:
    """``thinking: {type: enabled, budget_tokens: N}`` (a budget of thinking
    tokens) or ``{type: disabled}`` (no thinking, where the template has a
    switch) as the chat request's fields."""
    if thinking is None:
        return {}
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind == "disabled":
        return {"reasoning_effort": "none"}
    if kind != "enabled":
        raise InvalidRequestError("thinking.type: enabled or disabled", "thinking")
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
        raise InvalidRequestError("thinking.budget_tokens: a count of tokens is required", "thinking.budget_tokens")
    return {"reasoning_budget_tokens": budget}


# ------------------------------------------------------------- the reply --


def _stop_reason(stats: Stats, calls: list[Call]) -> str:
    if calls:
        return "tool_use"
    return {"length": "max_tokens", "stop": "stop_sequence"}.get(stats.stop_reason, "end_turn")


def _usage(stats: Stats) -> dict[str, Any]:
    return {
        "input_tokens": stats.prompt_tokens - stats.cached_tokens,
        "cache_read_input_tokens": stats.cached_tokens,
        "cache_creation_input_tokens": 0,
        "output_tokens": stats.generated_tokens,
    }


def _tool_blocks(calls: list[Call]) -> list[dict[str, Any]]:
    return [{"type": "tool_use", "id": "toolu_" + new_id(), "name": c.name, "input": c.arguments} for c in calls]


class Message:
    """One reply's identity, and its shape whole or streamed."""

    def __init__(self, model: str, request: ChatRequest, use: ToolUse | None, prompt_tokens: int) -> None:
        self.id = "msg_" + uuid.uuid4().hex[:24]
        self.model = model
        self.stops = request.stops()
        self.use = use
        self.prompt_tokens = prompt_tokens
        self.held = ToolStream(use) if use is not None and use.choice is not None else None
        self.block = -1  # the open block's index, -1 for none
        self.kind = ""  # its type
        self.blocks = 0

    def _head(self) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model}

    def _stop_sequence(self, stats: Stats) -> str | None:
        return self.stops[0] if stats.stop_reason == "stop" and len(self.stops) == 1 else None

    def whole(self, text: str, stats: Stats, reasoning: str = "") -> dict[str, Any]:
        content, calls = split_reply(text, self.use)
        blocks: list[dict[str, Any]] = [{"type": "text", "text": content}] if content else []
        if reasoning:  # the thinking first, as a thinking block (unsigned: nothing here checks signatures)
            blocks.insert(0, {"type": "thinking", "thinking": reasoning, "signature": ""})
        return self._head() | {
            "content": blocks + _tool_blocks(calls),
            "stop_reason": _stop_reason(stats, calls),
            "stop_sequence": self._stop_sequence(stats),
            "usage": _usage(stats),
        }

    # -- streaming --

    def start(self) -> str:
        usage = {"input_tokens": self.prompt_tokens, "output_tokens": 0}
        message = self._head() | {"content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}
        return event("message_start", {"message": message})

    def _open(self, block: dict[str, Any]) -> list[str]:
        """Close the open block, open ``block``."""
        out = self._close()
        self.block, self.blocks, self.kind = self.blocks, self.blocks + 1, block["type"]
        return [*out, event("content_block_start", {"index": self.block, "content_block": block})]

    def _close(self) -> list[str]:
        if self.block < 0:
            return []
        out = [self._delta({"type": "signature_delta", "signature": ""})] if self.kind == "thinking" else []
        closed, self.block, self.kind = self.block, -1, ""
        return [*out, event("content_block_stop", {"index": closed})]

    def _delta(self, delta: dict[str, Any]) -> str:
        return event("content_block_delta", {"index": self.block, "delta": delta})

    def _text(self, piece: str) -> list[str]:
        if not piece:
            return []
        out = self._open({"type": "text", "text": ""}) if self.block < 0 or self.kind != "text" else []
        return [*out, self._delta({"type": "text_delta", "text": piece})]

    def thinking(self, piece: str) -> list[str]:
        """The events for more of the thinking: a thinking block, its deltas."""
        if not piece:
            return []
        out = self._open({"type": "thinking", "thinking": "", "signature": ""}) if self.kind != "thinking" else []
        return [*out, self._delta({"type": "thinking_delta", "thinking": piece})]

    def text(self, piece: str) -> list[str]:
        """The events for more of the reply: text, and calls as they are written."""
        if self.held is None:
            return self._text(piece)
        piece, deltas = self.held.feed(piece)
        return self._text(piece) + self._calls(deltas)

    def _calls(self, deltas: list[CallDelta]) -> list[str]:
        out = []
        for d in deltas:
            out += self._open({"type": "tool_use", "id": "toolu_" + d.id, "name": d.name, "input": {}})
            out.append(self._delta({"type": "input_json_delta", "partial_json": d.arguments}))
        return out

    def finish(self, stats: Stats) -> list[str]:
        calls: list[Call] = []
        out = []
        if self.held is not None:
            rest, deltas, calls = self.held.finish()
            out += self._text(rest) + self._calls(deltas)
        out += self._close()
        end = {"stop_reason": _stop_reason(stats, calls), "stop_sequence": self._stop_sequence(stats)}
        out.append(event("message_delta", {"delta": end, "usage": _usage(stats)}))
        out.append(event("message_stop", {}))
        return out


def event(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps({'type': name} | data, ensure_ascii=False)}\n\n"
