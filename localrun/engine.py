"""A loaded model and context on llama.cpp's low-level API.

`Engine` owns the llama.cpp model, context and vocabulary handles, and offers
what the decode loop needs: tokenize, detokenize one token, the context size,
the end-of-generation test, and an abort flag that stops a running decode.
"""

from __future__ import annotations

import collections
import ctypes
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp

from localrun.errors import BadModelError, ContextOverflowError, EngineError, UsageError
from localrun.ggufmeta import GGUFInfo, read_gguf

DEFAULT_CTX = 4096
_NO_ABORT = llama_cpp.ggml_abort_callback()  # a NULL function pointer


def default_threads() -> int:
    """All the CPUs this process may run on. Measured fastest on 2-vCPU machines,
    where llama-cpp-python's default (half the CPUs) leaves one core idle."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


# ---------------------------------------------------------------- logging --

_log_lock = threading.Lock()
_recent_errors: collections.deque[str] = collections.deque(maxlen=8)
_verbose = False


def _on_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    message = text.decode("utf-8", errors="replace")
    if level == 3:  # GGML_LOG_LEVEL_ERROR
        with _log_lock:
            _recent_errors.append(message.strip())
    if _verbose:
        os.write(2, text)


_log_callback = llama_cpp.llama_log_callback(_on_log)


def set_verbose(verbose: bool) -> None:
    """llama.cpp's own log lines go to stderr only when verbose."""
    global _verbose
    _verbose = verbose
    llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))


def _last_llama_error() -> str:
    with _log_lock:
        return _recent_errors[-1] if _recent_errors else ""


_backend_ready = False


def _init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        set_verbose(_verbose)
        llama_cpp.llama_backend_init()
        _backend_ready = True


# ----------------------------------------------------------------- engine --


@dataclass(frozen=True)
class EngineConfig:
    model_path: Path
    n_ctx: int | None = None  # None: the smaller of DEFAULT_CTX and the trained context
    n_threads: int | None = None  # None: default_threads()
    n_batch: int = 2048
    n_ubatch: int = 512
    verbose: bool = False


class Engine:
    """A model and one context. Close it (or use it as a context manager)."""

    def __init__(self, config: EngineConfig, info: GGUFInfo | None = None) -> None:
        self._model: Any = None
        self._ctx: Any = None
        self.abort_requested = False
        self.config = config
        self.info = info or read_gguf(config.model_path)
        set_verbose(config.verbose)
        _init_backend()

        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = 0
        self._model = llama_cpp.llama_model_load_from_file(str(self.info.path).encode(), mparams)
        if not self._model:
            raise BadModelError(
                f"llama.cpp could not load {self.info.path}: {_last_llama_error() or 'unknown error'}",
                hint=f"architecture {self.info.architecture!r} may be unsupported by this llama.cpp build",
            )
        self.vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_ctx_train = llama_cpp.llama_model_n_ctx_train(self._model)

        n_ctx = config.n_ctx or min(DEFAULT_CTX, self.n_ctx_train or DEFAULT_CTX)
        if n_ctx < 16:
            self.close()
            raise UsageError(f"context size {n_ctx} is too small", hint="use --ctx 512 or more")
        threads = config.n_threads or default_threads()
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = min(config.n_batch, n_ctx)
        cparams.n_ubatch = min(config.n_ubatch, cparams.n_batch)
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.no_perf = True
        self._ctx = llama_cpp.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            reason = _last_llama_error() or "unknown error"
            self.close()
            raise EngineError(
                f"llama.cpp could not create a context of {n_ctx} tokens: {reason}", hint="try a smaller --ctx"
            )
        self.n_ctx = llama_cpp.llama_n_ctx(self._ctx)
        self.n_batch = llama_cpp.llama_n_batch(self._ctx)
        self.memory = llama_cpp.llama_get_memory(self._ctx)
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
        self._pieces: dict[int, bytes] = {}
        self._abort_cb = llama_cpp.ggml_abort_callback(self._should_abort)

    def _should_abort(self, _data: ctypes.c_void_p) -> bool:
        return self.abort_requested

    @contextmanager
    def abortable(self) -> Iterator[None]:
        """Let `abort_requested` stop a decode midway (between graph nodes).

        The check is a Python callback that llama.cpp's compute threads call
        under the GIL, so it is switched on only for long batches (prompt
        evaluation), where stopping midway matters; a single-token step is
        short, and there the loop checks the flag between tokens."""
        llama_cpp.llama_set_abort_callback(self._ctx, self._abort_cb, None)
        try:
            yield
        finally:
            llama_cpp.llama_set_abort_callback(self._ctx, _NO_ABORT, None)

    @property
    def ctx(self) -> Any:
        return self._ctx

    # -- vocabulary --

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buf = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, capacity, add_special, parse_special)
        if n < 0:
            capacity = -n
            buf = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, capacity, add_special, parse_special)
        if n < 0:
            raise EngineError("tokenization failed")
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes one token renders to (control tokens render to nothing)."""
        cached = self._pieces.get(token)
        if cached is not None:
            return cached
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, 64, 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, -n, 0, False)
        piece = buf.raw[: max(n, 0)]
        self._pieces[token] = piece
        return piece

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))

    def token_text(self, token: int) -> str:
        raw = llama_cpp.llama_vocab_get_text(self.vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    @property
    def bos_token(self) -> str:
        bos = llama_cpp.llama_vocab_bos(self.vocab)
        return self.token_text(bos) if bos >= 0 else ""

    @property
    def eos_token(self) -> str:
        eos = llama_cpp.llama_vocab_eos(self.vocab)
        return self.token_text(eos) if eos >= 0 else ""

    def check_fits(self, n_prompt: int) -> None:
        if n_prompt >= self.n_ctx:
            raise ContextOverflowError(
                f"the prompt is {n_prompt} tokens; the context holds {self.n_ctx}",
                hint=f"shorten the input, or raise --ctx (this model was trained on {self.n_ctx_train} tokens)",
            )

    # -- lifetime --

    def close(self) -> None:
        if self._ctx:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()
