"""`localrun doctor`: what this machine and build offer, and where the default model would run."""

from __future__ import annotations

from typing import Annotated

import typer

from localrun.cli import _options as opt
from localrun.cli._env import current
from localrun.cli._output import out


def doctor_command(
    as_json: Annotated[bool, typer.Option("--json", help="The report as one JSON object on stdout.")] = False,
    rpc: opt.Rpc = None,
) -> None:
    """The llama.cpp build (backends and flags), the devices with their free
    and total memory, where the default model would run and how fast it was
    measured here; nothing is downloaded or loaded."""
    from localrun.doctor import examine

    env = current()
    opt.use_rpc(rpc)
    report = examine(env.registry, env.config)
    if as_json:
        out().json(report.to_json())
        return
    from localrun.ui.doctor import describe

    out().result(describe(report))
