"""Helpers the tests share: running the command line (in process, in a
subprocess, on a pseudo-terminal) and draining a generation."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localrun.cli import main
from localrun.cli._env import Environment
from localrun.events import DoneEvent, Event, Stats, TokenEvent

if TYPE_CHECKING:
    from localrun.runtime.engine import EngineConfig
    from localrun.runtime.placement import Placement


@dataclass
class Result:
    """What a command did: its exit status and its two streams."""

    returncode: int
    stdout: str
    stderr: str


@contextmanager
def _environ(extra: dict[str, str] | None) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.update(extra or {})
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def cli(
    *args: str,
    input: str | None = None,
    env: dict[str, str] | None = None,
    stdin_tty: bool = False,
    columns: int | None = None,
) -> Result:
    """Run `localrun ARGS` in this process, with stdin as given (empty when
    None) and stdout/stderr captured; neither is a terminal (``stdin_tty``
    makes stdin one, for the confirmations; ``columns`` makes stdout a
    terminal that wide, for the tables)."""
    stdin, stdout, stderr = io.StringIO(input or ""), io.StringIO(), io.StringIO()
    terminal = {"COLUMNS": str(columns)} if columns is not None else {}
    streams = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = stdin, stdout, stderr  # what click and Typer write to
    try:
        with _environ({**(env or {}), **terminal}):
            streams_env = Environment(stdin, stdout, stderr, stdin_isatty=stdin_tty, stdout_isatty=bool(terminal))
            code = main(list(args), streams_env)
    finally:
        sys.stdin, sys.stdout, sys.stderr = streams
    return Result(code, stdout.getvalue(), stderr.getvalue())


def cli_process(
    *args: str, input: str | None = None, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `python -m localrun ARGS` in a subprocess: for signals, llama.cpp's
    own log on the real stderr, and the Hugging Face client, which reads its
    environment once per process. Without ``input`` stdin is /dev/null (an
    empty pipe is text piped in that has none)."""
    return subprocess.run(
        [sys.executable, "-m", "localrun", *args],
        input=input,
        stdin=subprocess.DEVNULL if input is None else None,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )


def on_terminal(*args: str, rows: int = 30, cols: int = 100) -> tuple[int | None, str]:
    """Run `python -m localrun ARGS` on a pseudo-terminal; (exit status, what the screen got)."""
    import pexpect

    child = pexpect.spawn(
        sys.executable,
        ["-m", "localrun", *args],
        env={**os.environ, "TERM": "xterm-256color", "COLUMNS": str(cols), "LINES": str(rows)},
        encoding="utf-8",
        timeout=60,
        dimensions=(rows, cols),
    )
    child.expect(pexpect.EOF)
    child.close()
    return child.exitstatus, child.before or ""


def collect(events: Iterable[Event]) -> tuple[str, Stats]:
    """A generation's text and its closing stats."""
    text, stats = "", None
    for ev in events:
        if isinstance(ev, TokenEvent):
            text += ev.text
        elif isinstance(ev, DoneEvent):
            stats = ev.stats
    assert stats is not None
    return text, stats


def engine_config(model: Path, *, n_ctx: int = 512, placement: Placement | None = None, **fields: Any) -> EngineConfig:
    """An engine configuration made by hand, as a run's plan would carry it:
    ``n_ctx`` tokens, placed on the CPU unless ``placement`` says otherwise
    (a test that sizes a context plans it with `localrun.assemble`)."""
    from localrun.runtime.engine import EngineConfig
    from localrun.runtime.placement import Placement

    return EngineConfig(model_path=model, placement=placement or Placement(), n_ctx=n_ctx, **fields)
