"""The Environment of one command: its streams, whether each is a terminal,
and the user's config and registry, each loaded once.

Commands read these from `current()` instead of `sys` and the files, so a
test can run a command in process with strings for streams and choose
whether each one is a terminal.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from localrun.config import UserConfig
    from localrun.store.registry import Registry


def _isatty(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except ValueError:  # closed
        return False


@dataclass
class Environment:
    stdin: TextIO = field(default_factory=lambda: sys.stdin)
    stdout: TextIO = field(default_factory=lambda: sys.stdout)
    stderr: TextIO = field(default_factory=lambda: sys.stderr)
    stdin_isatty: bool | None = None  # None: ask the stream
    stdout_isatty: bool | None = None
    stderr_isatty: bool | None = None
    _config: UserConfig | None = field(default=None, repr=False)
    _registry: Registry | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.stdin_isatty is None:
            self.stdin_isatty = _isatty(self.stdin)
        if self.stdout_isatty is None:
            self.stdout_isatty = _isatty(self.stdout)
        if self.stderr_isatty is None:
            self.stderr_isatty = _isatty(self.stderr)

    @property
    def config(self) -> UserConfig:
        """The user's config.toml, read on first use."""
        if self._config is None:
            from localrun.config import load

            self._config = load()
        return self._config

    @property
    def registry(self) -> Registry:
        """The shipped and the user's models.toml, read on first use."""
        if self._registry is None:
            from localrun.store.registry import load

            self._registry = load()
        return self._registry


_current: Environment | None = None


def current() -> Environment:
    """The running command's Environment (the process's streams unless `main` was given one)."""
    global _current
    if _current is None:
        _current = Environment()
    return _current


def use(env: Environment | None) -> None:
    """Make ``env`` the current Environment (None: build a new one from `sys` on next use)."""
    global _current
    _current = env
