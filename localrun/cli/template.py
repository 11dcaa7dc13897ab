"""`localrun template`: the exact prompt a conversation renders to through a
model's chat template, as llama-server's ``/apply-template`` answers it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from localrun.cli._env import current
from localrun.cli._options import Offline
from localrun.cli._resolve import resolve_model
from localrun.errors import UsageError
from localrun.runtime.templates import BUILTIN_TEMPLATES


def _read_json(name: str, what: str) -> Any:
    try:
        text = sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {what} {name}: {exc.strerror}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what} {name} is not JSON: {exc}") from exc


def _loaded(messages_file: str | None) -> dict[str, Any]:
    """The body in ``--messages``: a chat-completions object, or a bare array of messages."""
    if messages_file is None:
        return {}
    data = _read_json(messages_file, "messages file")
    body = dict(data) if isinstance(data, dict) else {"messages": data}
    if not isinstance(body.get("messages"), list):
        raise UsageError(f"{messages_file}: expected an array of messages or an object with 'messages'")
    return body


def request_body(
    prompt: str | None,
    system: str | None,
    messages_file: str | None,
    tools_file: str | None,
    think: str | None,
    reasoning_effort: str | None,
) -> dict[str, Any]:
    """The chat-completions body the options describe."""
    body = _loaded(messages_file)
    messages: list[Any] = list(body.get("messages", []))
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    if prompt is not None:
        messages.append({"role": "user", "content": prompt})
    if not messages:
        raise UsageError("no conversation to render", hint="pass a prompt, or --messages FILE.json")
    body["messages"] = messages
    if tools_file is not None:
        tools = _read_json(tools_file, "tools file")
        if not isinstance(tools, list):
            raise UsageError(f"{tools_file}: expected an array of tools")
        body["tools"] = tools
    if think is not None:
        if think not in ("on", "off"):
            raise UsageError(f"--think takes on or off, not {think!r}")
        body["chat_template_kwargs"] = {**body.get("chat_template_kwargs", {}), "enable_thinking": think == "on"}
    if reasoning_effort is not None:
        body["reasoning_effort"] = reasoning_effort
    return body


def template_command(
    prompt: Annotated[str | None, typer.Argument(help="A user message (after --messages' conversation).")] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "-m",
            "--model",
            envvar="LOCALRUN_MODEL",
            help="Alias (family:tag), owner/repo:QUANT, hf://... or a GGUF path. "
            "Default: config.toml's model, else the registry's default.",
            show_default=False,
        ),
    ] = None,
    system: Annotated[str | None, typer.Option("-s", "--system", help="A system message first.")] = None,
    messages: Annotated[
        str | None,
        typer.Option(
            "--messages",
            metavar="FILE",
            help="A JSON conversation: an array of OpenAI messages, or a chat-completions body "
            "(messages, tools, chat_template_kwargs, reasoning_effort); - reads stdin.",
        ),
    ] = None,
    tools: Annotated[
        str | None, typer.Option("--tools", metavar="FILE", help="A JSON array of OpenAI tools to offer.")
    ] = None,
    think: Annotated[
        str | None, typer.Option("--think", metavar="on|off", help="Set the template's enable_thinking switch.")
    ] = None,
    reasoning_effort: Annotated[
        str | None,
        typer.Option("--reasoning-effort", metavar="LEVEL", help="low, medium or high (none: no thinking)."),
    ] = None,
    generation_prompt: Annotated[
        bool,
        typer.Option(
            "--generation-prompt/--no-generation-prompt", help="End with the opening of the assistant's turn."
        ),
    ] = True,
    template: Annotated[
        str | None,
        typer.Option("--template", help=f"A built-in template instead: {', '.join(BUILTIN_TEMPLATES)}."),
    ] = None,
    source: Annotated[bool, typer.Option("--source", help="Print the chat template itself instead.")] = False,
    offline: Offline = False,
) -> None:
    """Print the exact prompt a conversation renders to through the model's chat template."""
    from localrun.runtime.chat_request import render_request, strip_bos
    from localrun.runtime.model_template import model_template

    path = resolve_model(model, offline=offline).path
    found = model_template(path)
    text = BUILTIN_TEMPLATES.get(template or "") if template else found.source
    if template and text is None:
        raise UsageError(f"unknown chat template {template!r}", hint=f"use one of {', '.join(BUILTIN_TEMPLATES)}")
    if text is None:
        raise UsageError(
            f"{path.name} has no chat template in its GGUF metadata",
            hint=f"choose one with --template ({', '.join(BUILTIN_TEMPLATES)})",
        )
    if source:
        current().stdout.write(text if text.endswith("\n") else text + "\n")
        return
    body = request_body(prompt, system, messages, tools, think, reasoning_effort)
    if not generation_prompt:
        body["add_generation_prompt"] = False
    rendered = render_request(text, body, bos_token=found.bos_token, eos_token=found.eos_token)
    current().stdout.write(strip_bos(rendered, found.bos_token, found.add_bos))
