"""Sampling parameters and llama.cpp's native sampler chain."""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import llama_cpp
import numpy as np

from localrun.errors import EngineError
from localrun.events import TokenChoice

if TYPE_CHECKING:
    from localrun.runtime.engine import Engine


# ollama's names for the settings a run may change (a request's ``options``,
# chat's `/set parameter NAME VALUE`): the field each sets, and its type
# (``max_tokens`` is the reply's limit; the others are SamplingParams' own)
PARAMETERS: dict[str, tuple[str, type[int] | type[float]]] = {
    "temperature": ("temperature", float),
    "top_k": ("top_k", int),
    "top_p": ("top_p", float),
    "min_p": ("min_p", float),
    "repeat_penalty": ("repeat_penalty", float),
    "repeat_last_n": ("repeat_last_n", int),
    "seed": ("seed", int),
    "num_predict": ("max_tokens", int),
}


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None
    frequency_penalty: float = 0.0  # OpenAI's: less of a token the more often it came (over repeat_last_n)
    presence_penalty: float = 0.0  # OpenAI's: less of a token once it came
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def penalized(self) -> bool:
        """Whether llama.cpp's penalties sampler changes anything."""
        return self.repeat_last_n != 0 and (
            self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
        )

    @property
    def speculable(self) -> bool:
        """Whether speculative sampling's own model of the chain
        (`localrun.speculative.sampling`) is this chain: no logit bias, no
        frequency or presence penalty."""
        return not self.logit_bias and self.frequency_penalty == 0.0 and self.presence_penalty == 0.0

    @property
    def plain_argmax(self) -> bool:
        """Greedy with nothing that moves a logit first: the maximum of the raw row."""
        return self.greedy and not self.penalized and not self.logit_bias


def log_probabilities(row: Any, token: int, top: int) -> TokenChoice:
    """``token``'s log-probability in the logits ``row`` (log-softmax, as
    llama-server reports it) and the ``top`` most likely tokens'."""
    values = np.asarray(row, dtype=np.float32)
    peak = float(values.max())
    log_total = peak + float(np.log(np.exp(values - peak, dtype=np.float64).sum()))
    best: tuple[tuple[int, float], ...] = ()
    if top > 0:
        ids = np.argpartition(values, -top)[-top:] if top < len(values) else np.arange(len(values))
        ids = ids[np.argsort(-values[ids], kind="stable")]
        best = tuple((int(i), float(values[i]) - log_total) for i in ids if np.isfinite(values[i]))  # not masked
    return TokenChoice(token, float(values[token]) - log_total, best)


@functools.cache
def _row_type(n_vocab: int) -> Any:
    return ctypes.c_float * n_vocab


# llama_get_logits_ith returning the row's address as an int: no pointer
# object to build and cast on every token.
_logits_address: Any = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)(
    ctypes.cast(llama_cpp.llama_get_logits_ith, ctypes.c_void_p).value or 0
)


_VIEWS = 64  # rows' views kept: a batch's rows, one per sequence; a single sequence's row is one
_views: dict[tuple[int, int], Any] = {}  # (address, n_vocab): the numpy view of that row


def logits(engine: Engine, row: int) -> Any:
    """The logits of ``row`` of the engine's last batch, as a numpy view (no
    copy). A decode loop reads the same row of the same buffer step after
    step: the view made for an address is kept and given again (it is only
    given for an address llama.cpp just returned, so it never outlives the
    buffer it views)."""
    address = _logits_address(engine.ctx, row)
    if not address:
        raise EngineError(f"llama.cpp has no logits for row {row} of the last batch")
    key = (address, engine.n_vocab)
    view = _views.get(key)
    if view is None:
        if len(_views) >= _VIEWS:
            _views.clear()
        row_buffer: Any = _row_type(engine.n_vocab).from_address(address)  # a buffer numpy can view
        view = _views[key] = np.frombuffer(row_buffer, dtype=np.float32)
    return view


# llama_token_data as numpy lays it out: a candidates array llama.cpp's chain reads and sorts in place
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=False)
_BLOCKS = 128  # a row is cut into this many strided slices; each column of them (a block) has its maximum taken


