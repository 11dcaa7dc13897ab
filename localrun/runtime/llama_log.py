"""llama.cpp's log: one callback for the process. It keeps the last errors
(for messages) and the buffer sizes of the last model load and context
creation, passes lines to listeners (`listening`), and copies everything to
stderr when verbose.

llama.cpp names each buffer by its buffer type: `CPU`, `CPU_Mapped` and
`CPU_REPACK` on the host, `CUDA0` (`ROCm0`, `MUSA0`) and the pinned host
memory `CUDA_Host`, `MTL0` (`Metal` in older builds, `MTL0_Mapped`,
`MTL0_Private`), `Vulkan0` and `Vulkan_Host`. `device_buffers` sums them per
device: host memory, pinned or mapped, counts for `CPU`.
"""

from __future__ import annotations

import collections
import ctypes
import re
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import llama_cpp

from localrun.runtime import devices, rpc
from localrun.runtime.llama import callback, native_call

LEVEL_WARN = 3  # GGML_LOG_LEVEL_WARN in ggml.h
LEVEL_ERROR = 4  # GGML_LOG_LEVEL_ERROR

Listener = Callable[[int, bytes], None]

_lock = threading.Lock()
_recent_errors: collections.deque[str] = collections.deque(maxlen=8)
_recent_log: collections.deque[str] = collections.deque(maxlen=64)  # buffer sizes, read after a load
_model_lines: list[str] = []  # buffer lines of the last model load
_context_lines: list[str] = []  # and of the last context created on it
_listeners: list[Listener] = []
_verbose = False
_backend_ready = False


def _on_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    message = text.decode("utf-8", errors="replace")
    with _lock:
        if "MiB" in message:  # buffer sizes; the debug chatter would flush them out
            _recent_log.append(message)
            _keep_buffer_line(message)
        if level == LEVEL_ERROR:
            _recent_errors.append(message.strip())
        listeners = list(_listeners)
    for listener in listeners:
        listener(level, text)
    if _verbose:
        sys.stderr.write(message)
        sys.stderr.flush()


_callback = llama_cpp.llama_log_callback(callback(_on_log))


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
# "<function>: <buffer type> <what> buffer size = <n> MiB", as llama-model.cpp,
# llama-kv-cache.cpp, llama-memory-recurrent.cpp and llama-context.cpp log them
_BUFFER = re.compile(r"^\w+:\s+(\S+)\s+(model|KV|RS|compute|output) buffer size =\s*([\d.]+) MiB", re.MULTILINE)
_MIB = 1024 * 1024


@dataclass(frozen=True)
class DeviceBuffers:
    """What llama.cpp allocated on one device, in bytes: the weights, the KV
    cache (a recurrent model's state included), the compute buffers and the
    logits' output buffer."""

    device: str  # "CPU" for host memory (mapped, repacked or pinned), else the device's name: "CUDA0", "MTL0"
    model: int = 0
    kv: int = 0
    compute: int = 0
    output: int = 0

    @property
    def total(self) -> int:
        return self.model + self.kv + self.compute + self.output


def buffer_device(name: str) -> str:
    """The device a buffer type of llama.cpp's allocates on: `CUDA0` and
    `CUDA0_Split` on CUDA0, `MTL0_Private` on MTL0, `CUDA_Host`, `Vulkan_Host`,
    `CPU_Mapped` and `CPU_REPACK` on the host (`CPU`), an RPC server's
    `RPC0[HOST:PORT]` on the device this process registered for it (`RPC0`, `RPC1`...)."""
    remote = rpc.buffer_device(name)
    if remote is not None:
        return remote
    base, _, suffix = name.partition("[")[0].partition("_")  # an RPC server not registered here: its own name
    if suffix == "Host" or base == "CPU":
        return "CPU"
    return base


def _buffer_lines(text: str) -> list[tuple[str, str, int]]:
    """(buffer type, what, bytes) of each buffer line in ``text``."""
    return [(name, what, round(float(mib) * _MIB)) for name, what, mib in _BUFFER.findall(text)]


def parse_device_buffers(text: str) -> tuple[DeviceBuffers, ...]:
    """Every device's buffers in ``text`` (llama.cpp's log), summed, in the
    order the devices first appear."""
    fields = {"model": "model", "KV": "kv", "RS": "kv", "compute": "compute", "output": "output"}
    sums: dict[str, dict[str, int]] = {}
    for name, what, size in _buffer_lines(text):
        row = sums.setdefault(buffer_device(name), {})
        row[fields[what]] = row.get(fields[what], 0) + size
    return tuple(DeviceBuffers(device, **row) for device, row in sums.items())


def _keep_buffer_line(message: str) -> None:
    """Keep ``message`` for `device_buffers` when it is a buffer line: a
    model's line after a context's starts the record of a new load, a
    context's output buffer (its first line) the record of a new context."""
    found = _buffer_lines(message)
    if not found:
        return
    what = found[0][1]
    if what == "model":
        if _context_lines:
            _model_lines.clear()
            _context_lines.clear()
        _model_lines.append(message)
        return
    if what == "output":
        _context_lines.clear()
    _context_lines.append(message)


def device_buffers() -> tuple[DeviceBuffers, ...]:
    """What the last model load and the last context created on it
    allocated, per device (see `parse_device_buffers`): empty before any
    load. Unlike `logged_buffers`, reading it forgets nothing."""
    with _lock:
        text = "".join(_model_lines + _context_lines)
    return parse_device_buffers(text)


def logged_buffers() -> tuple[int | None, int | None, int | None]:
    """(KV cache bytes, KV cells, compute buffer bytes) from the log of the
    last context creation; the compute buffer is the host's (``CPU``). A
    sliding-window model's context has two caches (its full-attention layers'
    and its window layers'): the bytes are both caches', the cells the larger one's."""
    with _lock:
        text = "".join(_recent_log)
        _recent_log.clear()
    start = text.rfind(" output buffer size =")  # a context's first buffer line
    kv = _KV_SIZE.findall(text[start:]) if start >= 0 else _KV_SIZE.findall(text)[-1:]
    compute = [size for name, what, size in _buffer_lines(text) if name == "CPU" and what == "compute"]
    return (
        round(sum(float(mib) for mib, _ in kv) * _MIB) if kv else None,
        max(int(cells) for _, cells in kv) if kv else None,
        compute[0] if compute else None,
    )


def last_error() -> str:
    with _lock:
        return _recent_errors[-1] if _recent_errors else ""
