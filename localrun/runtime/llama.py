"""llama.cpp handles and calls in one place: `Native` frees a handle, `Batch` fills a
llama_batch, `decode` runs llama_decode and names its status, `native_call`
and `callback` keep Ctrl-C out of llama.cpp's callbacks."""

from __future__ import annotations

import contextlib
import importlib
import signal
import sys
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from enum import IntEnum
from types import FrameType
from typing import Any, Protocol, Self, TypeVar

import llama_cpp

from localrun.errors import EngineError


class Context(Protocol):
    """What decoding needs of an engine: its llama.cpp context, and a way to
    let Ctrl-C stop a decode midway (`localrun.runtime.engine.Engine`)."""

    @property
    def ctx(self) -> Any: ...

    def abortable(self) -> AbstractContextManager[None]: ...


class DecodeStatus(IntEnum):
    """What llama_decode returned (llama.h); a negative value is raised as an EngineError."""

    OK = 0
    NO_SLOT = 1  # no room in the KV cache for the batch
    ABORTED = 2  # the abort callback stopped it


_STATUSES: tuple[DecodeStatus, ...] = tuple(DecodeStatus)  # by value: a lookup, not an enum call, per decode


# The signal module's C core: the module's own getsignal and signal convert
# handlers to and from enums, which costs microseconds a call, twice per
# `native_call`.
_signals: Any = importlib.import_module("_signal")
_SIGINT = int(signal.SIGINT)
_MAIN_THREAD = threading.main_thread().ident


def native_call() -> NativeCall:
    """Around a llama.cpp call that may call back into Python (its log, the
    abort check): Python runs a signal handler at the first Python line it
    reaches, which there is the callback, and a KeyboardInterrupt raised in a
    callback is printed by ctypes and dropped while llama.cpp goes on. Inside,
    SIGINT's handler still runs at once (a first Ctrl-C still asks a decode
    to stop), but what it raises is held and raised when the call returns."""
    return NativeCall()


class NativeCall:
    """`native_call`'s context manager: the handler in place while it lasts."""

    __slots__ = ("deliver", "held", "previous")

    def __init__(self) -> None:
        self.previous: Any = None
        self.held: BaseException | None = None
        self.deliver = False

    def __enter__(self) -> None:
        previous = _signals.getsignal(_SIGINT)
        if previous is None or threading.get_ident() != _MAIN_THREAD:
            return  # handlers run on the main thread only; None: one Python did not install
        self.previous = previous
        _signals.signal(_SIGINT, self._hold)

    def _hold(self, signum: int, frame: FrameType | None) -> None:
        previous = self.previous
        if not callable(previous):  # SIG_DFL: the process ends, once the call returned
            self.deliver = previous == signal.SIG_DFL
            return
        try:
            previous(signum, frame)
        except BaseException as exc:  # raised when the call returns
            if self.held is None:
                self.held = exc

    def __exit__(self, *exc: object) -> None:
        previous = self.previous
        if previous is None:
            return
        self.previous = None
        _signals.signal(_SIGINT, previous)
        if self.held is not None:
            held, self.held = self.held, None
            raise held
        if self.deliver:
            signal.raise_signal(signal.SIGINT)


F = TypeVar("F", bound=Callable[..., Any])
_callbacks: list[Callable[..., Any]] = []  # the Python functions llama.cpp calls back (`callback`)
_decoding = False  # a decode without `native_call` is under way on the main thread
_held: list[BaseException] = []  # what a signal handler raised in a callback meanwhile
_previous_hook: Callable[[Any], object] | None = None  # sys.unraisablehook before `_unraisable`


def callback(function: F) -> F:
    """Register ``function``, which ctypes makes a C function llama.cpp
    calls back (the log). A decode that is not abortable runs without
    `native_call` (its handler swaps are two system calls a step): should
    SIGINT's handler raise in the callback meanwhile (Python runs it at the
    callback's first line), ctypes would print what it raised and drop it;
    it reports it to sys.unraisablehook, where it is held instead, and the
    decode raises it once llama.cpp returns (the callback's own work, such
    as keeping that log line, is lost with it). Everything else reported
    there goes on to the hook that was in place."""
    global _previous_hook
    if _previous_hook is None:
        _previous_hook = sys.unraisablehook
        sys.unraisablehook = _unraisable
    _callbacks.append(function)
    return function


