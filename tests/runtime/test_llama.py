"""native_call: a Ctrl-C inside a llama.cpp call is held until it returns."""

from __future__ import annotations

import os
import signal
from types import FrameType

import pytest

from localrun.runtime.llama import native_call


def test_a_ctrl_c_inside_is_raised_when_the_call_returns() -> None:
    reached = []
    with pytest.raises(KeyboardInterrupt), native_call():
        os.kill(os.getpid(), signal.SIGINT)  # handled here, at the next Python line, as in a log callback
        reached.append("after the signal")
    assert reached == ["after the signal"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_handler_runs_at_once_and_is_restored() -> None:
    seen: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        seen.append(signum)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        with native_call():
            os.kill(os.getpid(), signal.SIGINT)
            assert seen == [signal.SIGINT]
            assert signal.getsignal(signal.SIGINT) is not handler
        assert signal.getsignal(signal.SIGINT) is handler
        with native_call():
            pass  # no signal: nothing raised, nothing run
        assert seen == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_an_ignored_ctrl_c_stays_ignored() -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with native_call():
            os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
