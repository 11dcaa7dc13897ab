"""llama.cpp's MTP ("nextn") calls, as far as llama-cpp-python reaches them.

An MTP head is one extra decoder block that sees a token and the target's
final hidden state one position earlier and predicts the token after it. It
runs in a context of its own (``LLAMA_CONTEXT_TYPE_MTP``) on the target's
model, with its own small KV cache (the one block's), fed by batches whose
entries carry a token and a state row (`StateBatch`, the extended batch API).

The hidden rows are staged by calls the library exports only under their C++
names (``llama-ext.h``): `Nextn` finds them in the loaded libllama, or says
which is missing (`MTPUnavailableError`), so a build without them leaves the
drafter unavailable, never a crash. Both contexts stage their rows unmasked:
one row per batch entry, by its index in the batch (masked, a batch mixing
catch-up entries and a drafted one would give the first entry's row).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import Any

import llama_cpp
import numpy as np

from localrun.errors import EngineError, MTPUnavailableError
from localrun.runtime.engine import FLASH_ATTN, KV_TYPES, Engine
from localrun.runtime.llama import DecodeStatus, Native, native_call

# llama-ext.h, exported with C++ linkage: their mangled names (Itanium ABI, as the wheels are built)
_SET = "_Z26llama_set_embeddings_nextnP13llama_contextbb"  # (ctx, enabled, masked)
_GET = "_Z26llama_get_embeddings_nextnP13llama_context"  # (ctx) -> float * rows
_GET_ITH = "_Z30llama_get_embeddings_nextn_ithP13llama_contexti"  # (ctx, i) -> float * row i
# what the binding itself must have
_BINDING = (
    "llama_model_n_layer_nextn",
    "llama_batch_ext_init",
    "llama_batch_ext_add_token",
    "llama_batch_ext_set_embd_token",
    "llama_process",
    "LLAMA_CONTEXT_TYPE_MTP",
)
MTP_UBATCH = 64  # the MTP context's micro-batch: a longer catch-up runs in several


@dataclass(frozen=True)
class Nextn:
    """The staging calls of the loaded libllama."""

    set_embeddings: Any
    get_embeddings: Any
    get_ith: Any

    def stage(self, ctx: Any) -> None:
        """Make ``ctx`` keep a hidden row for every entry of each batch it decodes."""
        self.set_embeddings(ctx, True, False)

    def row(self, ctx: Any, i: int, n_embd: int) -> np.ndarray:
        """Row ``i`` of the last batch, copied."""
        found = self.get_ith(ctx, i)
        if not found:
            raise EngineError(f"llama.cpp kept no hidden row {i} of the MTP context's last batch")
        return np.ctypeslib.as_array(found, shape=(n_embd,)).copy()


@functools.cache
def _lookup() -> Nextn | str:
    missing = [name for name in _BINDING if not hasattr(llama_cpp, name)]
    lib = getattr(llama_cpp.llama_cpp, "_lib", None)
    found: dict[str, Any] = {}
    for name in (_SET, _GET, _GET_ITH):
        fn = getattr(lib, name, None) if lib is not None else None
        if fn is None:
            missing.append(name)
        found[name] = fn
    if missing:
        return ", ".join(missing)
    found[_SET].argtypes, found[_SET].restype = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool], None
    found[_GET].argtypes, found[_GET].restype = [ctypes.c_void_p], ctypes.POINTER(ctypes.c_float)
    found[_GET_ITH].argtypes = [ctypes.c_void_p, ctypes.c_int32]
    found[_GET_ITH].restype = ctypes.POINTER(ctypes.c_float)
    return Nextn(found[_SET], found[_GET], found[_GET_ITH])


def available() -> bool:
    """Whether this llama.cpp build has the staging calls MTP drafting needs."""
    return not isinstance(_lookup(), str)


def nextn() -> Nextn:
    """The staging calls, or `MTPUnavailableError` naming what this build lacks."""
    found = _lookup()
    if isinstance(found, str):
        raise MTPUnavailableError(
            f"this llama.cpp build cannot draft with MTP layers: it lacks {found}",
            hint="--spec lookup (or auto), or a llama-cpp-python build with MTP support",
        )
    return found


def mtp_context(target: Engine, *, n_batch: int) -> Any:
    """An MTP context on ``target``'s model (loaded with its MTP blocks)
    beside its context: its KV cache holds the MTP block's cells only, of
    the target's KV types, and its micro-batch is short (`MTP_UBATCH`): the
    graph llama.cpp reserves holds a micro-batch's logits, a vocabulary's
    worth of floats per entry."""
    config = target.config
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = target.n_ctx
    cparams.n_batch = n_batch
    cparams.n_ubatch = min(n_batch, MTP_UBATCH)
    cparams.type_k, cparams.type_v = KV_TYPES[config.type_k], KV_TYPES[config.type_v]
    cparams.flash_attn_type = FLASH_ATTN[target.flash_attn]
    threads = target.threads
    cparams.n_seq_max = 1
    cparams.n_threads = cparams.n_threads_batch = threads
    cparams.n_rs_seq = 0
    cparams.no_perf = True
    cparams.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_MTP
    cparams.ctx_other = target.ctx  # ignored where the head keeps its own cache (`MTP_ARCHITECTURES`)
    with native_call():
        ctx = llama_cpp.llama_init_from_model(target.model, cparams)
    if not ctx:
        raise EngineError("llama.cpp could not create the MTP context for this model (out of memory?)")
    return ctx


class StateBatch(Native):
    """A llama_batch_ext of sequence 0 whose entries carry a token, a
    position and, where given, a state row (copied into the batch), filled
    anew for each decode. Its capacity is the context's n_batch."""

    def __init__(self, ctx: Any, n_embd: int) -> None:
        self.handle: Any = None
        self.ctx = ctx
        self.n_embd = n_embd
        self.n = 0
        self._pos = (llama_cpp.llama_pos * 4)()  # room for an M-RoPE position; text reads the first
        self.handle = llama_cpp.llama_batch_ext_init(ctx)
        if not self.handle:
            raise EngineError("llama.cpp could not make a batch for the MTP context")

    def clear(self) -> None:
        llama_cpp.llama_batch_ext_clear(self.handle)
        self.n = 0

    def add(self, token: int, pos: int, state: np.ndarray | None, output: bool) -> int:
        """Append an entry; returns its index in the batch. ``state``: a
        float32 row of n_embd values (None: no state, as a prompt's first)."""
        idx = int(llama_cpp.llama_batch_ext_add_token(self.handle, 0, token))
        if idx < 0:
            raise EngineError(f"the MTP batch refused an entry (llama_batch_ext_add_token: {idx})")
        self._pos[0] = pos
        ok = llama_cpp.llama_batch_ext_set_pos(self.handle, idx, self._pos)
        if ok and state is not None:
            row = llama_cpp.llama_embd(state.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, self.n_embd)
            ok = llama_cpp.llama_batch_ext_set_embd_token(self.handle, idx, row)
        if ok and output:
            ok = llama_cpp.llama_batch_ext_set_output_logits(self.handle, idx, True)
        if not ok:
            raise EngineError("the MTP batch refused an entry's position, state or output")
        self.n += 1
        return idx

    def decode(self) -> DecodeStatus:
        with native_call():
            status = int(llama_cpp.llama_process(self.ctx, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, self.handle))
        if not 0 <= status <= max(DecodeStatus):
            raise EngineError(f"the MTP context failed to decode (status {status})")
        return DecodeStatus(status)

    def close(self) -> None:
        if self.handle:
            handle, self.handle = self.handle, None
            llama_cpp.llama_batch_ext_free(handle)