def top_candidates(row: Any, k: int) -> Any:
    """Indices of a few of ``row``'s values among which are its ``k``
    largest (and every value equal to the k-th), found without sorting the
    row; None where the shortcut does not apply (a row under ``k`` blocks,
    or one where fewer than ``k`` blocks hold a finite value: a grammar's
    mask).

    The row's first ``128 * m`` values are read as 128 rows of ``m``
    columns, and each column (a block) has its maximum taken in one
    vectorized pass; the k-th largest of those maxima, t, is at most the
    row's k-th largest value (k blocks hold a value of at least t each),
    so every one of the k largest values is at least t and sits in a block
    whose maximum is at least t: the values of at least t in those blocks
    (and in the few values past the last whole block) hold them all."""
    n = row.shape[0]
    m = n // _BLOCKS
    if k < 1 or m < k:
        return None
    grid = row[: _BLOCKS * m].reshape(_BLOCKS, m)
    maxima = grid.max(axis=0)
    threshold = np.partition(maxima, m - k)[m - k]
    if not np.isfinite(threshold):
        return None
    blocks = np.flatnonzero(maxima >= threshold)
    found = np.flatnonzero(grid[:, blocks] >= threshold)
    keep = (found // len(blocks)) * m + blocks[found % len(blocks)]
    if n > _BLOCKS * m:
        keep = np.concatenate((keep, _BLOCKS * m + np.flatnonzero(row[_BLOCKS * m :] >= threshold)))
    return keep


def _partly_sampled(engine: Engine, row: int) -> bool:
    """Whether llama.cpp's graph left ``row`` candidates for the host to finish
    sampling from (its chain ran only partly on the device)."""
    ctx = engine.ctx
    return bool(llama_cpp.llama_get_sampled_probs_ith(ctx, row) or llama_cpp.llama_get_sampled_logits_ith(ctx, row))


class _Candidates:
    """A candidates array llama.cpp's chain reads and sorts in place, kept
    from one draw to the next: its numpy fields and the llama_token_data_array
    that points at them are made once, not per token."""

    def __init__(self, size: int) -> None:
        self.data = np.empty(size, _TOKEN_DATA)
        self.ids, self.logits, self.p = self.data["id"], self.data["logit"], self.data["p"]
        pointer = self.data.ctypes.data_as(llama_cpp.llama_token_data_p)
        self.array = llama_cpp.llama_token_data_array(pointer, 0, -1, False)
        self.ref = ctypes.byref(self.array)


class Sampler:
    """llama.cpp's native sampler chain for one generation. A chain that is a
    plain argmax (greedy, no penalties) is flagged `argmax`: `sample` then
    reads the maximum off the logits itself, skipping the chain's copy of the
    whole vocabulary into a candidates array (see docs/benchmarks.md). Ties
    go to the lowest id, as in llama.cpp's greedy sampler.

    A chain that begins with top-k (no logit bias, no penalties before it)
    is given only the candidates `top_candidates` finds, which hold the k
    largest logits: top-k keeps the same k tokens from them as from the
    whole vocabulary, and the rest of the chain sees what it would have,
    so the tokens are drawn from the same distribution with the same random
    draws. llama.cpp's own path copies the whole vocabulary into a
    candidates array and partly sorts it, which on a 150k-token vocabulary
    costs about as much as a small model's step; among exactly tied logits
    the two paths may order the tied tokens differently, and a seed then
    picks another of them (tied tokens are equally likely either way).

    With ``on_device`` (an engine), the chain is attached to sequence
    ``seq_id`` of the engine's context and runs inside llama.cpp's graph, on
    the device that holds the output layer (llama.cpp's backend sampling),
    and `sample` reads the token llama.cpp drew. Nothing may read that
    sequence's logits meanwhile (a grammar, log-probabilities, a verify
    step), so only plain decoding asks for it. Where llama.cpp cannot
    attach the chain, `on_device` is False and sampling stays on the host."""

    def __init__(self, params: SamplingParams, n_vocab: int, on_device: Engine | None = None, seq_id: int = 0) -> None:
        self.handle: Any = None
        self._engine: Engine | None = None  # the engine whose context the chain is attached to, while it is
        self._seq_id = seq_id  # the sequence it is attached to
        self._candidates: _Candidates | None = None  # `draw`'s array, grown to the most candidates drawn from
        self.argmax = params.plain_argmax
        # the k of a chain that top-k heads (0: none does): only candidates that hold the k largest need be given it
        self.top_k = params.top_k if not (params.greedy or params.logit_bias or params.penalized) else 0
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        add = llama_cpp.llama_sampler_chain_add
        if params.logit_bias:  # first, as in llama.cpp's common sampler: the rest see the biased logits
            biases = (llama_cpp.llama_logit_bias * len(params.logit_bias))(
                *(llama_cpp.llama_logit_bias(token, bias) for token, bias in params.logit_bias)
            )
            add(chain, llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(params.logit_bias), biases))
        if params.penalized:
            penalties = llama_cpp.llama_sampler_init_penalties(
                n_vocab,
                params.repeat_last_n,
                params.repeat_penalty,
                params.frequency_penalty,
                params.presence_penalty,
            )
            add(chain, penalties)
        if params.greedy:
            add(chain, llama_cpp.llama_sampler_init_greedy())
        else:
            if params.top_k > 0:
                add(chain, llama_cpp.llama_sampler_init_top_k(params.top_k))
            if params.top_p < 1.0:
                add(chain, llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
            if params.min_p > 0.0:
                add(chain, llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
            add(chain, llama_cpp.llama_sampler_init_temp(params.temperature))
            seed = llama_cpp.LLAMA_DEFAULT_SEED if params.seed is None else params.seed & 0xFFFFFFFF
            add(chain, llama_cpp.llama_sampler_init_dist(seed))
        self.handle = chain
        if on_device is not None and llama_cpp.llama_set_sampler(on_device.ctx, seq_id, chain):
            self._engine = on_device

    @property
    def on_device(self) -> bool:
        return self._engine is not None

    def sample(self, engine: Engine, row: int = -1) -> int:
        """Sample (and accept) a token from the logits of ``row`` of the engine's last batch."""
        if self._engine is not None:
            token = int(llama_cpp.llama_get_sampled_token_ith(engine.ctx, row))
            if token != llama_cpp.LLAMA_TOKEN_NULL:
                llama_cpp.llama_sampler_accept(self.handle, token)  # the chain's state (its random draws) moves on
                return token
            if not _partly_sampled(engine, row):
                raise EngineError(f"llama.cpp sampled no token for row {row} of the last batch")
            # the device ran part of the chain (it lacks an op the rest needs): llama.cpp finishes it here
            return int(llama_cpp.llama_sampler_sample(self.handle, engine.ctx, row))
        if self.argmax:
            return int(logits(engine, row).argmax())
        if self.top_k > 0:
            view = logits(engine, row)
            keep = top_candidates(view, self.top_k)
            if keep is not None:
                return self.draw(view, keep)
        return int(llama_cpp.llama_sampler_sample(self.handle, engine.ctx, row))

    def draw(self, row: Any, keep: Any) -> int:
        """Sample (and accept) a token from the logits ``row`` gives the
        tokens ``keep``, as llama.cpp's `llama_sampler_sample` does from a
        batch's row (there, every token): the chain applied to them as
        candidates, the token it selects accepted."""
        n = len(keep)
        kept = self._candidates
        if kept is None or len(kept.data) < n:
            kept = self._candidates = _Candidates(max(n, 1024))
        kept.ids[:n] = keep
        kept.logits[:n] = row[keep]
        kept.p[:n] = 0.0
        candidates = kept.array
        candidates.size, candidates.selected, candidates.sorted = n, -1, False
        llama_cpp.llama_sampler_apply(self.handle, kept.ref)
        if not 0 <= candidates.selected < n:
            raise EngineError("llama.cpp's sampler chain selected no token")
        token = int(kept.ids[candidates.selected])
        llama_cpp.llama_sampler_accept(self.handle, token)
        return token

    def accept(self, token: int) -> None:
        llama_cpp.llama_sampler_accept(self.handle, token)

    def close(self) -> None:
        if self._engine is not None:  # detached before it is freed: the context must not keep a freed chain
            if self._engine.ctx is not None:  # (a closed engine freed its context, and the attachment with it)
                llama_cpp.llama_set_sampler(self._engine.ctx, self._seq_id, None)
            self._engine = None
        if self.handle:
            llama_cpp.llama_sampler_free(self.handle)
            self.handle = None

    def __del__(self) -> None:
        self.close()
