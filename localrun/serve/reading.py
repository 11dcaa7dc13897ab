"""What serve makes of a conversation and of a reply, without a model:
the request's messages and tools as the chat template is given them (the
tool block described in the system prompt for a template that takes no
tools), and a model's raw reply read as a chat completion's message
(reasoning apart, tool calls in the family's own format). `localrun
template` and ``POST /apply-template`` show these, so what they print is
what serve evaluates and answers."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from localrun.runtime.reasoning import reasoning_for
from localrun.runtime.reasoning import split_reply as split_thinking
from localrun.serve.tools import call_objects, conversation, split_reply, tool_use

# What a function's name can be (OpenAI's: letters, digits, _ and -; dots and colons where templates write them)
_NAME = re.compile(r"[A-Za-z_][\w.:\-]*")


def served_body(template: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` (a chat-completions request) with its messages and tools as
    serve renders them: a call's arguments as the template takes them, a
    Mistral call id as its template demands, and, for a template that takes
    no tools, the calls and results as text and the tools described in the
    system prompt (the template is then given no ``tools``)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        return dict(body)  # the renderer says what is wrong with it
    use = tool_use(body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls"), template)
    prepared = [{"content": None, **m} for m in messages]
    if not any(m.get("role") == "tool" or m.get("tool_calls") for m in prepared) and use is None:
        return dict(body)
    out = {k: v for k, v in body.items() if k != "tools"}
    try:
        out["messages"] = conversation(prepared, use)
    except (KeyError, TypeError, AttributeError):  # a malformed call: the renderer says what is wrong with it
        return dict(body)
    if use is not None and use.native and use.choice is not None:
        out["tools"] = use.declared
    return out


def any_function(text: str) -> list[dict[str, Any]]:
    """A tool for every name ``text`` could call, taking any object: what
    reads a reply's calls when the request's tools are not known."""
    names = dict.fromkeys(_NAME.findall(text))
    return [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in names]


def read_reply(
    template: str,
    text: str,
    *,
    prompt: str,
    tools: list[Any] | None = None,
    parallel: bool = True,
) -> tuple[dict[str, Any], list[str]]:
    """A model's raw ``text`` (what it generated after ``prompt``, the
    rendered request) as the message serve answers a chat completion with,
    and why each call that could not be read stayed content. ``tools``: the
    request's (a call must name one and follow its parameters); None reads a
    call of any function, with any object for arguments. Ids are numbered
    (serve gives each call a random one)."""
    reasoning = reasoning_for(template, prompt)
    if reasoning is None:
        thinking, answer = "", text
    else:
        thinking, answer = split_thinking(text, reasoning.format, starts_open=reasoning.starts_open)
    problems: list[str] = []
    use = tool_use(any_function(answer) if tools is None else tools, "auto", parallel, template)
    if use is not None:
        use = replace(use, warn=problems.append)
    content, calls = split_reply(answer, use)
    message: dict[str, Any] = {"role": "assistant", "content": content or (None if calls else content)}
    if thinking:
        message["reasoning_content"] = thinking
    if calls:
        message["tool_calls"] = call_objects(calls, [str(i) for i in range(len(calls))])
    return message, problems


def message_json(message: Mapping[str, Any]) -> str:
    """The message as `localrun template --parse` prints it."""
    return json.dumps(message, ensure_ascii=False, indent=2)
