"""Keys typed while a reply streams are not echoed over the live panel."""

from __future__ import annotations

import io
import os
import shlex
import sys
import termios
from pathlib import Path

import pexpect
import pytest

from localrun.cli._signals import no_echo


def test_the_terminal_does_not_echo_during_a_reply_and_echoes_after() -> None:
    main, follower = os.openpty()
    try:
        with os.fdopen(follower, "r", closefd=False) as stream:
            before = termios.tcgetattr(follower)[3]
            assert before & termios.ECHO
            with no_echo(stream):
                during = termios.tcgetattr(follower)[3]
                assert not during & termios.ECHO and not during & termios.ECHOCTL
                assert during & termios.ISIG  # Ctrl-C still stops the reply
            assert termios.tcgetattr(follower)[3] == before
    finally:
        os.close(main)
        os.close(follower)


def test_not_a_terminal_is_left_alone() -> None:
    with no_echo(io.StringIO("typed")), no_echo(None):
        pass


@pytest.mark.pty
@pytest.mark.parametrize("piped", [False, True])
def test_ctrl_c_during_generate_leaves_one_panel(long_model: Path, piped: bool) -> None:
    """The terminal's echo of ^C under the live panel shifted Rich's erase by a
    line and left a second top border above the final panel: generate keeps
    the echo off while it streams, as chat does (stdin piped: the terminal is stdout's)."""
    command = f"{shlex.quote(sys.executable)} -m localrun generate -m {shlex.quote(str(long_model))} --ctx 32768 -t 0"
    command = f"echo notes | {command} sum" if piped else f"exec {command} hello"
    child = pexpect.spawn(
        "/bin/sh",
        ["-c", command],
        env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "100", "LINES": "30"},
        encoding="utf-8",
        timeout=120,
        dimensions=(30, 100),
    )
    child.expect(r"\d{3,} tokens")  # the live footer: the reply streams
    child.sendintr()
    child.expect(pexpect.EOF)
    child.close()
    assert "stop: interrupted" in (child.before or "")
    assert "^C" not in (child.before or "")
