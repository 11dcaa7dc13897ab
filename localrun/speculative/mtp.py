"""MTP drafting: the model's own multi-token-prediction ("nextn") head drafts
for it, in a context of its own on the same weights (`nextn.py`).

The head at position p takes the token x_p and the target's final hidden
row h_(p-1) and predicts x_(p+1); chained, its own row stands in for the
target's next one. So the drafter keeps, by position, the rows the target
computed (`on_decode`: every decode of the target's sequence is reported,
and the rows are copied before the next decode overwrites them), and the
head's KV cache holds entries (x_q, h_(q-1)) for the context up to the
pending token x at pos0:

    catch-up and seed, one batch   (x_q, h_(q-1)) for q up to pos0, logits at pos0 -> d1, g1
    then, chained                  (d_i, g_i) at pos0 + i -> d_(i+1), g_(i+1)
    then the drafted entries go    (the cache keeps (x, h_(pos0-1)) at pos0: exact)

The target verifies [x, d1..dn] as with any drafter, so its rows for the
accepted tokens arrive with that batch, and the next draft's batch catches
the head up on them. A row is used only where the tokens it followed are
the context's (a row is a function of its prefix): rejected drafts, a
restored prefix, another generation's text never feed the head. The head
takes the prompt when a generation begins; where the rows of a stretch are
missing (a prefix restored without decoding, a prompt longer than
`ROWS_KEPT`), or the head fell more than `CATCH_UP_MAX` tokens behind while
the controller decoded plainly, its cache starts over after the gap: its
drafts are a little worse there, never wrong, since the target checks every
one.

Drafts are the head's argmax (deterministic drafts: with temperature the
target samples each row as it would without a draft, so a seeded run writes
plain decoding's text).
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence

import llama_cpp
import numpy as np

from localrun.errors import EngineError, MTPUnavailableError
from localrun.gguf.reader import GGUFInfo
from localrun.runtime.decoder import common_prefix
from localrun.runtime.engine import Engine
from localrun.runtime.llama import DecodeStatus
from localrun.runtime.sampling import SamplingParams
from localrun.speculative.base import MODEL_MAX, Draft, Mask, Offer, Profile
from localrun.speculative.draftmodel import CATCH_UP_GUESS
from localrun.speculative.nextn import StateBatch, mtp_context, nextn

ROWS_KEPT = 512  # the target's latest rows kept (a ring): a longer catch-up starts the head's cache over
# a head further behind than this when it drafts (the drafters rested while the target decoded) starts
# over this far back: so the catch-up the controller weighs stays short, and a rest never rules the head out
CATCH_UP_MAX = 32
DRAFT_BATCH = 512  # the MTP context's batch: a longer catch-up is decoded in pieces
MTP_PRIOR = (0.6,)  # a guess until measured: an MTP head's first draft is right more often than its later ones


def mtp_refused(engine: Engine) -> str | None:
    """Why ``engine`` cannot draft with MTP, or None."""
    if engine.info.nextn_layers < 1:
        return f"{engine.info.path.name} has no MTP (nextn) layers"
    if not engine.info.mtp_head:
        return f"drafting with the MTP layers of a {engine.info.architecture} model is not supported (Qwen3.5's are)"
    if engine.mtp_layers < 1:
        return f"{engine.info.path.name} was loaded without its MTP layers"
    return None


def mtp_bytes(info: GGUFInfo) -> tuple[int, int]:
    """(the weights an MTP step reads: its blocks and the output layer it
    shares; those a target step reads): their ratio is the step's cost."""
    blocks = info.arch_value("block_count", 0)
    first = (blocks if isinstance(blocks, int) else 0) - info.nextn_layers
    head = sum(t.n_bytes for t in info.tensors if _block(t.name) >= first)
    by_name = {t.name: t.n_bytes for t in info.tensors}
    output = by_name.get("output.weight", by_name.get("token_embd.weight", 0))
    total = sum(by_name.values())
    return head + output, max(total - head, 1)


def _block(name: str) -> int:
    parts = name.split(".")
    return int(parts[1]) if len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit() else -1


class _Held:
    """Tokens by position, and how many leading ones agree with the context
    last compared: a generation's context only grows, so each comparison
    goes on from where the last one stopped."""

    __slots__ = ("agree", "tokens")

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.agree = 0

    def cut(self, pos: int) -> None:
        del self.tokens[pos:]
        self.agree = min(self.agree, pos)

    def agreement(self, context: Sequence[int]) -> int:
        k, tokens = self.agree, self.tokens
        if k and (k > len(context) or tokens[k - 1] != context[k - 1]):
            k = 0  # not the context compared last: from the start
        self.agree = k = k + common_prefix(tokens[k:], context[k:])
        return k


