"""`localrun --show-completion [SHELL]` and `--install-completion [SHELL]`:
Typer's completion scripts for the shell named, or for the current shell
when none is. A name it does not know is refused before anything is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from localrun.cli._env import current
from localrun.cli._errors import error_boundary
from localrun.errors import UsageError
from localrun.units import count

SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")
OPTIONS = ("--show-completion", "--install-completion")
PROG = "localrun"
COMPLETE_VAR = "_LOCALRUN_COMPLETE"  # what the scripts set to ask localrun for completions
STARTUP_FILES = (".bashrc", ".zshrc")  # in the home folder: where Typer's install adds the lines that load its script


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
    """Typer's install, saying each startup file it added lines to (it does so
    without a word: ~/.bashrc, ~/.zshrc)."""
    from typer._completion_shared import install as install_script

    startup = [Path.home() / name for name in STARTUP_FILES]
    before = {path: _lines(path) for path in startup}
    name, path = install_script(shell=_shell(shell), prog_name=PROG, complete_var=COMPLETE_VAR)
    said = f"{name} completion installed in {path}"
    for rc in startup:
        added = [line for line in _lines(rc) if line.strip() and line not in before[rc]]
        if added:
            said += f"; {count(len(added), 'line')} added to {rc}: {', '.join(f'`{line}`' for line in added)}"
    current().stderr.write(f"{said}; it works in shells started from now on\n")


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except OSError:  # none yet
        return []


def option_callback(ctx: typer.Context, param: Any, value: str | None) -> None:
    """The eager root options: do the one asked for, then exit."""
    if value is None or ctx.resilient_parsing:
        return
    with error_boundary():
        (show if param.name == "show_completion" else install)(value)
    raise typer.Exit()
