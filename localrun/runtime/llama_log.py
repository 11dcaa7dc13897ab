"""llama.cpp's log: one callback for the process. It keeps the last errors
(for messages) and the buffer sizes of the last context creation, passes
lines to listeners (`listening`), and copies everything to stderr when verbose.
"""

from __future__ import annotations

import collections
import ctypes
import re
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import llama_cpp

from localrun.runtime import devices
from localrun.runtime.llama import native_call

LEVEL_WARN = 3  # GGML_LOG_LEVEL_WARN in ggml.h
LEVEL_ERROR = 4  # GGML_LOG_LEVEL_ERROR

Listener = Callable[[int, bytes], None]

_lock = threading.Lock()
_recent_errors: collections.deque[str] = collections.deque(maxlen=8)
_recent_log: collections.deque[str] = collections.deque(maxlen=64)  # buffer sizes, read after a load
_listeners: list[Listener] = []
_verbose = False
_backend_ready = False


def _on_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    message = text.decode("utf-8", errors="replace")
    with _lock:
        if "MiB" in message:  # buffer sizes; the debug chatter would flush them out
            _recent_log.append(message)
        if level == LEVEL_ERROR:
            _recent_errors.append(message.strip())
        listeners = list(_listeners)
    for listener in listeners:
        listener(level, text)
    if _verbose:
        sys.stderr.write(message)
        sys.stderr.flush()


_callback = llama_cpp.llama_log_callback(_on_log)


def set_verbose(verbose: bool) -> None:
    """llama.cpp's own log lines go to stderr only when verbose."""
    global _verbose
    _verbose = verbose
    llama_cpp.llama_log_set(_callback, ctypes.c_void_p(0))


def init_backend() -> None:
    """llama.cpp's backend, once per process, with this module's log callback."""
    global _backend_ready
    if not _backend_ready:
        set_verbose(_verbose)
        devices.load_dynamic_backends()  # a GGML_BACKEND_DL build's GPU backends, before llama.cpp starts
        with native_call():
            llama_cpp.llama_backend_init()
        _backend_ready = True


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Pass each log line (level, raw text) to ``listener`` while inside."""
    with _lock:
        _listeners.append(listener)
    try:
        yield
    finally:
        with _lock:
            _listeners.remove(listener)


_KV_SIZE = re.compile(r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells")
_COMPUTE = re.compile(r"CPU compute buffer size =\s*([\d.]+) MiB")


def logged_buffers() -> tuple[int | None, int | None, int | None]:
    """(KV cache bytes, KV cells, compute buffer bytes) from the log of the last context creation."""
    with _lock:
        text = "".join(_recent_log)
        _recent_log.clear()
    kv = _KV_SIZE.findall(text)
    compute = _COMPUTE.findall(text)
    mib = 1024 * 1024
    return (
        round(float(kv[-1][0]) * mib) if kv else None,
        int(kv[-1][1]) if kv else None,
        round(float(compute[0]) * mib) if compute else None,
    )


def last_error() -> str:
    with _lock:
        return _recent_errors[-1] if _recent_errors else ""