class MTPDrafter:
    """The target's MTP head as a drafter (see the module's docstring).
    Raises `MTPUnavailableError` where the engine cannot draft with one."""

    def __init__(self, target: Engine, *, p_min: float = 0.0) -> None:
        refused = mtp_refused(target)
        if refused is not None:
            raise MTPUnavailableError(
                f"--spec mtp cannot run here: {refused}", hint="--spec auto or lookup (or leave --spec out)"
            )
        self.calls = nextn()
        self.target = target
        self.p_min = p_min  # stop drafting where the head's own top probability falls below it (0: never)
        self.n_embd = int(llama_cpp.llama_model_n_embd_out(target.model))
        self.n_vocab = target.n_vocab
        self._threads = target.threads
        n_batch = min(target.n_batch, DRAFT_BATCH)
        self.ctx = mtp_context(target, n_batch=n_batch)
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        try:
            self.batch = StateBatch(self.ctx, self.n_embd)
        except BaseException:
            llama_cpp.llama_free(self.ctx)
            raise
        self.n_batch = n_batch
        self.calls.stage(target.ctx)
        self.calls.stage(self.ctx)
        self.rows = np.zeros((ROWS_KEPT, self.n_embd), dtype=np.float32)  # the target's rows, by position % ROWS_KEPT
        self.row_pos = np.full(ROWS_KEPT, -1, dtype=np.int64)  # the position each slot holds (-1: none)
        self._top = -1  # the last position a row was kept for (a decode appending after it clears nothing)
        self._row_bytes = self.n_embd * 4
        self._zero = np.zeros(self.n_embd, dtype=np.float32)  # the state before the first position
        self.seen = _Held()  # what the target's sequence held at its last decode
        self.fed = _Held()  # the context the head's cache follows, up to its last entry
        self.fed_start = 0  # the head cache's first position (it starts over after a gap)
        self.max_len = max(1, min(MODEL_MAX, target.cuts.room))  # a recurrent target takes back so many
        head, rest = mtp_bytes(target.info)
        ratio = head / rest  # a step reads the head's weights once: its cost follows their size
        self.profile = Profile(
            name="mtp",
            step_cost=ratio,
            catch_up_cost=ratio * CATCH_UP_GUESS,
            setup_s=0.0,
            acceptance=MTP_PRIOR,
            free=False,
        )
        target.on_decode = self._decoded

    # -- the target's rows --

    def _decoded(self, tokens: Sequence[int], start: int) -> None:
        """The target decoded ``tokens[start:]`` at their positions: keep their rows."""
        seen = self.seen
        held = min(len(seen.tokens), start)
        if held and seen.tokens[held - 1] != tokens[held - 1]:  # a prefix restored without decoding
            held = common_prefix(seen.tokens, tokens, held)
        seen.cut(held)
        if self._top >= held:  # rows past the batch's start, or of a gap, are not this text's
            self.row_pos[self.row_pos >= held] = -1
        self._top = len(tokens) - 1
        seen.tokens.extend(tokens[held:])
        end = len(tokens)
        n = end - start
        k = min(n, ROWS_KEPT)
        src = ctypes.cast(self.calls.get_embeddings(self.target.ctx), ctypes.c_void_p).value
        if not src or k < 1:
            return
        src += (n - k) * self._row_bytes
        dst = self.rows.ctypes.data
        first = end - k
        slot = first % ROWS_KEPT
        run = min(k, ROWS_KEPT - slot)
        ctypes.memmove(dst + slot * self._row_bytes, src, run * self._row_bytes)
        if run < k:  # the ring wraps
            ctypes.memmove(dst, src + run * self._row_bytes, (k - run) * self._row_bytes)
        if k == 1:
            self.row_pos[slot] = first
        else:
            positions = np.arange(first, end, dtype=np.int64)
            self.row_pos[positions % ROWS_KEPT] = positions

    def _state(self, q: int, agree: int) -> np.ndarray | None:
        """The state of the head's entry at ``q``: the target's row at q - 1,
        where it followed the context (``agree``: how far the rows do)."""
        if q == 0:
            return self._zero
        p = q - 1
        slot = p % ROWS_KEPT
        return self.rows[slot] if p < agree and self.row_pos[slot] == p else None

    # -- the drafter --

    def begin(self, context: Sequence[int]) -> None:
        """A generation starts after ``context``, which the target has just
        evaluated: the head takes it now (up to `ROWS_KEPT` tokens, in a batch
        as long as the prompt's, as llama.cpp's server feeds its head), so
        that the first draft has the prompt behind it."""
        self.seen.agree = self.fed.agree = 0  # another text: compared from the start
        last = len(context) - 1
        agree = self.seen.agreement(context)
        if last >= 0 and self._state(last, agree) is not None:
            try:
                self._seed(context, self._catch_up_from(context, last, agree, ROWS_KEPT), last, agree)
            except EngineError:  # the generation goes on: the head catches up when it drafts, or is disabled then
                self._reset()

    def offer(self, context: Sequence[int], index: int) -> Offer | None:
        pos0 = len(context) - 1
        if pos0 < 1 or self._state(pos0, self.seen.agreement(context)) is None:
            return None  # no target row before the pending token (tokens the grammar forced, say)
        fed = min(self.fed.agreement(context), pos0)
        return Offer(index, 0, self.max_len, catch_up=min(pos0 - fed, CATCH_UP_MAX) + 1)

    def draft(
        self,
        context: Sequence[int],
        n: int,
        sampling: SamplingParams,
        rng: np.random.Generator,
        mask: Mask | None = None,
    ) -> Draft:
        """Up to ``n`` tokens after ``context``: the head's argmax at each
        step, among what ``mask`` allows."""
        t0 = time.perf_counter()
        pos0 = len(context) - 1
        agree = self.seen.agreement(context)
        if self._state(pos0, agree) is None:
            return Draft([], None, 0, time.perf_counter() - t0)
        if self.target.threads != self._threads:  # the target's thread governor speaks for both
            self._threads = self.target.threads
            llama_cpp.llama_set_n_threads(self.ctx, self._threads, self._threads)
        first = self._catch_up_from(context, pos0, agree, CATCH_UP_MAX)
        idx = self._seed(context, first, pos0, agree)
        t1 = time.perf_counter()
        tokens = self._chain(idx, pos0, n, mask) if idx >= 0 else []
        llama_cpp.llama_memory_seq_rm(self.memory, 0, pos0 + 1, -1)  # drafted entries carried the head's states
        return Draft(tokens, None, pos0 - first, t1 - t0, time.perf_counter() - t1)

    def _chain(self, idx: int, pos0: int, n: int, mask: Mask | None) -> list[int]:
        """Up to ``n`` tokens from the head, its logits first read at ``idx``
        of the last batch, each step's own row the next one's state."""
        tokens: list[int] = []
        for i in range(n):
            found = llama_cpp.llama_get_logits_ith(self.ctx, idx)
            if not found:
                raise EngineError(f"llama.cpp kept no logits for entry {idx} of the MTP context's batch")
            logits = np.ctypeslib.as_array(found, shape=(self.n_vocab,))
            if mask is not None:
                if mask.stopped:
                    break
                mask.apply(logits)  # the MTP context's own buffer: nothing else reads it
            token = int(np.argmax(logits))
            if self.p_min and i and 1.0 / float(np.exp(logits - logits[token]).sum()) < self.p_min:
                break
            tokens.append(token)
            if mask is not None:
                mask.consume(token)
            if i + 1 == n:
                break
            state = self.calls.row(self.ctx, idx, self.n_embd)  # the head's own row: the chain's next state
            self.batch.clear()
            idx = self.batch.add(token, pos0 + i + 1, state, True)
            if self.batch.decode() != DecodeStatus.OK:
                break
        return tokens

    def _catch_up_from(self, context: Sequence[int], pos0: int, agree: int, limit: int) -> int:
        """The first position the head's cache needs an entry for, so that it
        holds every position from its start to ``pos0``; where the target's
        rows leave a gap after what it holds, or it would take more than
        ``limit`` entries before ``pos0``, it starts over past the gap, or
        ``limit`` back."""
        valid = min(self.fed.agreement(context), pos0)  # its entries before this followed the context
        first = pos0
        floor = max(valid, pos0 - limit)
        while first > floor and self._state(first - 1, agree) is not None:
            first -= 1
        if first == valid and valid > self.fed_start:
            llama_cpp.llama_memory_seq_rm(self.memory, 0, valid, -1)
        else:
            llama_cpp.llama_memory_seq_rm(self.memory, 0, -1, -1)
            self.fed_start = first
        self.fed.cut(valid)  # what follows is the context's from here (`_seed`)
        return first

    def _seed(self, context: Sequence[int], first: int, pos0: int, agree: int) -> int:
        """Decode the head's entries from ``first`` to ``pos0``, with logits
        at ``pos0``: their index in the last batch, or -1 when a decode failed
        (its cache is then emptied)."""
        idx = -1
        for start in range(first, pos0 + 1, self.n_batch):
            self.batch.clear()
            for q in range(start, min(start + self.n_batch, pos0 + 1)):
                idx = self.batch.add(context[q], q, self._state(q, agree), q == pos0)
            if self.batch.decode() != DecodeStatus.OK:
                self._reset()
                return -1
        self.fed.tokens.extend(context[len(self.fed.tokens) : pos0 + 1])
        self.fed.agree = pos0 + 1
        return idx

    def _reset(self) -> None:
        """Empty the head's cache."""
        llama_cpp.llama_memory_seq_rm(self.memory, 0, -1, -1)
        self.fed.cut(0)

    def close(self) -> None:
        target = self.target
        if target.on_decode == self._decoded:  # (a drafter made since has taken the hook: it keeps the rows)
            target.on_decode = None
            if target.ctx:
                self.calls.set_embeddings(target.ctx, False, False)  # the target stops making rows for it
        self.batch.close()
        if self.ctx:
            ctx, self.ctx = self.ctx, None
            llama_cpp.llama_free(ctx)

    def __repr__(self) -> str:  # the profile, not the arrays
        return f"MTPDrafter({self.target.info.path.name}, step_cost={self.profile.step_cost:.3f})"
