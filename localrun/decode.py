"""The token loop, on llama.cpp's low-level API.

`Decoder` holds the seams the loop is built from (evaluate a batch, sample a
row with llama.cpp's native sampler chain, roll the KV cache back to a
position); `generate` runs prompt evaluation and the per-token loop and yields
events. Per token, Python does one native sample, one native decode, a cached
piece lookup and the stop-string check: no logits copies.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp

from localrun.engine import Engine
from localrun.errors import EngineError
from localrun.events import DoneEvent, Event, Stats, StopReason, TokenEvent

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
    """llama.cpp's native sampler chain for one generation."""

    def __init__(self, params: SamplingParams) -> None:
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        add = llama_cpp.llama_sampler_chain_add
        if params.repeat_penalty != 1.0:
            add(chain, llama_cpp.llama_sampler_init_penalties(params.repeat_last_n, params.repeat_penalty, 0.0, 0.0))
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
        self.handle: Any = chain

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
        self.n_past = 0
        self._one = (llama_cpp.llama_token * 1)()
        self._one_batch = llama_cpp.llama_batch_get_one(self._one, 1)

    def evaluate(self, tokens: Sequence[int]) -> int:
        """Decode ``tokens`` at the current position; logits only for the last.
        Returns llama_decode's status: 0 ok, 1 context full, 2 aborted."""
        ctx = self.engine.ctx
        if len(tokens) == 1:
            self._one[0] = tokens[0]
            status = llama_cpp.llama_decode(ctx, self._one_batch)
            if status == _DECODE_OK:
                self.n_past += 1
            return self._check(status)
        step = self.engine.n_batch
        with self.engine.abortable():
            for start in range(0, len(tokens), step):
                chunk = tokens[start : start + step]
                arr = (llama_cpp.llama_token * len(chunk))(*chunk)
                status = llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(chunk)))
                if status != _DECODE_OK:
                    return self._check(status)
                self.n_past += len(chunk)
        return _DECODE_OK

    def evaluate_rows(self, tokens: Sequence[int]) -> int:
        """Decode ``tokens`` (at most n_batch) at the current position with
        logits for every row: what a verify step or a perplexity run needs.
        Read them with `logits`."""
        n = len(tokens)
        if not 0 < n <= self.engine.n_batch:
            raise ValueError(f"evaluate_rows takes 1 to {self.engine.n_batch} tokens, got {n}")
        batch = llama_cpp.llama_batch_init(n, 0, 1)
        try:
            for i, token in enumerate(tokens):
                batch.token[i] = token
                batch.pos[i] = self.n_past + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = True
            batch.n_tokens = n
            with self.engine.abortable():
                status = self._check(llama_cpp.llama_decode(self.engine.ctx, batch))
        finally:
            llama_cpp.llama_batch_free(batch)
        if status == _DECODE_OK:
            self.n_past += n
        return status

    def logits(self, row: int) -> Any:
        """The logits of ``row`` of the last batch, as a numpy view (no copy)."""
        import numpy as np

        ptr = llama_cpp.llama_get_logits_ith(self.engine.ctx, row)
        return np.ctypeslib.as_array(ptr, shape=(self.engine.n_vocab,))

    @staticmethod
    def _check(status: int) -> int:
        if status < 0:
            raise EngineError(f"llama_decode failed with status {status}")
        return status

    def sample(self, sampler: Sampler, row: int = -1) -> int:
        """Sample (and accept) a token from the logits of ``row`` of the last batch."""
        return int(llama_cpp.llama_sampler_sample(sampler.handle, self.engine.ctx, row))

    def rollback(self, pos: int) -> None:
        """Forget every cell from ``pos`` on, so decoding continues at ``pos``."""
        llama_cpp.llama_memory_seq_rm(self.engine.memory, 0, pos, -1)
        self.n_past = min(self.n_past, pos)


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


def generate(
    engine: Engine,
    prompt_tokens: Sequence[int],
    sampling: SamplingParams,
    *,
    max_tokens: int | None = None,
    stop: Sequence[str] = (),
    ignore_eos: bool = False,
) -> Iterator[Event]:
    """Evaluate the prompt, then sample until end of generation, ``max_tokens``,
    a stop string, a full context, or ``engine.abort_requested``."""
    engine.check_fits(len(prompt_tokens))
    decoder = Decoder(engine)
    decoder.rollback(0)
    sampler = Sampler(sampling)
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    matcher = StopMatcher(stop)
    limit = engine.n_ctx - len(prompt_tokens)
    if max_tokens is not None:
        limit = min(limit, max_tokens)

    clock = time.perf_counter
    t_start = clock()
    reason: StopReason = "length"
    n_gen = 0
    ttft = 0.0
    t_first = t_last = t_start
    try:
        status = decoder.evaluate(prompt_tokens) if limit > 0 else _DECODE_OK
        t_prompt = clock() - t_start
        if status == _DECODE_ABORTED:
            reason = "interrupted"
        while status == _DECODE_OK and n_gen < limit:
            if engine.abort_requested:
                reason = "interrupted"
                break
            token = decoder.sample(sampler)
            t_last = clock()
            if n_gen == 0:
                t_first = t_last
                ttft = t_last - t_start
            if engine.is_eog(token) and not ignore_eos:
                reason = "eos"
                break
            n_gen += 1
            text, hit = matcher.feed(utf8.decode(engine.piece(token)))
            if text:
                rate = (n_gen - 1) / (t_last - t_first) if n_gen > 1 else 0.0
                yield TokenEvent(text, n_gen, ttft, t_last - t_start, rate)
            if hit:
                reason = "stop"
                break
            if n_gen >= limit:
                break
            status = decoder.evaluate((token,))
            if status == _DECODE_ABORTED:
                reason = "interrupted"
            elif status == _DECODE_NO_SLOT:
                reason = "length"
        if reason != "stop":
            tail = matcher.flush() + utf8.decode(b"", final=True)
            if tail:
                yield TokenEvent(tail, n_gen, ttft, t_last - t_start, 0.0)
    finally:
        sampler.close()
    elapsed = clock() - t_start
    decode_rate = (n_gen - 1) / (t_last - t_first) if n_gen > 1 and t_last > t_first else 0.0
    prompt_rate = len(prompt_tokens) / t_prompt if limit > 0 and t_prompt > 0 else 0.0
    yield DoneEvent(
        Stats(
            prompt_tokens=len(prompt_tokens),
            generated_tokens=n_gen,
            ttft_s=ttft,
            decode_tokens_per_s=decode_rate,
            elapsed_s=elapsed,
            stop_reason=reason,
            prompt_tokens_per_s=prompt_rate,
        )
    )
