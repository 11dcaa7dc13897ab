"""Ctrl-C while a model generates: the first stops the loop, the second
raises; and a terminal that does not echo keys over the live panel."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, Protocol, TextIO

from localrun.cli._env import current


class Abortable(Protocol):
    """What a loop checks between steps: a local engine, or a remote model."""

    abort_requested: bool


@contextmanager
def ctrl_c_stops(engine: Abortable) -> Iterator[None]:
    """The first Ctrl-C asks the loop to stop (it ends with stop_reason
    'interrupted'); a second one raises KeyboardInterrupt."""

    def handler(signum: int, frame: FrameType | None) -> None:
        if engine.abort_requested:
            raise KeyboardInterrupt
        engine.abort_requested = True

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def no_echo(stream: TextIO | None) -> Iterator[None]:
    """While the live panel is drawn: the terminal behind ``stream`` does not
    echo what is typed, ^C included, which would move the cursor under the
    panel and leave its top border drawn twice. Keys typed meanwhile stay
    queued for the next prompt. Nothing changes when ``stream`` is not a
    terminal, or when this process runs in the background (`... &`), where
    changing the terminal would stop it ("Stopped (tty output)")."""
    try:
        import termios

        fd = stream.fileno() if stream is not None else -1
        saved = termios.tcgetattr(fd)
    except (ImportError, OSError, ValueError, AttributeError):  # no terminal (a pipe, a StringIO, Windows)
        yield
        return
    except termios.error:  # not a terminal
        yield
        return
    quiet = list(saved)
    quiet[3] &= ~(termios.ECHO | termios.ECHOCTL)  # lflags
    changed = _set_attributes(fd, quiet)
    try:
        yield
    finally:
        if changed:
            _set_attributes(fd, saved)


def _in_foreground(fd: int) -> bool:
    """Whether this process may change the terminal behind ``fd``: it is in
    that terminal's foreground process group. A job in the background that
    changes its terminal is sent SIGTTOU, which stops it. A terminal that is
    not this process's controlling one (no process group to ask for) sends
    no such signal."""
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:  # not our controlling terminal
        return True


def _set_attributes(fd: int, attrs: list[Any]) -> bool:
    """Set the terminal's attributes, now (keys already typed stay queued),
    when this process is in its foreground; whether they were set. A signal
    that interrupts the call (EINTR) leaves the terminal as it was: its
    handler has run, and a Ctrl-C goes on as Ctrl-C does."""
    import termios

    if not _in_foreground(fd):
        return False
    try:
        termios.tcsetattr(fd, termios.TCSANOW, attrs)
    except (termios.error, OSError):  # interrupted (EINTR), or the terminal went away
        return False
    return True


def terminal() -> TextIO | None:
    """The stream whose terminal the live panel is drawn on and keys are typed
    at: stdin when it is one, else stdout (`cat notes | localrun generate ...`
    on a terminal); None when neither is."""
    env = current()
    if env.stdin_isatty:
        return env.stdin
    return env.stdout if env.stdout_isatty else None


def restore_terminal(keys: TextIO | None, *screens: TextIO | None) -> None:
    """Before an exit that runs no `finally` (os._exit): the terminal behind
    ``keys`` echoes again (as `no_echo` would have left it), and those
    behind ``screens`` show the cursor a live panel hid; the last one goes on
    to a new line, where a message can follow."""
    _echo_on(keys)
    for i, screen in enumerate(screens):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            if screen is not None and screen.isatty():
                screen.write("\x1b[?25h" + ("\n" if i == len(screens) - 1 else ""))
                screen.flush()


def _echo_on(keys: TextIO | None) -> None:
    try:
        import termios
    except ImportError:  # not a POSIX system
        return
    try:
        fd = keys.fileno() if keys is not None else -1
        attrs = termios.tcgetattr(fd)
    except (termios.error, OSError, ValueError, AttributeError):  # not a terminal
        return
    attrs[3] |= termios.ECHO | termios.ECHOCTL
    _set_attributes(fd, attrs)
