"""native_call and callback: a Ctrl-C inside a llama.cpp call is held until it returns."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from types import FrameType

import llama_cpp
import pytest

from localrun.errors import EngineError
from localrun.runtime import llama, llama_log
from localrun.runtime.engine import Engine
from localrun.runtime.llama import decode, native_call
from tests.helpers import engine_config


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


@pytest.fixture
def hook(monkeypatch: pytest.MonkeyPatch) -> None:
    """localrun's unraisable hook in place, as in a run (pytest may have put its own above it)."""
    monkeypatch.setattr(sys, "unraisablehook", llama._unraisable)


@pytest.mark.usefixtures("hook")
def test_a_ctrl_c_in_the_log_during_a_decode_is_raised_when_it_returns(tiny_model: Path) -> None:
    """A decode that is not abortable leaves SIGINT's handler in place; when
    it raises in llama.cpp's log callback (called through ctypes, which
    would print and drop it), the decode raises it once llama.cpp returns.
    Here llama.cpp logs an error for a token past the vocabulary."""
    with Engine(engine_config(tiny_model, n_ctx=64, n_threads=1)) as engine:
        one = (llama_cpp.llama_token * 1)(engine.n_vocab)  # no such token: llama.cpp logs and refuses the batch
        batch = llama_cpp.llama_batch_get_one(one, 1)
        lines: list[bytes] = []

        def ctrl_c(level: int, text: bytes) -> None:
            lines.append(text)
            os.kill(os.getpid(), signal.SIGINT)

        with llama_log.listening(ctrl_c), pytest.raises(KeyboardInterrupt):
            decode(engine, batch)
        assert lines, "llama.cpp logged nothing for the bad token"
        with pytest.raises(EngineError):  # held once, raised once: the same decode now fails as it does
            decode(engine, batch)


@pytest.mark.usefixtures("hook")
def test_what_a_callback_raises_outside_a_decode_goes_on_to_the_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside a decode, the unraisable hook passes a callback's exception
    on, as before: nothing is held for a later decode."""
    reported: list[object] = []
    monkeypatch.setattr(llama, "_previous_hook", lambda unraisable: reported.append(unraisable.exc_value))

    def ctrl_c(level: int, text: bytes) -> None:
        raise KeyboardInterrupt

    with llama_log.listening(ctrl_c):
        llama_log._callback(2, b"a line\n", None)  # as llama.cpp calls it: through ctypes
    assert [type(e) for e in reported] == [KeyboardInterrupt]
    assert not llama._held
