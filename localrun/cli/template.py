"""`localrun template`: the exact prompt a conversation renders to through a
model's chat template, as serve evaluates it (llama-server's
``/apply-template``), and, with ``--parse``, a model's raw reply read as the
message serve answers with."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from localrun.cli import _options as opt
from localrun.cli._env import current
from localrun.cli._input import read_stdin
from localrun.cli._options import Offline
from localrun.cli._output import out
from localrun.cli._resolve import resolve_model
from localrun.errors import UsageError

if TYPE_CHECKING:
    from localrun.runtime.model_template import ModelTemplate

# the conversation a reply is read after when none is given: one user message
PARSE_CONVERSATION = [{"role": "user", "content": "."}]


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
    *,
    default: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The chat-completions body the options describe (``default``: the
    conversation where they give none)."""
    body = _loaded(messages_file)
    messages: list[Any] = list(body.get("messages", []))
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    if prompt is not None:
        messages.append({"role": "user", "content": prompt})
    if not messages and default is not None:
        messages = [dict(m) for m in default]
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


def _template(model: str | None, template: str | None, offline: bool) -> ModelTemplate:
    """The template to render with: ``--template``'s, else the model's (its
    GGUF's, else the one its architecture implies); with ``--template`` and
    no model, the BOS and EOS texts are empty."""
    from localrun.runtime.model_template import ModelTemplate, given_template, model_template, template_note

    given = given_template(template) if template is not None else None
    if given is not None and model is None:
        return ModelTemplate(given.source, "", "", False, given)
    path = resolve_model(model, offline=offline).path
    found = model_template(path, given)
    if found.source is None:
        raise UsageError(
            f"{path.name} has no chat template in its GGUF metadata, and its architecture implies none",
            hint="give one with --template FILE (a Jinja chat template) or NAME (chatml, llama3, gemma, phi3)",
        )
    from localrun.gguf.reader import read_gguf

    note = template_note(found.chosen, path.name, read_gguf(path).architecture)
    if note is not None:
        out().note(note)
    return found


def _parse(found: ModelTemplate, body: dict[str, Any], rendered: str) -> None:
    """``--parse``: the reply on stdin, as the message serve answers with."""
    from localrun.serve.reading import message_json, read_reply

    assert found.source is not None
    if current().stdin_isatty:
        raise UsageError("--parse reads the model's reply from stdin", hint="pipe it in, or < reply.txt")
    reply = read_stdin()
    tools = body.get("tools")
    parallel = body.get("parallel_tool_calls") is not False
    message, problems = read_reply(
        found.source, reply, prompt=rendered, tools=tools if isinstance(tools, list) else None, parallel=parallel
    )
    for problem in problems:
        out().note(f"note: {problem}")
    current().stdout.write(message_json(message) + "\n")


def template_command(
    prompt: Annotated[str | None, typer.Argument(help="A user message (after --messages' conversation).")] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "-m",
            "--model",
            envvar="LOCALRUN_MODEL",
            help="Alias (family:tag), owner/repo:QUANT, hf://... or a GGUF path. "
            "Default: config.toml's model, else the registry's default (none is read with --template alone).",
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
            "(messages, tools, tool_choice, chat_template_kwargs, reasoning_effort); - reads stdin.",
        ),
    ] = None,
    tools: Annotated[
        str | None,
        typer.Option(
            "--tools",
            metavar="FILE",
            help="A JSON array of OpenAI tools to offer (a template that takes none gets them described "
            "in the system prompt, as serve does). With --parse: the functions a call may name.",
        ),
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
    template: opt.Template = None,
    source: Annotated[bool, typer.Option("--source", help="Print the chat template itself instead.")] = False,
    parse: Annotated[
        bool,
        typer.Option(
            "--parse",
            help="Read a model's raw reply on stdin and print the message serve answers with: JSON with "
            "content, reasoning_content and tool_calls (each call's name, and its arguments as a JSON "
            "string; ids numbered). The reply is read after the conversation given (default: one user "
            "message), which says whether the thinking was already open. With --tools a call must name "
            "one of them and follow its parameters, as in serve (one that does not stays content, and "
            "why is said on stderr); without, a call of any function with any object is read.",
        ),
    ] = False,
    offline: Offline = False,
) -> None:
    """Print the exact prompt a conversation renders to through the model's chat template,
    or (--parse) what localrun reads from a model's reply."""
    from localrun.runtime.chat_request import render_request, strip_bos
    from localrun.serve.reading import served_body

    if parse and source:
        raise UsageError("--parse and --source ask for two things", hint="give one of them")
    for flag, given in (("--messages", messages), ("--tools", tools)):
        if parse and given == "-":
            raise UsageError(f"--parse reads the reply from stdin; {flag} - would too", hint=f"give {flag} FILE")
    found = _template(model, template, offline)
    text = found.source
    assert text is not None
    if source:
        current().stdout.write(text if text.endswith("\n") else text + "\n")
        return
    default = PARSE_CONVERSATION if parse else None
    body = request_body(prompt, system, messages, tools, think, reasoning_effort, default=default)
    if not generation_prompt:
        body["add_generation_prompt"] = False
    served = served_body(text, body)
    rendered = render_request(text, served, bos_token=found.bos_token, eos_token=found.eos_token)
    if parse:
        _parse(found, body, rendered)
        return
    current().stdout.write(strip_bos(rendered, found.bos_token, found.add_bos))
