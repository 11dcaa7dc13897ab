"""A chat-completions request body to the prompt it renders to, as llama-server's
``POST /apply-template`` answers it: the messages and tools, ``add_generation_prompt``,
``chat_template_kwargs`` (``enable_thinking`` among them) and ``reasoning_effort``
(``"none"`` turns thinking off)."""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Mapping
from typing import Any

from localrun.errors import UsageError
from localrun.runtime.templates import render_chat


def request_switches(body: Mapping[str, Any]) -> dict[str, Any]:
    """The template variables a request sets: its ``chat_template_kwargs``, then ``reasoning_effort``."""
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise UsageError("chat_template_kwargs must be an object")
    switches = dict(kwargs)
    if "enable_thinking" in switches and not isinstance(switches["enable_thinking"], bool):
        raise UsageError('invalid type for "enable_thinking" (expected boolean)')
    effort = body.get("reasoning_effort")
    if effort == "none":
        switches["enable_thinking"] = False
        switches.pop("reasoning_effort", None)
    elif isinstance(effort, str) and effort:
        switches["reasoning_effort"] = effort
    return switches


def render_request(
    template: str,
    body: Mapping[str, Any],
    *,
    bos_token: str,
    eos_token: str,
    now: datetime.datetime | None = None,
    thinking: bool | None = None,
) -> str:
    """The prompt for a chat-completions ``body``; ``thinking`` is ``enable_thinking``
    where the request does not set it (None: llama-server's default, on where the
    template writes a reasoning section)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise UsageError("'messages' is required and must be an array")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise UsageError(f"Expected 'tools' to be an array, got {json.dumps(tools)}")
    switches = ({} if thinking is None else {"enable_thinking": thinking}) | request_switches(body)

    def render(turns: list[Any], opened: bool) -> str:
        return render_chat(
            template,
            turns,
            bos_token=bos_token,
            eos_token=eos_token,
            tools=tools,
            add_generation_prompt=opened,
            switches=switches,
            now=now,
        )

    last = messages[-1] if messages else None
    if isinstance(last, dict) and last.get("role") == "assistant":
        return _continued(render, messages)
    return render(messages, bool(body.get("add_generation_prompt", True)))


def _continued(render: Callable[[list[Any], bool], str], messages: list[Any]) -> str:
    """llama-server continues a conversation that ends with the assistant's
    message: the turns before it, the opening of the assistant's turn, and the
    message's text, left open for the model to go on."""
    last = messages[-1]
    if len(messages) > 1 and isinstance(messages[-2], dict) and messages[-2].get("role") == "assistant":
        raise UsageError("Cannot have 2 or more assistant messages at the end of the list.")
    if last.get("tool_calls"):
        raise UsageError("Cannot continue an assistant message that contains tool calls.")
    if last.get("reasoning_content"):
        raise UsageError("continuing an assistant message's reasoning is not supported")
    before = render(messages[:-1], False)
    opened = render(messages[:-1], True)
    pairs = enumerate(zip(before, opened, strict=False))
    same = next((i for i, (a, b) in pairs if a != b), min(len(before), len(opened)))
    content = last.get("content") or ""
    if isinstance(content, list):
        content = "\n\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return before + opened[same:] + str(content)


def strip_bos(prompt: str, bos_token: str, add_bos: bool) -> str:
    """The prompt without the BOS text the tokenizer adds by itself (as llama.cpp leaves it out)."""
    return prompt[len(bos_token) :] if add_bos and bos_token and prompt.startswith(bos_token) else prompt
