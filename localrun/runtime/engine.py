"""A loaded model and context on llama.cpp's low-level API.

`Engine` owns the llama.cpp model, context and vocabulary handles, and offers
what the decode loop needs: tokenize, detokenize one token, the context size,
the end-of-generation test, an abort flag that stops a running decode, and the
CPU thread count, which may change while it runs (see localrun.runtime.threads).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import llama_cpp

from localrun.errors import BadModelError, ContextOverflowError, EngineError
from localrun.gguf.info import N_UBATCH, describe
from localrun.gguf.reader import GGUFInfo, read_gguf
from localrun.runtime import devices, llama_log
from localrun.runtime.llama import Native, native_call
from localrun.runtime.memory import Cuts
from localrun.runtime.placement import ModelPlacement, Placement, check_kv_config
from localrun.system import default_threads

_NO_ABORT = llama_cpp.ggml_abort_callback()  # a NULL function pointer


# ----------------------------------------------------------------- engine --


# told, after every decode of sequence 0 through a `Decoder`, the tokens the sequence then holds and the
# position of the batch's first: a drafter that reads the batch's rows (MTP: `localrun.speculative.mtp`)
DecodeHook = Callable[[Sequence[int], int], None]


def _load_model(info: GGUFInfo, placed: ModelPlacement, *, mtp: bool = False) -> Any:
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = placed.n_gpu_layers  # llama.cpp's default is every layer: placement decides
    mparams.use_extra_bufts = placed.repack
    # the MTP ("nextn") blocks are skipped unless asked for: only a run that may draft with them pays their memory
    mparams.load_mtp = mtp and info.nextn_layers > 0
    chosen = devices.handles(placed.devices) if placed.offloaded else None  # kept alive through the load
    if chosen is not None:
        mparams.devices = ctypes.cast(chosen, ctypes.c_void_p)
    model = None
    try:
        with native_call():  # seconds of llama.cpp logging: Ctrl-C must not land in the log callback
            model = llama_cpp.llama_model_load_from_file(str(info.path).encode(), mparams)
    except BaseException:  # a Ctrl-C held until the load returned: the model loaded is freed, not lost
        if model:
            llama_cpp.llama_model_free(model)
        raise
    if not model:
        raise BadModelError(
            f"llama.cpp could not load {info.path}: {llama_log.last_error() or 'unknown error'}",
            hint=f"architecture {info.architecture!r} may be unsupported by this llama.cpp build",
        )
    return model


def _retry_notice(tried: Placement, now: Placement) -> str:
    return f"{tried.model.describe()} did not load (out of device memory?); retried with {now.model.describe()}"


class Weights(Native):
    """A loaded model that engines can share (see `Engine`); it must outlive them."""

    def __init__(self, path: Path, placement: Placement, *, verbose: bool = False, mtp: bool = False) -> None:
        self.handle: Any = None
        self.path = path
        self.info = read_gguf(path)
        self.mtp = mtp  # its MTP blocks loaded too, where it has them (`EngineConfig.mtp`)
        llama_log.set_verbose(verbose)
        llama_log.init_backend()
        self.placement = placement  # measured before the load, never after
        self.asked = self.placement  # what it was made with, before a retry with fewer layers
        self.notices: list[str] = []  # what a person should know of the load (a retry with fewer layers)
        try:
            self.handle = _load_model(self.info, self.placement.model, mtp=mtp)
        except BadModelError:
            fewer = self.placement.fewer_layers()
            if fewer is None:
                raise
            self.notices.append(_retry_notice(self.placement, fewer))
            self.placement = fewer
            self.handle = _load_model(self.info, fewer.model, mtp=mtp)

    def serves(self, config: EngineConfig) -> bool:
        """Whether an engine of ``config`` can run on these weights: the same
        file, placed the same way (as asked, or as a retry placed it). An
        engine on weights loaded without their MTP blocks has none
        (`Engine.mtp_layers`): it drafts otherwise."""
        placed = config.placement.model in (self.placement.model, self.asked.model)
        return self.path == config.model_path and placed

    def close(self) -> None:
        if self.handle:
            handle, self.handle = self.handle, None
            with native_call():
                llama_cpp.llama_model_free(handle)


@dataclass(frozen=True)
class EngineConfig:
    """What an engine is made of, as a run's plan settled it (`localrun.assemble`):
    the placement, the context and the sequences sharing it, and how the
    context decodes."""

    model_path: Path
    placement: Placement  # where the model goes, decided before anything loads
    n_ctx: int  # the context, every sequence's together
    ctx_asked: bool = False  # the context is one the user gave: a longer one is the remedy for a long prompt
    n_threads: int | None = None  # None: default_threads()
    n_batch: int = 2048
    n_ubatch: int = N_UBATCH  # the memory estimates (localrun.gguf.info) assume it
    type_k: str = "f16"  # f16, q8_0 or q4_0
    type_v: str = "f16"
    flash_attn: str = "auto"  # auto, on or off
    verbose: bool = False
    n_seq_max: int = 1  # sequences sharing the context (batched decoding)
    kv_unified: bool = False  # False: each sequence has its own n_ctx / n_seq_max cells
    adapt_threads: bool = True  # False: the thread count stays n_threads (see localrun.runtime.threads)
    max_threads: int | None = None  # the most adapting may use; None: n_threads (a tuned start may be lower)
    sample_on: str = "host"  # host, or device: plain decoding's sampler chains run in llama.cpp's graph
    embeddings: bool = False  # the context makes pooled embeddings (localrun.runtime.embed), not only logits
    pooling: int = llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED  # with embeddings: unspecified is the model's own
    n_rs_seq: int = 0  # a recurrent memory's snapshots per sequence, for speculative rollback (localrun.runtime.memory)
    mtp: bool = False  # load the model's MTP ("nextn") blocks, where it has them, for --spec mtp (and auto)


KV_TYPES = {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0, "q4_0": llama_cpp.GGML_TYPE_Q4_0}
FLASH_ATTN = {
    "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}


def _context_params(config: EngineConfig, flash_attn: str, n_ctx: int) -> Any:
    threads = config.n_threads or default_threads()
    cparams = llama_cpp.llama_context_default_params()
    cparams.type_k = KV_TYPES[config.type_k]
    cparams.type_v = KV_TYPES[config.type_v]
    cparams.flash_attn_type = FLASH_ATTN[flash_attn]
    cparams.n_ctx = n_ctx
    cparams.n_batch = min(config.n_batch, n_ctx)
    cparams.n_ubatch = min(config.n_ubatch, cparams.n_batch)
    cparams.n_threads = threads
    cparams.n_threads_batch = threads
    cparams.n_seq_max = config.n_seq_max
    cparams.kv_unified = config.kv_unified
    cparams.no_perf = True
    cparams.embeddings = config.embeddings
    cparams.pooling_type = config.pooling
    cparams.n_rs_seq = config.n_rs_seq  # llama.cpp keeps none on the architectures that cannot roll back
    return cparams


class Tokens(Protocol):
    """A model's vocabulary, as tokenizing a prompt and rendering the output
    use it: llama.cpp's in this process (`LlamaTokens`: an `Engine`, or a
    `Vocabulary` alone), or a served model's runner's (serve's `RemoteTokens`)."""

    info: GGUFInfo
    vocab: Any  # llama.cpp's handle; None where another process holds the vocabulary
    n_vocab: int
    add_bos: bool

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]: ...

    def piece(self, token: int) -> bytes: ...

    def detokenize(self, tokens: list[int]) -> str: ...

    def is_eog(self, token: int) -> bool: ...

    def token_text(self, token: int) -> str: ...

    def is_special(self, token: int) -> bool: ...

    @property
    def bos_token(self) -> str: ...

    @property
    def eos_token(self) -> str: ...


