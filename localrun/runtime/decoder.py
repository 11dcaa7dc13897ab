"""One sequence's KV cache on an engine: evaluate tokens, read a row's
logits, roll back to a position, reuse what the cache already holds.

On a recurrent or hybrid model the memory refuses most cuts
(`localrun.runtime.memory`): a rollback or a reuse it refuses restores the
nearest recurrent-state checkpoint, or clears the sequence, and evaluates
from there, so nothing ever decodes after a refused cut.

After each decode that succeeds, the engine's `on_decode` hook, if one is
set, is told what the sequence holds and where the batch began, before the
next decode overwrites the batch's outputs (an MTP drafter copies the rows
it reads there)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import llama_cpp

from localrun.runtime.llama import Batch, DecodeStatus, decode
from localrun.runtime.memory import Checkpoints
from localrun.runtime.sampling import Sampler, logits

if TYPE_CHECKING:
    from localrun.runtime.engine import Engine


def common_prefix(a: Sequence[Any], b: Sequence[Any], limit: int | None = None) -> int:
    """How many leading items ``a`` and ``b`` share (at most ``limit``)."""
    n = min(len(a), len(b)) if limit is None else min(len(a), len(b), limit)
    k = 0
    while k < n and a[k] == b[k]:
        k += 1
    return k


class Decoder:
    """Sequence 0 of an engine's context: what its KV cache holds, position by
    position, and the seams a decode loop is built from."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.tokens: list[int] = []  # what the KV cache holds, position by position
        self.cuts = engine.cuts
        self.checkpoints = Checkpoints(engine.ctx, engine.cuts)  # used where the memory is recurrent
        self._one = (llama_cpp.llama_token * 1)()
        self._one_batch = llama_cpp.llama_batch_get_one(self._one, 1)

    def evaluate(self, tokens: Sequence[int]) -> DecodeStatus:
        """Decode ``tokens`` at the current position; logits only for the last."""
        if len(tokens) == 1:
            self._one[0] = tokens[0]
            status = decode(self.engine, self._one_batch)
            if status == DecodeStatus.OK:
                self.tokens.append(tokens[0])
                if self.cuts.recurrent:
                    self.cuts.decoded(0, 1)
                if self.engine.on_decode is not None:
                    self.engine.on_decode(self.tokens, len(self.tokens) - 1)
            return status
        step = self.engine.n_batch
        for start in range(0, len(tokens), step):
            chunk = tokens[start : start + step]
            arr = (llama_cpp.llama_token * len(chunk))(*chunk)
            status = decode(self.engine, llama_cpp.llama_batch_get_one(arr, len(chunk)), abortable=True)
            if status != DecodeStatus.OK:
                return status
            self.tokens.extend(chunk)
            self.cuts.decoded(0, len(chunk))
            if self.engine.on_decode is not None:  # each chunk: the next one overwrites its rows
                self.engine.on_decode(self.tokens, len(self.tokens) - len(chunk))
        return DecodeStatus.OK

    def evaluate_rows(self, tokens: Sequence[int], *, abortable: bool = True, first: int = 0) -> DecodeStatus:
        """Decode ``tokens`` (at most n_batch) at the current position with
        logits for every row from ``first`` on: what a verify step or a
        perplexity run needs (rows before ``first``, tokens already decided,
        skip the output layer). Read them with `logits` by their row in the
        batch. ``abortable=False`` for a short batch: the abort check is a
        Python callback between graph nodes, which costs."""
        n = len(tokens)
        if not 0 < n <= self.engine.n_batch or not 0 <= first < n:
            raise ValueError(f"evaluate_rows takes 1 to {self.engine.n_batch} tokens and a row of them, got {n}")
        with Batch(n) as batch:
            for i, token in enumerate(tokens):
                batch.add(token, len(self.tokens) + i, 0, i >= first)
            status = batch.decode(self.engine, abortable=abortable)
        if status == DecodeStatus.OK:
            self.tokens.extend(tokens)
            self.cuts.decoded(0, n)
            if self.engine.on_decode is not None:
                self.engine.on_decode(self.tokens, len(self.tokens) - n)
        return status

    def logits(self, row: int) -> Any:
        """The logits of ``row`` of the last batch, as a numpy view (no copy)."""
        return logits(self.engine, row)

    def sample(self, sampler: Sampler, row: int = -1) -> int:
        """Sample (and accept) a token from the logits of ``row`` of the last batch."""
        return sampler.sample(self.engine, row)

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def rollback(self, pos: int) -> DecodeStatus:
        """Forget every cell from ``pos`` on, so decoding continues at ``pos``.
        Where the memory refuses the cut, the sequence is restored from a
        checkpoint (or cleared) and evaluated up to ``pos`` again; a status
        other than OK says that evaluation stopped short (`tokens` says how far it got)."""
        pos = min(pos, len(self.tokens))
        if pos == len(self.tokens) and self.cuts.held(0) <= pos:
            return DecodeStatus.OK  # nothing to forget (a failed batch may have left cells past the tokens)
        wanted = self.tokens[:pos]
        held = self._cut(wanted, pos)
        return self.evaluate(wanted[held:])

    def _cut(self, tokens: Sequence[int], keep: int) -> int:
        """Cut the sequence back to ``keep`` tokens, which ``tokens`` starts
        with (or, where the memory refuses, to a checkpoint or nothing: see
        `Checkpoints.cut`); how many it holds then."""
        held = self.checkpoints.cut(0, tokens, keep)
        del self.tokens[held:]
        return held

    def reusable(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the KV cache already holds, leaving at
        least one to evaluate (its logits are what the next sample reads)."""
        return common_prefix(self.tokens, tokens, len(tokens) - 1)

    def prefill(
        self, tokens: Sequence[int], checkpoint: StoredPrefix | None = None, marks: Sequence[int] = ()
    ) -> tuple[DecodeStatus, int]:
        """Make the KV cache hold exactly ``tokens``, evaluating only what
        differs from what it holds. With a ``checkpoint`` (a stored state of a
        prefix of ``tokens``), the prefix is restored from it, or evaluated and
        stored. ``marks``: positions a later prompt is expected to share (a
        chat's history before its generation prompt), where a recurrent
        memory keeps a checkpoint. Returns (the decode status, tokens not
        evaluated here)."""
        evaluated = 0
        if checkpoint is not None and self.reusable(tokens) < checkpoint.length and not checkpoint.restore(self):
            keep = self._cut(tokens, self.reusable(tokens[: checkpoint.length + 1]))
            status = self.evaluate(tokens[keep : checkpoint.length])
            evaluated += checkpoint.length - keep
            if status != DecodeStatus.OK:
                return status, len(tokens) - evaluated
            checkpoint.save(self)
        keep = self._cut(tokens, self.reusable(tokens))
        start = keep
        if self.cuts.recurrent:
            for mark in sorted(m for m in marks if keep < m <= len(tokens)):
                status = self.evaluate(tokens[start:mark])
                if status != DecodeStatus.OK:
                    return status, keep - evaluated
                self.checkpoints.save(0, tokens[:mark])
                start = mark
        return self.evaluate(tokens[start:]), keep - evaluated


class StoredPrefix(Protocol):
    """A stored KV state of a prompt's prefix (see localrun.runtime.promptcache)."""

    @property
    def length(self) -> int: ...

    @property
    def outcome(self) -> str | None: ...  # "hit" or "miss" once used

    def restore(self, decoder: Decoder) -> bool: ...

    def save(self, decoder: Decoder) -> None: ...
