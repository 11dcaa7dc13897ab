"""The `localrun` command's entry point: it imports the command line, which
takes a moment (Typer, Rich), so that a Ctrl-C in that moment ends the run
as one at any later stage does: exit 130, no traceback."""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from localrun.cli import main as run_command_line
    except KeyboardInterrupt:  # what cli._errors.error_boundary does, which is what could not be imported
        sys.stderr.write("interrupted\n")
        return 130  # ExitCode.INTERRUPTED
    return run_command_line()
