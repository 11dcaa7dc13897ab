"""Keys typed while a reply streams are not echoed over the live panel."""

from __future__ import annotations

import io
import os
import termios

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
