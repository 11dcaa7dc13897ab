"""A Responses API request (POST /v1/responses) read as the chat request the
rest of the server runs: `input` as text or items (messages, `function_call`,
`function_call_output` and `reasoning` items), `instructions`, function
tools and `tool_choice`, `text.format`, `reasoning.effort`, and the turns of
a stored `previous_response_id` put first. A field, item or tool this server
cannot honour is refused by name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localrun.errors import InvalidRequestError
from localrun.serve.schemas import IGNORED, ChatRequest, json_object, media_refused, parse_data, refuse_unknown, renamed

# the request's fields read here; the ones beside them that change nothing are `HARMLESS`
KNOWN = frozenset(
    {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text", "reasoning"}
    | {"max_output_tokens", "temperature", "top_p", "stream", "store", "previous_response_id", "truncation"}
)
# llama.cpp's extensions, passed on as chat completions take them
EXTENSIONS = frozenset({"seed", "top_k", "min_p", "repeat_penalty", "chat_template_kwargs", "reasoning_budget_tokens"})
# what the official clients (and Codex) send that changes nothing here: `IGNORED` as chat completions
# have it (said once by the server), and what asks for output this server never makes
HARMLESS = (IGNORED - {"store"}) | {"include", "stream_options", "client_metadata"}
ROLES = frozenset({"user", "system", "developer", "assistant"})
TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text", "reasoning_text", "refusal"})
EFFORTS = {"none": "none", "minimal": "minimal", "low": "low", "medium": "medium", "high": "high", "xhigh": "high"}

Item = dict[str, Any]
OURS = {"max_tokens": "max_output_tokens", "response_format": "text.format"}  # chat's names for ours


@dataclass(frozen=True)
class TurnRequest:
    """What a request asks for: the chat request that runs, the conversation's
    items so far (a stored previous response's first), and the request's own
    fields as the response repeats them."""

    chat: ChatRequest
    items: list[Item]  # the input items of every turn, the previous responses' outputs among them
    echo: dict[str, Any]
    store: bool


def _text(content: Any, where: str) -> str:
    """A content list's text (or a plain string); an image or a file is refused."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequestError(f"{where}: content is a string or a list of parts", where)
    parts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS:
            said = media_refused(kind) or f"a {kind!r} content part is not supported"
            raise InvalidRequestError(f"{where}.{i}: {said}", where)
        parts.append(str(part.get("text") or part.get("refusal") or ""))
    return "".join(parts)


def _call(item: Item, where: str) -> dict[str, Any]:
    name, arguments, call_id = item.get("name"), item.get("arguments"), item.get("call_id")
    if not isinstance(name, str) or not isinstance(arguments, str) or not isinstance(call_id, str):
        raise InvalidRequestError(f"{where}: a function_call has a call_id, a name and arguments (a string)", where)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _message(item: Item, where: str, thought: list[str]) -> dict[str, Any]:
    role = item.get("role")
    if role not in ROLES:
        raise InvalidRequestError(f"{where}.role: user, system, developer or assistant", where)
    message: dict[str, Any] = {"role": role, "content": _text(item.get("content"), f"{where}.content")}
    if role == "assistant" and thought:
        message["reasoning_content"] = "".join(thought)
        thought.clear()
    return message


def _output(item: Item, where: str) -> dict[str, Any]:
    call_id = item.get("call_id")
    if not isinstance(call_id, str):
        raise InvalidRequestError(f"{where}.call_id: which call this is the output of", where)
    return {"role": "tool", "tool_call_id": call_id, "content": _text(item.get("output"), where)}


def messages(items: list[Item]) -> list[dict[str, Any]]:
    """The items as OpenAI's chat messages: calls join the assistant's turn,
    outputs become `tool` messages, reasoning the next assistant turn's `reasoning_content`."""
    out: list[dict[str, Any]] = []
    thought: list[str] = []
    for i, item in enumerate(items):
        where = f"input.{i}"
        if not isinstance(item, dict):
            raise InvalidRequestError(f"{where}: an item is an object", where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            out.append(_message(item, where, thought))
        elif kind == "function_call":
            if not out or out[-1]["role"] != "assistant" or thought:  # the call opens a turn of its own
                out.append(_message({"role": "assistant", "content": ""}, where, thought) | {"content": None})
            out[-1].setdefault("tool_calls", []).append(_call(item, where))
        elif kind == "function_call_output":
            out.append(_output(item, where))
        elif kind == "reasoning":
            thought.append(_text(item.get("content") or item.get("summary") or [], f"{where}.content"))
        else:
            raise InvalidRequestError(f"{where}.type: {kind!r} items are not supported by this server", where)
    return out


def _tools(data: dict[str, Any]) -> dict[str, Any]:
    """Function tools (and `tool_choice`, `parallel_tool_calls`) as chat completions take them."""
    out: dict[str, Any] = {}
    converted = []
    for i, tool in enumerate(data.get("tools") or []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise InvalidRequestError(f"tools.{i}.type: {kind!r} tools are not supported here: only functions", "tools")
        function = {"name": tool.get("name"), "description": tool.get("description") or ""}
        converted.append({"type": "function", "function": function | {"parameters": tool.get("parameters")}})
    if converted:
        out["tools"] = converted
    choice = data.get("tool_choice")
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise InvalidRequestError(f"tool_choice.type: {choice.get('type')!r} is not supported", "tool_choice")
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    if choice is not None:
        out["tool_choice"] = choice
    if data.get("parallel_tool_calls") is not None:
        out["parallel_tool_calls"] = data["parallel_tool_calls"]
    return out


def _format(text: Any) -> dict[str, Any]:
    """``text.format`` as chat's `response_format` (``text.verbosity`` changes nothing here)."""
    if text is None:
        return {}
    if not isinstance(text, dict) or set(text) - {"format", "verbosity"}:
        unknown = ", ".join(sorted(set(text) - {"format", "verbosity"})) if isinstance(text, dict) else ""
        raise InvalidRequestError(f"text: only format and verbosity are supported {unknown}".strip(), "text")
    fmt = text.get("format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is None or kind == "text":
        return {}
    if kind == "json_object":
        return {"response_format": {"type": "json_object"}}
    if kind == "json_schema":
        assert isinstance(fmt, dict)
        schema = {"name": fmt.get("name") or "output", "schema": fmt.get("schema"), "strict": fmt.get("strict")}
        return {"response_format": {"type": "json_schema", "json_schema": schema}}
    raise InvalidRequestError("text.format.type: text, json_object or json_schema", "text.format")


def _effort(reasoning: Any) -> dict[str, Any]:
    """``reasoning.effort`` as chat's `reasoning_effort` (a summary is never made: the thinking comes whole)."""
    if reasoning is None:
        return {}
    if not isinstance(reasoning, dict):
        raise InvalidRequestError("reasoning: an object", "reasoning")
    effort = reasoning.get("effort")
    if effort is None:
        return {}
    if effort not in EFFORTS:
        raise InvalidRequestError(f"reasoning.effort: one of {', '.join(EFFORTS)}", "reasoning.effort")
    return {"reasoning_effort": EFFORTS[effort]}


def _input(data: dict[str, Any]) -> list[Item]:
    given = data.get("input")
    if isinstance(given, str):
        return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": given}]}]
    if not isinstance(given, list) or not given:
        raise InvalidRequestError("input: a string or a list of items", "input")
    return given


def turn_request(body: bytes, earlier: Callable[[str], list[Item]]) -> TurnRequest:
    """The request in ``body``, the turns ``earlier`` finds for its
    `previous_response_id` put before its input."""
    data = json_object(body)
    refuse_unknown(data, KNOWN | EXTENSIONS | HARMLESS)
    if data.get("truncation") not in (None, "disabled"):
        raise InvalidRequestError("truncation: only disabled (a prompt over the context is an error)", "truncation")
    store = data.get("store", True)
    if not isinstance(store, bool):
        raise InvalidRequestError("store: true or false", "store")
    previous = data.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise InvalidRequestError("previous_response_id: a response's id", "previous_response_id")
    items = [*(earlier(previous) if previous else []), *_input(data)]
    instructions = data.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidRequestError("instructions: a string", "instructions")
    chat: dict[str, Any] = {"messages": ([{"role": "system", "content": instructions}] if instructions else [])}
    chat["messages"] += messages(items)
    chat |= _tools(data) | _format(data.get("text")) | _effort(data.get("reasoning"))
    for ours, theirs in (("max_tokens", "max_output_tokens"), ("temperature", "temperature"), ("top_p", "top_p")):
        if data.get(theirs) is not None:
            chat[ours] = data[theirs]
    chat |= {k: data[k] for k in data if k in EXTENSIONS or (k in IGNORED and k != "store")}
    chat["stream"] = data.get("stream") is True
    if "model" in data:
        chat["model"] = data["model"]
    try:
        parsed = parse_data(ChatRequest, chat)
    except InvalidRequestError as exc:  # named as this request has it
        raise renamed(exc, OURS) from None
    return TurnRequest(parsed, items, _echo(data, store), store)


def _echo(data: dict[str, Any], store: bool) -> dict[str, Any]:
    """The request's own fields as the response object repeats them."""
    text = data.get("text") if isinstance(data.get("text"), dict) else {}
    assert isinstance(text, dict)
    return {
        "instructions": data.get("instructions"),
        "max_output_tokens": data.get("max_output_tokens"),
        "parallel_tool_calls": data.get("parallel_tool_calls") is True,  # as `tool_use` reads it
        "previous_response_id": data.get("previous_response_id"),
        "reasoning": {"effort": (data.get("reasoning") or {}).get("effort"), "summary": None},
        "store": store,
        "temperature": data.get("temperature"),
        "text": {"format": text.get("format") or {"type": "text"}},
        "tool_choice": data.get("tool_choice") or "auto",
        "tools": data.get("tools") or [],
        "top_p": data.get("top_p"),
        "truncation": "disabled",
        "user": data.get("user"),
        "metadata": data.get("metadata") or {},
    }
