"""`localrun --show-completion [SHELL]` and `--install-completion [SHELL]`:
Typer's completion scripts for the shell named, or for the current shell
when none is. A name it does not know is refused before anything is written."""

from __future__ import annotations

from typing import Any

import typer

from localrun.cli._env import current
from localrun.cli._errors import error_boundary
from localrun.errors import UsageError

SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")
OPTIONS = ("--show-completion", "--install-completion")
PROG = "localrun"
COMPLETE_VAR = "_LOCALRUN_COMPLETE"  # what the scripts set to ask localrun for completions


def init() -> None:
    """Typer's completion classes, which answer the scripts at run time."""
    from typer._completion_classes import completion_init

    completion_init()


def with_shell_named(args: list[str]) -> list[str]:
    """``args`` with the bare form (the option last, no shell after it) given
    "" for its shell: the current one."""
    return [*args, ""] if args and args[-1] in OPTIONS else args


def _shell(name: str) -> str:
    if not name:
        from typer._completion_shared import _get_shell_name

        detected = _get_shell_name()
        if detected not in SHELLS:
            raise UsageError(
                "cannot tell which shell this is", hint=f"name it: localrun --show-completion {'|'.join(SHELLS[:3])}"
            )
        return str(detected)
    if name not in SHELLS:
        raise UsageError(f"unknown shell {name!r}: nothing was installed", hint=f"name one of: {', '.join(SHELLS)}")
    return name


def show(shell: str) -> None:
    from typer._completion_shared import get_completion_script

    script = get_completion_script(prog_name=PROG, complete_var=COMPLETE_VAR, shell=_shell(shell))
    current().stdout.write(script + "\n")


def install(shell: str) -> None:
    from typer._completion_shared import install as install_script

    name, path = install_script(shell=_shell(shell), prog_name=PROG, complete_var=COMPLETE_VAR)
    current().stderr.write(f"{name} completion installed in {path}; it works in shells started from now on\n")


def option_callback(ctx: typer.Context, param: Any, value: str | None) -> None:
    """The eager root options: do the one asked for, then exit."""
    if value is None or ctx.resilient_parsing:
        return
    with error_boundary():
        (show if param.name == "show_completion" else install)(value)
    raise typer.Exit()
