"""Keys typed while a reply streams are not echoed over the live panel."""

from __future__ import annotations

import errno
import io
import os
import shlex
import sys
import termios
from pathlib import Path

import pexpect
import pytest

from localrun.cli._signals import no_echo, restore_terminal


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


def test_a_signal_while_the_echo_changes_is_no_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """tcsetattr interrupted by a signal (EINTR) gave a traceback and exit 1:
    the terminal is left as it was, and the reply goes on (a Ctrl-C goes on as
    its handler says)."""
    main, follower = os.openpty()

    def interrupted(fd: int, when: int, attributes: list[object]) -> None:
        raise termios.error(errno.EINTR, "Interrupted system call")

    try:
        with os.fdopen(follower, "r", closefd=False) as stream:
            before = termios.tcgetattr(follower)
            monkeypatch.setattr(termios, "tcsetattr", interrupted)
            with no_echo(stream):
                assert termios.tcgetattr(follower) == before
            restore_terminal(stream)
            assert termios.tcgetattr(follower) == before
    finally:
        os.close(main)
        os.close(follower)


BACKGROUND = """
import os, signal, sys, termios
from localrun.cli._signals import no_echo, restore_terminal

pid = os.fork()
if pid == 0:
    os.setpgid(0, 0)  # a job started with `&`: not the terminal's foreground group
    with no_echo(sys.stdin):
        pass
    restore_terminal(sys.stdin, sys.stdout)
    os._exit(0)
_, status = os.waitpid(pid, os.WUNTRACED)
if os.WIFSTOPPED(status):
    print("child stopped by", signal.Signals(os.WSTOPSIG(status)).name, flush=True)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
else:
    print("child exited", os.waitstatus_to_exitcode(status), flush=True)
with no_echo(sys.stdin):  # in the foreground: the echo goes off
    print("echo during:", bool(termios.tcgetattr(0)[3] & termios.ECHO), flush=True)
print("echo after:", bool(termios.tcgetattr(0)[3] & termios.ECHO), flush=True)
"""


@pytest.mark.pty
def test_a_background_job_leaves_the_terminal_alone() -> None:
    """`localrun generate ... > out 2>/dev/null &` in an interactive shell was
    stopped ("Stopped (tty output)"): hiding keys changed the terminal from a
    process outside its foreground group, which the terminal stops with SIGTTOU."""
    child = pexpect.spawn(sys.executable, ["-c", BACKGROUND], encoding="utf-8", timeout=60)
    child.expect(pexpect.EOF)
    child.close()
    output = child.before or ""
    assert "child exited 0" in output, output
    assert "echo during: False" in output and "echo after: True" in output, output


@pytest.mark.pty
def test_generate_in_the_background_runs_to_its_end(tiny_model: Path, tmp_path: Path) -> None:
    """The whole command, as `localrun generate ... > out 2>/dev/null &` runs
    it: keys from the terminal, in a process group of its own."""
    script = f"""
import os, subprocess, sys
with open({str(tmp_path / "out")!r}, "w") as out:
    process = subprocess.Popen(
        [sys.executable, "-m", "localrun", "generate", "-m", {str(tiny_model)!r}, "-n", "8", "-t", "0", "hello"],
        stdout=out, stderr=subprocess.DEVNULL, process_group=0,
    )
    _, status = os.waitpid(process.pid, os.WUNTRACED)
    if os.WIFSTOPPED(status):
        print("stopped", flush=True)
        process.kill()
        process.wait()
    else:
        print("exited", os.waitstatus_to_exitcode(status), flush=True)
"""
    child = pexpect.spawn(sys.executable, ["-c", script], encoding="utf-8", timeout=120)
    child.expect(pexpect.EOF)
    child.close()
    assert "exited 0" in (child.before or ""), child.before
    assert (tmp_path / "out").read_text().strip()
