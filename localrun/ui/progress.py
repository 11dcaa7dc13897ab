"""Progress bars: one factory for every bar localrun shows, and the download bar."""

from __future__ import annotations

import time
from pathlib import Path
from typing import IO, Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    ProgressColumn,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from localrun.units import human_bytes


def bar(err: IO[str], *columns: str | ProgressColumn, terminal: bool | None = None, **options: Any) -> Progress | None:
    """A transient Rich progress bar on ``err`` when it is a terminal
    (``terminal``, else asked of the stream); None otherwise, where callers
    write a line per step or nothing."""
    if not (err.isatty() if terminal is None else terminal):
        return None
    return Progress(*columns, console=Console(file=err), transient=True, **options)


class PullProgress:
    """Download progress on stderr: a Rich bar (bytes, speed, ETA) on a
    terminal; otherwise one line per file when it is done."""

    def __init__(self, err: IO[str], label: str, *, terminal: bool | None = None) -> None:
        self.err = err
        self.label = label
        self.tty = err.isatty() if terminal is None else terminal
        self._t0 = time.perf_counter()
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> PullProgress:
        self._progress = bar(
            self.err,
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(binary_units=True),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            terminal=self.tty,
        )
        if self._progress is not None:
            self._progress.start()
            self._task = self._progress.add_task(self.label, total=None)
        return self

    def update(self, description: str, done: int, total: int | None) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=done, total=total)

    def notice(self, message: str) -> None:
        if self._progress is not None:
            self._progress.console.print(message)
        else:
            self.err.write(message + "\n")
            self.err.flush()

    def finish(self, path: Path, source: str) -> None:
        self.close()
        size = path.stat().st_size if path.is_file() else 0
        self.err.write(f"{self.label}: {human_bytes(size)} from {source} in {time.perf_counter() - self._t0:.1f}s\n")
        self.err.flush()

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def __exit__(self, *exc: object) -> None:
        self.close()
