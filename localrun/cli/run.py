"""`localrun run MODEL [PROMPT]`, as `ollama run` takes it: with a prompt
(or text piped in) it is `localrun generate`, else `localrun chat`; every
other option is that command's."""

from __future__ import annotations

from typing import Annotated

import typer
from typer import _click
from typer.core import TyperGroup

from localrun.cli._env import current
from localrun.cli._errors import ExitCode

CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": ["--help"]}


def _gives_a_prompt(command: _click.Command | None, parent: _click.Context, args: list[str]) -> bool:
    """Whether ``args`` parse as `generate`'s with a prompt in them; an option
    only chat knows (--load) is no prompt."""
    assert command is not None
    try:
        probe = command.make_context("generate", list(args), parent=parent, resilient_parsing=True)
    except _click.ClickException:
        return False
    return any(probe.params.get(name) is not None for name in ("prompt", "prompt_option", "prompt_file"))


def run_command(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(help="The model: what -m takes.", show_default=False)],
) -> ExitCode:
    """Run a model as `ollama run` does: generate with a PROMPT (or piped text), else chat.

    `localrun run MODEL PROMPT` is `localrun generate -m MODEL PROMPT`;
    `localrun run MODEL` is `localrun chat -m MODEL`. Every other option is
    that command's."""
    parent = ctx.parent
    assert parent is not None and isinstance(parent.command, TyperGroup)
    args = ["-m", model, *ctx.args]
    generate = parent.command.get_command(parent, "generate")
    piped = not current().stdin_isatty
    name = "generate" if piped or _gives_a_prompt(generate, parent, args) else "chat"
    command = parent.command.get_command(parent, name)
    assert command is not None
    code = command.main(args=args, prog_name=f"{parent.command_path} {name}", standalone_mode=False)
    return ExitCode(code) if isinstance(code, int) else ExitCode.OK
