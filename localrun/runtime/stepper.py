"""What a decode loop asks of speculative decoding, which
`localrun.speculative` implements: a `Stepper` decides a sequence's tokens
one step at a time, drafting where it pays. The loop gives it the sequence
as a `SteppedSequence`, streams what each step decides and appends it to the
target's context.

The single-sequence loop (`localrun.speculative.loop`) and the batch
scheduler (a sequence decoding alone, or several together where extra rows
are nearly free) each have a `SteppedSequence`; the stepper, and with it the
controller's bookkeeping, is one for both. Decoding together, the scheduler
packs each sequence's `Stepper.prepare` rows into one batch, and the target
reads its rows of it. Runtime depends only on these protocols, never on
`localrun.speculative`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from localrun.events import DraftStats
    from localrun.runtime.llama import DecodeStatus
    from localrun.runtime.sampling import SamplingParams
    from localrun.structured.constraint import Constraint


class SteppedSequence(Protocol):
    """One sequence of the target model, as a stepper drives it: its tokens,
    its KV cache, the rows of logits of its last batch, its sampling."""

    @property
    def context(self) -> list[int]:
        """The prompt and every token decided so far."""

    @property
    def n_past(self) -> int:
        """How many tokens of the context the KV cache holds (those after are decided, not yet evaluated)."""

    @property
    def left(self) -> int:
        """How many tokens the output may still take."""

    @property
    def n_ctx(self) -> int:
        """The most tokens the sequence's KV cache holds."""

    @property
    def n_batch(self) -> int:
        """The most tokens one batch holds."""

    @property
    def draft_room(self) -> int:
        """The most rows a verify batch may hold after the decided ones, so
        that the rejected can be forgotten: unbounded on a KV cache, the
        snapshots a recurrent memory keeps (`localrun.runtime.memory`)."""

    @property
    def constraint(self) -> Constraint | None:
        """The grammar the output follows, if any."""

    @property
    def generated(self) -> Sequence[int]:
        """The output's tokens so far (sampling penalties read them)."""

    def fast_forward(self) -> list[int]:
        """The tokens the grammar forces next (jump-forward); none where the loop takes none."""

    def evaluate(self, tokens: Sequence[int]) -> DecodeStatus:
        """Decode decided ``tokens`` after the KV cache's, logits for the last
        only: a plain step, timed for the thread governor when it is one token."""

    def evaluate_rows(self, tokens: Sequence[int], first: int) -> DecodeStatus:
        """Decode ``tokens`` after the KV cache's with logits for every row
        from ``first`` on: a verify step (not timed: its time depends on its rows)."""

    def sample(self, row: int = -1) -> int:
        """The token ``row`` of the last batch decides: masked to what the
        grammar allows, sampled, and taken by the sampler and the grammar."""

    def logits(self, row: int) -> Any:
        """The logits of ``row`` of the last batch, masked to what the grammar allows."""

    def accept(self, token: int) -> None:
        """Take a token decided without `sample` (a draft kept by speculative sampling)."""

    def rollback(self, pos: int) -> None:
        """Forget the KV cache's cells from ``pos`` on."""


class Stepper(Protocol):
    """Decides a `SteppedSequence`'s tokens one step at a time, and keeps the count
    of what its drafts proposed and the target kept."""

    @property
    def status(self) -> DecodeStatus:
        """The last step's decode: when it failed, that step decided nothing."""

    def begin(self) -> None:
        """The drafters start following the target's context (a new
        generation, or this sequence again after another one)."""

    def next(self) -> list[int]:
        """The tokens the next step decides; none when decoding must stop."""

    def prepare(self, company: int) -> tuple[list[int], int]:
        """The next step in a batch shared with ``company`` rows of other
        sequences: (the rows it puts there after the target's KV cache, the
        first of them that needs logits). `settle` follows once it is decoded."""

    def settle(self, status: DecodeStatus, seconds: float) -> list[int]:
        """The tokens the prepared step decides, the shared batch decoded with
        ``status``; ``seconds``: this sequence's share of its time."""

    def stats(self) -> DraftStats:
        """What the drafts proposed and the target kept so far."""


class Speculative(Protocol):
    """A way of decoding that drafts: makes the stepper of one sequence, and
    says whether sequences decoding together in one batch may draft."""

    def stepper(self, target: SteppedSequence, sampling: SamplingParams) -> Stepper: ...

    def drafts_in_batch(self, rows: int) -> bool:
        """Whether sequences decoding together, ``rows`` of them, may draft in their shared batch."""

    def padded(self, rows: int, limit: int) -> int:
        """The rows a shared batch of ``rows`` rows is padded to (at most
        ``limit``), so that steps repeat their shape; ``rows`` for none."""

    def observe_batch(self, rows: int, seconds: float) -> None:
        """A shared batch of ``rows`` rows, drafts included, took ``seconds``."""
