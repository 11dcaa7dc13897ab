"""Help in the words of the usual command line: `--model TEXT` and `PROMPT`,
not Typer's `--model <str>`, `prompt <str>` and `{name}`.

Applied to the command tree once it is built (`plain_help`); a Typer that
no longer writes its own forms leaves nothing for this to change.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from typer import _click

# Typer's type labels, and what the help says instead
_WORDS = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "path": "PATH", "bool": "BOOLEAN"}
_LABEL = re.compile(r"^<(?:list\[)?([a-z]+)\]?(?: range)?>$")


def plain_type(label: str | None) -> str | None:
    """`<str>` -> TEXT, `<list[str]>` -> TEXT, `<float range>` -> FLOAT,
    `<str,str>...` -> TEXT TEXT; anything else as it was."""
    if label is None:
        return None
    pair = re.fullmatch(r"<([a-z]+(?:,[a-z]+)+)>(?:\.\.\.)?", label)  # a tuple: each of its values
    if pair:
        return " ".join(_WORDS.get(part, part.upper()) for part in pair.group(1).split(","))
    found = _LABEL.match(label)
    return _WORDS.get(found.group(1), found.group(1).upper()) if found else label


def _plain_option(option: _click.Parameter) -> None:
    typer_label: Callable[[Any], str | None] | None = getattr(option, "display_type_rich", None)
    if typer_label is not None and option.metavar is None:
        setattr(option, "display_type_rich", lambda ctx: plain_type(typer_label(ctx)))  # noqa: B010


def _plain_argument(argument: _click.Parameter) -> None:
    name = (argument.metavar or argument.name or "").upper()
    argument.metavar = name
    setattr(argument, "display_type_rich", lambda ctx: None)  # noqa: B010  the name says it
    usage = name if argument.required else f"[{name}]"
    usage += "..." if argument.nargs != 1 else ""
    if hasattr(argument, "_usage_display_name"):
        setattr(argument, "_usage_display_name", lambda: usage)  # noqa: B010  not Typer's {name}


def plain_help(command: _click.Command) -> _click.Command:
    """``command`` and every subcommand with plain metavars; returned for chaining."""
    for param in command.params:
        if param.param_type_name == "argument":
            _plain_argument(param)
        elif param.param_type_name == "option":
            _plain_option(param)
    for sub in getattr(command, "commands", {}).values():
        plain_help(sub)
    return command
