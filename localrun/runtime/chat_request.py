"""A chat-completions request body to the prompt it renders to, as llama-server's
``POST /apply-template`` answers it: the messages and tools, ``add_generation_prompt``,
``chat_template_kwargs`` (``enable_thinking`` among them) and ``reasoning_effort``
(``"none"`` turns thinking off)."""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
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
    return render_chat(
        template,
        messages,
        bos_token=bos_token,
        eos_token=eos_token,
        tools=tools,
        add_generation_prompt=bool(body.get("add_generation_prompt", True)),
        switches=switches,
        now=now,
    )


def strip_bos(prompt: str, bos_token: str, add_bos: bool) -> str:
    """The prompt without the BOS text the tokenizer adds by itself (as llama.cpp leaves it out)."""
    return prompt[len(bos_token) :] if add_bos and bos_token and prompt.startswith(bos_token) else prompt