def _unraisable(unraisable: Any) -> None:
    exc = unraisable.exc_value
    if (
        _decoding
        and isinstance(exc, BaseException)
        and not isinstance(exc, Exception)  # KeyboardInterrupt, SystemExit: a signal handler's
        and _raised_in_callback(unraisable.exc_traceback)
        and threading.get_ident() == _MAIN_THREAD
    ):
        if not _held:
            _held.append(exc)
        return
    (_previous_hook or sys.__unraisablehook__)(unraisable)


def _raised_in_callback(traceback: Any) -> bool:
    """Whether the outermost frame of ``traceback`` is a registered
    callback's (ctypes names the callable in ``object`` on Python 3.11 and
    3.12, in its message on 3.13; the frame says it on each)."""
    return traceback is not None and any(traceback.tb_frame.f_code is f.__code__ for f in _callbacks)


_decodes = 0  # llama_decode calls made in this process: what a runner's heartbeat says of its progress


def decodes() -> int:
    """How many decodes this process has made (it moves while an engine works)."""
    return _decodes


def llama_decode(ctx: Any, batch: Any) -> int:
    """llama.cpp's llama_decode, counted (`decodes`)."""
    global _decodes
    _decodes += 1
    return int(llama_cpp.llama_decode(ctx, batch))


def decode(engine: Context, batch: Any, *, abortable: bool = False) -> DecodeStatus:
    """llama_decode on ``engine``'s context; ``abortable`` lets Ctrl-C stop a
    long batch midway (a Python callback between graph nodes, which costs).
    Otherwise the only Python that runs inside is a registered `callback`
    (the log), and SIGINT's handler stays in place: what it raises there is
    raised once llama.cpp returns."""
    global _decoding
    status: int
    if abortable:
        with native_call(), engine.abortable():
            status = llama_decode(engine.ctx, batch)
    elif threading.get_ident() != _MAIN_THREAD:  # no signal handler runs on this thread
        status = llama_decode(engine.ctx, batch)
    else:
        _decoding = True
        try:
            status = llama_decode(engine.ctx, batch)
        finally:  # what a callback held is this decode's: raised below, or dropped where a later Ctrl-C is raised first
            _decoding = False
            held = _held.pop() if _held else None
        if held is not None:
            raise held
    if not 0 <= status < len(_STATUSES):
        raise EngineError(f"llama_decode failed with status {status}")
    return _STATUSES[status]


class Native:
    """Something holding llama.cpp memory: freed by `close`, on leaving a
    `with` block, or when collected."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(KeyboardInterrupt):  # a Ctrl-C held while freeing cannot be raised from here
            self.close()


class Batch(Native):
    """A llama_batch of up to ``capacity`` tokens, each in one sequence,
    refilled in place (`clear`, `add`) and decoded as a whole."""

    def __init__(self, capacity: int) -> None:
        self.handle: Any = None
        self.capacity = capacity
        self.handle = llama_cpp.llama_batch_init(capacity, 0, 1)
        self.n = 0

    def clear(self) -> None:
        self.n = 0

    def add(self, token: int, pos: int, seq_id: int, logits: bool) -> int:
        """Append a token at ``pos`` of sequence ``seq_id``; returns its row."""
        b, i = self.handle, self.n
        if i >= self.capacity:
            raise ValueError(f"the batch holds {self.capacity} tokens")
        b.token[i] = token
        b.pos[i] = pos
        b.n_seq_id[i] = 1
        b.seq_id[i][0] = seq_id
        b.logits[i] = logits
        self.n += 1
        return i

    def decode(self, engine: Context, *, abortable: bool = False) -> DecodeStatus:
        self.handle.n_tokens = self.n
        return decode(engine, self.handle, abortable=abortable)

    def close(self) -> None:
        if self.handle is not None:
            llama_cpp.llama_batch_free(self.handle)
            self.handle = None