class LlamaTokens:
    """A vocabulary llama.cpp holds in this process (`Tokens`), its pieces
    and end-of-generation answers remembered."""

    info: GGUFInfo
    vocab: Any
    n_vocab: int
    add_bos: bool
    _pieces: dict[int, bytes]
    _eog: dict[int, bool]  # whether a token ends a generation, as asked: a loop asks of every token

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
        eog = self._eog.get(token)
        if eog is None:
            eog = self._eog[token] = bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))
        return eog

    def token_text(self, token: int) -> str:
        raw = llama_cpp.llama_vocab_get_text(self.vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    def is_special(self, token: int) -> bool:
        """Whether llguidance reads ``token`` as a special token, one a
        grammar names by id: a control token, or a user-defined one written
        as ``<...>`` (as `llguidance.llamacpp` marks them). Asked of the
        vocabulary alone, without building llguidance's tokenizer (a second,
        and its memory, where nothing samples)."""
        attr = llama_cpp.llama_vocab_get_attr(self.vocab, token)
        if attr & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL:
            return True
        text = self.token_text(token)
        return bool(attr & llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED) and text.startswith("<") and text.endswith(">")

    @property
    def bos_token(self) -> str:
        bos = llama_cpp.llama_vocab_bos(self.vocab)
        return self.token_text(bos) if bos >= 0 else ""

    @property
    def eos_token(self) -> str:
        eos = llama_cpp.llama_vocab_eos(self.vocab)
        return self.token_text(eos) if eos >= 0 else ""


class Vocabulary(LlamaTokens, Native):
    """A model file's vocabulary without its weights (llama.cpp's vocab_only
    load): prompts are counted in tokens with it before a run is placed."""

    def __init__(self, path: Path, info: GGUFInfo | None = None) -> None:
        self.handle: Any = None
        self.info = info if info is not None else read_gguf(path)  # ``info``: the file's, read already
        llama_log.init_backend()
        mparams = llama_cpp.llama_model_default_params()
        mparams.vocab_only = True
        mparams.n_gpu_layers = 0
        with native_call():
            self.handle = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
        if not self.handle:
            raise BadModelError(f"llama.cpp could not read the vocabulary of {path}: {llama_log.last_error()}")
        self.vocab = llama_cpp.llama_model_get_vocab(self.handle)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
        self.n_ctx_train = int(llama_cpp.llama_model_n_ctx_train(self.handle))
        self._pieces, self._eog = {}, {}

    def close(self) -> None:
        if self.handle:
            handle, self.handle = self.handle, None
            with native_call():
                llama_cpp.llama_model_free(handle)


class Engine(LlamaTokens, Native):
    """A model and one context. Close it (or use it as a context manager).
    With ``weights``, the context is made on an already loaded model, which
    the engine does not free: several engines in turn (e.g. the rows of a
    benchmark) then load the file once."""

    def __init__(self, config: EngineConfig, info: GGUFInfo | None = None, weights: Weights | None = None) -> None:
        self._model: Any = None
        self._ctx: Any = None
        self._owns_model = weights is None
        self.abort_requested = False
        if weights is not None and not weights.serves(config):
            raise ValueError(f"weights of {weights.path} given for an engine of {config.model_path}")
        placement = config.placement  # placed once, before this engine loads anything
        self.info = weights.info if weights is not None else info or read_gguf(config.model_path)
        self.notices: list[str] = []  # what a person should know of the load (a retry with fewer layers)
        llama_log.set_verbose(config.verbose)
        llama_log.init_backend()
        try:
            flash_attn, n_ctx, cparams = self._open(config, placement, weights)
        except (BadModelError, EngineError):
            fewer = placement.fewer_layers() if weights is None else None
            if fewer is None:
                raise
            self.notices.append(_retry_notice(placement, fewer))
            placement = fewer
            config = replace(config, placement=placement)
            flash_attn, n_ctx, cparams = self._open(config, placement, weights)
        self.config = config
        self.placement = placement
        self.flash_attn = flash_attn  # the mode asked of llama.cpp: on or off, or auto where it decides
        self.kv_cache_bytes, self.kv_cells, self.compute_buffer_bytes = llama_log.logged_buffers()
        self.buffers = llama_log.device_buffers()  # what the load and this context hold on each device
        # llama.cpp pads a context to its step; the planned size is what the run may use
        self.n_ctx = min(llama_cpp.llama_n_ctx(self._ctx), n_ctx)
        self.n_batch = llama_cpp.llama_n_batch(self._ctx)
        self.n_seq_max = llama_cpp.llama_n_seq_max(self._ctx)
        self.n_ctx_seq = llama_cpp.llama_n_ctx_seq(self._ctx)  # the cells one sequence may use
        self.memory = llama_cpp.llama_get_memory(self._ctx)
        self.cuts = Cuts(self._ctx, self._model, self.n_seq_max)  # every cut of a sequence goes through it
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
        # adapting never goes above this: the configured count, or more where a tuned start is below the CPUs
        self.max_threads = max(int(cparams.n_threads), config.max_threads or 0)
        self.threads = int(cparams.n_threads)  # the count in use, for single tokens and batches alike
        self._pieces, self._eog = {}, {}
        self._abort_cb = llama_cpp.ggml_abort_callback(self._should_abort)
        loaded_mtp = weights.mtp if weights is not None else config.mtp
        # MTP blocks loaded: a context of this model can draft for it (`localrun.speculative.mtp`)
        self.mtp_layers = int(llama_cpp.llama_model_n_layer_nextn(self._model)) if loaded_mtp else 0
        self.on_decode: DecodeHook | None = None  # see `DecodeHook`; set by the one drafter that reads rows

    def _open(self, config: EngineConfig, placement: Placement, weights: Weights | None) -> tuple[str, int, Any]:
        """Load the model (unless on shared ``weights``) and create the context:
        (the flash attention mode asked for, the context size, its parameters)."""
        shape = describe(self.info)
        kv = (config.type_k, config.type_v)
        flash_attn = check_kv_config(kv, config.flash_attn, shape)  # settled from the file's header, before any load
        n_ctx = config.n_ctx
        self._model = weights.handle if weights is not None else _load_model(self.info, placement.model, mtp=config.mtp)
        self.vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        self.n_ctx_train = llama_cpp.llama_model_n_ctx_train(self._model)
        cparams = _context_params(config, flash_attn, n_ctx)
        llama_log.logged_buffers()  # forget what the model load logged
        with native_call():
            self._ctx = llama_cpp.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            reason = llama_log.last_error() or "unknown error"
            self.close()
            raise EngineError(
                f"llama.cpp could not create a context of {n_ctx} tokens "
                f"(KV {config.type_k}/{config.type_v}, flash attention {flash_attn}): {reason}",
                hint="try a smaller --ctx, or --kv f16",
            )
        return flash_attn, n_ctx, cparams

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

    def set_threads(self, n: int) -> None:
        """Decode with ``n`` CPU threads from the next decode on (single tokens and batches)."""
        if n < 1:
            raise ValueError(f"a context needs at least one thread, got {n}")
        if not self._ctx:  # closed: llama.cpp would be handed a null context
            return
        with native_call():  # it logs
            llama_cpp.llama_set_n_threads(self._ctx, n, n)
        self.threads = n

    @property
    def ctx(self) -> Any:
        return self._ctx

    @property
    def model(self) -> Any:
        """The llama.cpp model handle (a second context on it: `localrun.runtime.embed`)."""
        return self._model

    @property
    def kv_bytes_per_token(self) -> float | None:
        """llama.cpp's KV buffer over the tokens it holds: its log counts the
        cells of one stream, and a context of n sequences has n streams
        unless the cache is unified."""
        if not self.kv_cache_bytes or not self.kv_cells:
            return None
        streams = 1 if self.config.kv_unified else self.n_seq_max
        return self.kv_cache_bytes / (self.kv_cells * streams)

    def check_fits(self, n_prompt: int) -> None:
        if n_prompt < self.n_ctx:
            return
        if n_prompt >= self.n_ctx_train:
            hint = f"shorten the input: this model was trained on {self.n_ctx_train} tokens"
        elif self.config.ctx_asked:  # a size the user gave: a larger one is the remedy
            hint = f"--ctx {n_prompt + 512} (or --ctx auto, the longest that fits in memory)"
        elif self.config.type_k == "f16" or self.config.type_v == "f16":
            hint = f"--ctx {n_prompt + 512} if memory allows, or --kv q8_0 to fit about twice the context"
        else:
            hint = f"--ctx {n_prompt + 512} if memory allows, or shorten the input"
        raise ContextOverflowError(f"the prompt is {n_prompt} tokens; the context holds {self.n_ctx}", hint=hint)

    # -- lifetime --

    def close(self) -> None:
        ctx, model = self._ctx, self._model if self._owns_model else None
        self._ctx = self._model = None  # freed once, even if Ctrl-C comes meanwhile
        with native_call():  # llama.cpp logs as it frees
            if ctx:
                llama_cpp.llama_free(ctx)
            if model:
                llama_cpp.llama_model_free(model)
