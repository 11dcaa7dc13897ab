"""The token loop, on llama.cpp's low-level API.

`Decoder` holds the seams the loop is built from (evaluate a batch, sample a
row with llama.cpp's native sampler chain, roll the KV cache back to a
position); `generate` runs prompt evaluation and the per-token loop and yields
events. Per token, Python does one sample (greedy: an argmax over a numpy
view of the logits; else llama.cpp's chain), one native decode, a cached
piece lookup and the stop-string check: no logits copies.
"""

from __future__ import annotations

import codecs
import ctypes
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import llama_cpp
import numpy as np

from localrun.errors import EngineError
from localrun.events import DoneEvent, Event, Stats, StopReason, TokenEvent
from localrun.runtime.engine import Engine

_DECODE_OK, _DECODE_NO_SLOT, _DECODE_ABORTED = 0, 1, 2


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


class Sampler:
    """llama.cpp's native sampler chain for one generation. A chain that is a
    plain argmax (greedy, no penalties) is flagged `argmax`: `Decoder.sample`
    then reads the maximum off the logits itself, skipping the chain's copy
    of the whole vocabulary into a candidates array (0.14 ms a token on a
    49k vocabulary, 0.44 ms on 152k, measured here). Ties go to the lowest
    id, as in llama.cpp's greedy sampler."""

    def __init__(self, params: SamplingParams, n_vocab: int) -> None:
        self.handle: Any = None
        self.argmax = params.greedy and params.repeat_penalty == 1.0
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        add = llama_cpp.llama_sampler_chain_add
        if params.repeat_penalty != 1.0:
            penalties = llama_cpp.llama_sampler_init_penalties(
                n_vocab, params.repeat_last_n, params.repeat_penalty, 0.0, 0.0
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

    def accept(self, token: int) -> None:
        llama_cpp.llama_sampler_accept(self.handle, token)

    def close(self) -> None:
        if self.handle:
            llama_cpp.llama_sampler_free(self.handle)
            self.handle = None

    def __del__(self) -> None:
        self.close()


class Decoder:
    """Sequence 0 of an engine's context: its position and the three seams."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.tokens: list[int] = []  # what the KV cache holds, position by position
        self._one = (llama_cpp.llama_token * 1)()
        self._one_batch = llama_cpp.llama_batch_get_one(self._one, 1)
        self._row_type = ctypes.c_float * engine.n_vocab

    def evaluate(self, tokens: Sequence[int]) -> int:
        """Decode ``tokens`` at the current position; logits only for the last.
        Returns llama_decode's status: 0 ok, 1 context full, 2 aborted."""
        ctx = self.engine.ctx
        if len(tokens) == 1:
            self._one[0] = tokens[0]
            status = llama_cpp.llama_decode(ctx, self._one_batch)
            if status == _DECODE_OK:
                self.tokens.append(tokens[0])
            return self._check(status)
        step = self.engine.n_batch
        with self.engine.abortable():
            for start in range(0, len(tokens), step):
                chunk = tokens[start : start + step]
                arr = (llama_cpp.llama_token * len(chunk))(*chunk)
                status = llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(chunk)))
                if status != _DECODE_OK:
                    return self._check(status)
                self.tokens.extend(chunk)
        return _DECODE_OK

    def evaluate_rows(self, tokens: Sequence[int], *, abortable: bool = True) -> int:
        """Decode ``tokens`` (at most n_batch) at the current position with
        logits for every row: what a verify step or a perplexity run needs.
        Read them with `logits`. ``abortable=False`` for a short batch: the
        abort check is a Python callback between graph nodes, which costs."""
        n = len(tokens)
        if not 0 < n <= self.engine.n_batch:
            raise ValueError(f"evaluate_rows takes 1 to {self.engine.n_batch} tokens, got {n}")
        batch = llama_cpp.llama_batch_init(n, 0, 1)
        try:
            for i, token in enumerate(tokens):
                batch.token[i] = token
                batch.pos[i] = len(self.tokens) + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = True
            batch.n_tokens = n
            if abortable:
                with self.engine.abortable():
                    status = self._check(llama_cpp.llama_decode(self.engine.ctx, batch))
            else:
                status = self._check(llama_cpp.llama_decode(self.engine.ctx, batch))
        finally:
            llama_cpp.llama_batch_free(batch)
        if status == _DECODE_OK:
            self.tokens.extend(tokens)
        return status

    def logits(self, row: int) -> Any:
        """The logits of ``row`` of the last batch, as a numpy view (no copy)."""
        ptr = llama_cpp.llama_get_logits_ith(self.engine.ctx, row)
        address = ctypes.cast(ptr, ctypes.c_void_p).value
        if not address:
            raise EngineError(f"llama.cpp has no logits for row {row} of the last batch")
        row_buffer: Any = self._row_type.from_address(address)  # a ctypes array: a buffer numpy can view
        return np.frombuffer(row_buffer, dtype=np.float32)

    @staticmethod
    def _check(status: int) -> int:
        if status < 0:
            raise EngineError(f"llama_decode failed with status {status}")
        return status

    def sample(self, sampler: Sampler, row: int = -1) -> int:
        """Sample (and accept) a token from the logits of ``row`` of the last batch."""
        if sampler.argmax:
            return int(self.logits(row).argmax())
        return int(llama_cpp.llama_sampler_sample(sampler.handle, self.engine.ctx, row))

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def rollback(self, pos: int) -> None:
        """Forget every cell from ``pos`` on, so decoding continues at ``pos``."""
        llama_cpp.llama_memory_seq_rm(self.engine.memory, 0, pos, -1)
        del self.tokens[pos:]

    def reusable(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the KV cache already holds, leaving at
        least one to evaluate (its logits are what the next sample reads)."""
        limit = min(len(self.tokens), len(tokens) - 1)
        n = 0
        while n < limit and self.tokens[n] == tokens[n]:
            n += 1
        return n

    def prefill(self, tokens: Sequence[int], checkpoint: Checkpoint | None = None) -> tuple[int, int]:
        """Make the KV cache hold exactly ``tokens``, evaluating only what
        differs from what it holds. With a ``checkpoint`` (a stored state of a
        prefix of ``tokens``), the prefix is restored from it, or evaluated and
        stored. Returns (llama_decode status, tokens not evaluated here)."""
        evaluated = 0
        if checkpoint is not None and self.reusable(tokens) < checkpoint.length and not checkpoint.restore(self):
            keep = self.reusable(tokens[: checkpoint.length + 1])
            self.rollback(keep)
            status = self.evaluate(tokens[keep : checkpoint.length])
            evaluated += checkpoint.length - keep
            if status != _DECODE_OK:
                return status, len(tokens) - evaluated
            checkpoint.save(self)
        keep = self.reusable(tokens)
        self.rollback(keep)
        return self.evaluate(tokens[keep:]), keep - evaluated


class Checkpoint(Protocol):
    """A stored KV state of a prompt's prefix (see localrun.promptcache)."""

    @property
    def length(self) -> int: ...

    def restore(self, decoder: Decoder) -> bool: ...

    def save(self, decoder: Decoder) -> None: ...


class StopMatcher:
    """Holds back text that could be the start of a stop string."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Returns (text safe to emit, whether a stop string was reached)."""
        if not self.stops:
            return text, False
        buf = self.pending + text
        cut = min((i for i in (buf.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.pending = ""
            return buf[:cut], True
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), 0, -1):
                if buf.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        self.pending = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold], False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


class TokenOutput:
    """One sequence's way from sampled tokens to events: bytes to text (UTF-8
    across token boundaries), stop strings, counts, timing and the final Stats.
    Every loop (plain, speculative, batched) feeds it the tokens it accepts."""

    def __init__(self, engine: Engine, *, n_prompt: int, stop: Sequence[str] = (), ignore_eos: bool = False) -> None:
        self.engine = engine
        self.n_prompt = n_prompt
        self.ignore_eos = ignore_eos
        self.matcher = StopMatcher(stop)
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.n_gen = 0
        self.n_cached = 0
        self.reason: StopReason | None = None
        self.t_start = time.perf_counter()
        self.t_prompt = 0.0
        self.t_first = self.t_last = self.t_start
        self.ttft = 0.0
        self.text_parts: list[str] = []
        self.tokens: list[int] = []  # the generated tokens, end of generation excluded

    def prompt_done(self, n_cached: int = 0) -> None:
        """The prompt is evaluated (``n_cached`` of its tokens were already in the cache)."""
        self.t_prompt = time.perf_counter() - self.t_start
        self.n_cached = n_cached

    def push(self, token: int) -> TokenEvent | None:
        """Account for one accepted token; sets `reason` when it ends the sequence
        (end of generation or a stop string). Returns the text event, if any."""
        now = time.perf_counter()
        if self.n_gen == 0 and self.reason is None:
            self.t_first = now
            self.ttft = now - self.t_start
        self.t_last = now
        if self.engine.is_eog(token) and not self.ignore_eos:
            self.reason = "eos"
            return None
        self.n_gen += 1
        self.tokens.append(token)
        text, hit = self.matcher.feed(self.utf8.decode(self.engine.piece(token)))
        if hit:
            self.reason = "stop"
        if not text:
            return None
        self.text_parts.append(text)
        return TokenEvent(text, self.n_gen, self.ttft, now - self.t_start, self.decode_rate())

    def decode_rate(self) -> float:
        span = self.t_last - self.t_first
        return (self.n_gen - 1) / span if self.n_gen > 1 and span > 0 else 0.0

    def finish(self, reason: StopReason, **extra: Any) -> Iterator[Event]:
        """The held-back tail (unless a stop string cut it) and the DoneEvent.
        ``reason`` applies unless `push` already ended the sequence."""
        final: StopReason = self.reason or reason
        if final != "stop":
            tail = self.matcher.flush() + self.utf8.decode(b"", final=True)
            if tail:
                self.text_parts.append(tail)
                yield TokenEvent(tail, self.n_gen, self.ttft, self.t_last - self.t_start, 0.0)
        evaluated = self.n_prompt - self.n_cached
        yield DoneEvent(
            Stats(
                prompt_tokens=self.n_prompt,
                generated_tokens=self.n_gen,
                ttft_s=self.ttft,
                decode_tokens_per_s=self.decode_rate(),
                elapsed_s=time.perf_counter() - self.t_start,
                stop_reason=final,
                prompt_tokens_per_s=evaluated / self.t_prompt if evaluated and self.t_prompt > 0 else 0.0,
                cached_tokens=self.n_cached,
                **extra,
            )
        )

    @property
    def text(self) -> str:
        return "".join(self.text_parts)


def generate(
    engine: Engine,
    prompt_tokens: Sequence[int],
    sampling: SamplingParams,
    *,
    max_tokens: int | None = None,
    stop: Sequence[str] = (),
    ignore_eos: bool = False,
    decoder: Decoder | None = None,
    checkpoint: Checkpoint | None = None,
) -> Iterator[Event]:
    """Evaluate the prompt, then sample until end of generation, ``max_tokens``,
    a stop string, a full context, or ``engine.abort_requested``.

    With a ``decoder`` that ran before (a chat, a loaded prompt cache), only the
    part of the prompt that differs from what its KV cache holds is evaluated;
    a ``checkpoint`` restores (or stores) a prefix from a prompt cache."""
    engine.check_fits(len(prompt_tokens))
    decoder = decoder or Decoder(engine)
    sampler = Sampler(sampling, engine.n_vocab)
    out = TokenOutput(engine, n_prompt=len(prompt_tokens), stop=stop, ignore_eos=ignore_eos)
    limit = engine.n_ctx - len(prompt_tokens)
    if max_tokens is not None:
        limit = min(limit, max_tokens)
    reason: StopReason = "length"
    try:
        status = _DECODE_OK
        if limit > 0:
            status, cached = decoder.prefill(prompt_tokens, checkpoint)
            out.prompt_done(cached)
        if status == _DECODE_ABORTED:
            reason = "interrupted"
        while status == _DECODE_OK and out.n_gen < limit:
            if engine.abort_requested:
                reason = "interrupted"
                break
            token = decoder.sample(sampler)
            event = out.push(token)
            if event is not None:
                yield event
            if out.reason is not None or out.n_gen >= limit:
                break
            status = decoder.evaluate((token,))
            if status == _DECODE_ABORTED:
                reason = "interrupted"
        yield from out.finish(reason, prompt_cache=getattr(checkpoint, "outcome", None))
    finally:
        sampler.close()


class Decoding(Protocol):
    """A way to decode: plain (`PLAIN`) or speculative (`localrun.speculative.Speculation`).
    A caller chooses one and calls its `generate`."""

    @property
    def label(self) -> str: ...

    def generate(
        self,
        engine: Engine,
        prompt_tokens: Sequence[int],
        sampling: SamplingParams,
        *,
        max_tokens: int | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        decoder: Decoder | None = None,
        checkpoint: Checkpoint | None = None,
    ) -> Iterator[Event]: ...


class PlainDecoding:
    """One token per step: `generate`."""

    label = "plain"

    def generate(
        self,
        engine: Engine,
        prompt_tokens: Sequence[int],
        sampling: SamplingParams,
        *,
        max_tokens: int | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        decoder: Decoder | None = None,
        checkpoint: Checkpoint | None = None,
    ) -> Iterator[Event]:
        return generate(
            engine,
            prompt_tokens,
            sampling,
            max_tokens=max_tokens,
            stop=stop,
            ignore_eos=ignore_eos,
            decoder=decoder,
            checkpoint=checkpoint,
        )


PLAIN: Decoding = PlainDecoding()
