"""A context's memory as a decode loop must treat it: the one place a
sequence is cut back, and the checkpoints that stand in where it cannot be.

A transformer's KV cache holds one cell per token and forgets any of them
from a position on. A recurrent layer (Mamba, gated delta-net, LFM2's short
convolutions) holds one state per sequence, not one per token, so llama.cpp
can take it back only to a snapshot it kept: with a context made with
``n_rs_seq`` > 0 (on the architectures that keep them) it keeps the states
after each of the last ``n_rs_seq`` tokens of a sequence's last decode. A cut
further back, a second cut before the next decode, or one to a position that
decode never wrote is refused, or (the last) would restore a stale snapshot
and silently write the wrong text. So `Cuts.cut` decides before it asks, and
a caller whose cut is refused restores a `Checkpoint` (the recurrent state
saved at a position, `llama_state_seq_get_data_ext` with the partial flag:
the attention layers' cells stay in the cache and are cut as usual) or
evaluates the sequence again.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp

from localrun.gguf.info import ATTENTION, HYBRID, RECURRENT

_PARTIAL = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
# recurrent-state checkpoints kept per sequence: the newest ones, as llama-server's
# --ctx-checkpoints; each holds one sequence's recurrent state (`ModelInfo.recurrent_bytes`)
CHECKPOINTS = 4
# snapshots a context keeps for speculative rollback on a recurrent memory: the
# longest draft (and padding) a verify batch may then hold
ROLLBACK_DEPTH = 8


def memory_kind(model: Any) -> str:
    """attention, hybrid (attention layers beside recurrent ones) or recurrent, as llama.cpp loaded ``model``."""
    if llama_cpp.llama_model_is_hybrid(model):
        return HYBRID
    return RECURRENT if llama_cpp.llama_model_is_recurrent(model) else ATTENTION


class Cuts:
    """Which cuts a context's memory takes, decided once per decode.

    `decoded` is told each sequence's tokens in every successful decode;
    `cut` then allows a recurrent memory to go back fewer tokens than that
    decode held, at most `depth` (the context's ``n_rs_seq``), once."""

    def __init__(self, ctx: Any, model: Any, n_seq_max: int) -> None:
        self.kind = memory_kind(model)
        self.memory = llama_cpp.llama_get_memory(ctx)
        # plain attributes, not properties: a decode loop reads them every step
        self.recurrent = self.kind != ATTENTION  # whether a cut can be refused
        self.depth = int(llama_cpp.llama_n_rs_seq(ctx)) if self.recurrent else 0
        # the most tokens after a decode's first that a cut may take back: unbounded for a KV cache
        self.room = self.depth if self.recurrent else 1 << 30
        self._last = [0] * n_seq_max  # each sequence's tokens in its last decode, until a cut uses them

    def decoded(self, seq_id: int, n: int) -> None:
        """Sequence ``seq_id`` took ``n`` tokens in a decode that succeeded."""
        self._last[seq_id] = n

    def held(self, seq_id: int) -> int:
        """How many positions the memory holds of ``seq_id``."""
        return int(llama_cpp.llama_memory_seq_pos_max(self.memory, seq_id)) + 1

    def cut(self, seq_id: int, pos: int) -> bool:
        """Forget ``seq_id``'s cells from ``pos`` on (``pos`` 0: all of them).
        False when the memory cannot: it is then unchanged, and the caller
        restores a checkpoint or clears the sequence and evaluates it again."""
        if self.kind == ATTENTION:
            return bool(llama_cpp.llama_memory_seq_rm(self.memory, seq_id, pos, -1))
        if pos <= 0:
            self.clear(seq_id)
            return True
        back = self.held(seq_id) - pos
        if back <= 0:
            return True
        if back >= self._last[seq_id] or back > self.depth:
            return False  # no snapshot of that position, or one that decode never wrote
        if not llama_cpp.llama_memory_seq_rm(self.memory, seq_id, pos, -1):
            return False
        self._last[seq_id] = 0  # a snapshot is taken once: the next cut waits for a decode
        return True

    def clear(self, seq_id: int) -> None:
        """Forget all of ``seq_id``."""
        llama_cpp.llama_memory_seq_rm(self.memory, seq_id, -1, -1)
        self._last[seq_id] = 0

    def clear_all(self) -> None:
        llama_cpp.llama_memory_clear(self.memory, False)
        self._last = [0] * len(self._last)


@dataclass(frozen=True)
class Checkpoint:
    """A sequence's recurrent state after its first ``length`` tokens (``tokens``)."""

    tokens: tuple[int, ...]
    state: bytes

    @property
    def length(self) -> int:
        return len(self.tokens)


class Checkpoints:
    """The newest recurrent-state checkpoints of a context's sequences:
    taken at positions a later prompt is expected to share (a chat's history
    before its generation prompt, the end of a prompt), restored where a
    sequence holds more than the next prompt shares and the memory cannot
    cut back to it. A checkpoint restores into any sequence whose cells
    hold its tokens (a slot that copied another's, say)."""

    def __init__(self, ctx: Any, cuts: Cuts, keep: int = CHECKPOINTS) -> None:
        self.ctx = ctx
        self.cuts = cuts
        self.keep = keep
        self.saved: list[Checkpoint] = []

    def save(self, seq_id: int, tokens: Sequence[int]) -> Checkpoint | None:
        """Checkpoint sequence ``seq_id``, which holds exactly ``tokens``."""
        key = tuple(tokens)
        if not self.keep or not key:
            return None
        for checkpoint in self.saved:
            if checkpoint.tokens == key:
                return checkpoint
        size = llama_cpp.llama_state_seq_get_size_ext(self.ctx, seq_id, _PARTIAL)
        buf = (ctypes.c_uint8 * size)()
        if llama_cpp.llama_state_seq_get_data_ext(self.ctx, buf, size, seq_id, _PARTIAL) != size:
            return None
        checkpoint = Checkpoint(key, bytes(buf))
        self.saved.append(checkpoint)
        del self.saved[: -self.keep]
        return checkpoint

    def best(self, tokens: Sequence[int], limit: int) -> Checkpoint | None:
        """The longest checkpoint of at most ``limit`` tokens that ``tokens`` start with."""
        fits = [c for c in self.saved if c.length <= limit and tuple(tokens[: c.length]) == c.tokens]
        return max(fits, key=lambda c: c.length, default=None)

    def restore(self, checkpoint: Checkpoint, seq_id: int) -> bool:
        """Make ``seq_id``, whose cells hold at least ``checkpoint``'s tokens,
        hold exactly them: its recurrent state set back, the attention
        layers' cells after it cut. False (the sequence then cleared) when
        llama.cpp refuses the state."""
        buf = (ctypes.c_uint8 * len(checkpoint.state)).from_buffer_copy(checkpoint.state)
        read = llama_cpp.llama_state_seq_set_data_ext(self.ctx, buf, len(buf), seq_id, _PARTIAL)
        # the recurrent state now ends at the checkpoint: only attention cells lie past it, and they cut
        if read != len(buf) or not llama_cpp.llama_memory_seq_rm(self.cuts.memory, seq_id, checkpoint.length, -1):
            self.cuts.clear(seq_id)
            return False
        self.cuts.decoded(seq_id, 0)
        return True

    def cut(self, seq_id: int, tokens: Sequence[int], keep: int) -> int:
        """Cut ``seq_id``, whose cells hold at least ``tokens[:keep]``, back
        to ``keep`` tokens; where the memory refuses, to the longest
        checkpoint of at most that many, or to nothing. Returns how many
        tokens of ``tokens`` it holds then."""
        if self.cuts.cut(seq_id, keep):
            return keep
        checkpoint = self.best(tokens, keep)
        if checkpoint is not None and self.restore(checkpoint, seq_id):
            return checkpoint.length
        self.cuts.clear(seq_id)
        return 0
