"""native_call and callback: a Ctrl-C inside a llama.cpp call is held until it returns."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from types import FrameType

import llama_cpp
import pytest

from localrun.runtime import llama_log
from localrun.runtime.engine import Engine
from localrun.runtime.llama import DecodeStatus, callback, decode, native_call, raise_held
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


def test_a_ctrl_c_in_a_callback_is_held_until_the_decode_returns(tiny_model: Path) -> None:
    """A single-token decode leaves SIGINT's handler as it is; a Ctrl-C
    whose handler runs in the log's callback (called back through ctypes,
    which would print and drop what it raises) is raised by the decode,
    after llama.cpp decoded the token."""
    with Engine(engine_config(tiny_model, n_ctx=64, n_threads=1)) as engine:
        one = (llama_cpp.llama_token * 1)(engine.tokenize("the")[0])
        batch = llama_cpp.llama_batch_get_one(one, 1)
        memory = llama_cpp.llama_get_memory(engine.ctx)

        def ctrl_c(level: int, text: bytes) -> None:
            os.kill(os.getpid(), signal.SIGINT)
            raise AssertionError("the handler runs at the line above")

        with llama_log.listening(ctrl_c):
            llama_log._callback(2, b"a line\n", None)  # as llama.cpp calls it: through ctypes
        assert llama_cpp.llama_memory_seq_pos_max(memory, 0) == -1
        with pytest.raises(KeyboardInterrupt):
            decode(engine, batch)
        assert llama_cpp.llama_memory_seq_pos_max(memory, 0) == 0  # raised once the token was in
        assert decode(engine, batch) == DecodeStatus.OK  # held once, raised once


def test_what_a_callback_raises_off_the_main_thread_is_not_held() -> None:
    def fails() -> None:
        raise KeyboardInterrupt

    errors: list[BaseException] = []

    def run() -> None:
        try:
            callback(fails)()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert [type(e) for e in errors] == [KeyboardInterrupt]
    raise_held()  # nothing held for the main thread
