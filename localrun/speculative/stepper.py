"""One speculative step at a time: the drafters offer, the controller
chooses, the target takes a plain step or verifies a draft, and the
controller observes the step. `SpeculativeStepper` is what every loop that
drafts uses (`runtime.stepper.Stepper`): the single-sequence loop
(`loop.py`) and the batch scheduler, for a sequence decoding alone and,
where the verify curve says extra rows are nearly free (a GPU), for each
sequence of a shared batch (`prepare`, then `settle`).

Where the curve says so too, a verify batch is padded up to a size of
`control.PAD_SIZES` that costs no more (`control.padded_rows`), so that
steps repeat their shape and llama.cpp reuses its compute graph (which
needs the same tokens and outputs: the padding rows have logits, never
read); the padding's cells are forgotten with the rejected drafts, and
the rows before them, hence the text, are what they are without it.

The target keeps one decided token pending (not yet in its KV cache). A step
evaluates [pending, d1..dn] in one batch with logits for every row; row i
decides the token after position i: d(i+1) is kept if it passes, and the
first row whose draft fails (or the last row) yields a new pending token.
Rejected drafts are rolled back from the KV cache. A plain step is the same
with n = 0, through the single-token path plain decoding uses; only those
steps are timed for the thread governor (localrun.runtime.threads), since a
verify step's time depends on its rows.

Decoding alone (`next`), each whole step is timed too, the drafters'
asking apart, for the controller to judge whether speculation pays its way
on this machine (`control.Payoff`): where it does not, the controller rests
the drafters, and `next` takes plain steps without asking them (most of
them not timed: `MEASURED`), until a probe finds it pays again.

With a grammar (structured output), the tokens it forces next (jump-forward:
a key, punctuation) join the pending token at the head of the batch, without
logits of their own, and the draft follows them: drafters draft after the
forced text, the draft model under the grammar's mask, and any draft is cut
at the first token the grammar rejects. The controller counts the forced
tokens as drafts that cannot be rejected.

Lossless: with greedy sampling every kept token is the target's argmax for
its row, so the text is the one plain decoding produces as long as llama.cpp
computes a batch's rows bit-identically to single steps. It does on the tiny
test models; on quantized real models its CPU kernels for several rows round
differently from the one-row kernel, and a near tie (logits a few hundredths
apart) can go the other way, from where the texts part (scripts/bench_spec.py
reports where and by how much). With temperature >
0 a deterministic draft (prompt lookup; a draft model when sampling greedily)
is checked by sampling the row with the native chain, and a sampled
draft-model draft by speculative sampling against the draft's own
distribution (see spec_sampling): the text is distributed exactly as without
speculation. A seeded run gives plain decoding's text as long as no sampled
draft-model drafts are used; those draw their own random numbers, and which
steps use them depends on timing.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
from numpy.random import default_rng  # at import: numpy loads its random module lazily, on a first request

from localrun.errors import LocalrunError
from localrun.events import DraftStats
from localrun.runtime.llama import DecodeStatus
from localrun.runtime.sampling import SamplingParams
from localrun.runtime.stepper import SteppedSequence
from localrun.speculative.base import Draft, Drafter, Offer
from localrun.speculative.control import PLAIN, Controller, Plan, padded_rows
from localrun.speculative.sampling import check_draft, target_probs

if TYPE_CHECKING:
    from localrun.structured.constraint import Constraint

QUIET = 8  # steps in a row the drafters drafted nothing for before they rest (`SpeculativeStepper._asked`)
MAX_REST = 7  # the most steps they rest between two askings: asked once in 8 steps at the least
# while the controller rests the drafters, the first steps of the rest (a calibration takes
# `control.CALIBRATE` + 1), then one step in this many, are measured
MEASURED = 4


class Drafting(Protocol):
    """What a stepper needs of `localrun.speculative.Speculation`: the
    drafters, those that failed to load, the controller, and the verify
    curve measured here (relative to one row; None: not measured)."""

    drafters: list[Drafter]
    disabled: set[int]
    controller: Controller
    curve: tuple[float, ...] | None


class Tally:
    """Proposed/accepted counts for the events, named after the drafters that
    drafted (the most tokens first); "plain" while none has."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = names
        self.proposed = [0] * len(names)
        self.accepted = [0] * len(names)
        self.rounds = 0
        self._snapshot: DraftStats | None = None  # the counts as they stand, until the next add

    def add(self, drafter: int, proposed: int, accepted: int) -> None:
        self.proposed[drafter] += proposed
        self.accepted[drafter] += accepted
        self.rounds += 1
        self._snapshot = None

    def snapshot(self) -> DraftStats:
        """The counts so far (one object while they stay the same: every token's event carries it)."""
        if self._snapshot is None:
            used = sorted((i for i, p in enumerate(self.proposed) if p), key=lambda i: -self.proposed[i])
            name = "+".join(self.names[i] for i in used) or "plain"
            self._snapshot = DraftStats(name, sum(self.proposed), sum(self.accepted), self.rounds)
        return self._snapshot


@dataclass
class Round:
    """One step between the controller's choice and the check of its rows."""

    plan: Plan
    draft: Draft | None  # None: a plain step
    forced: list[int]  # tokens the grammar forced, decided before the batch
    pending: list[int]  # decided, not in the KV cache yet: the head of the batch (empty: no batch to evaluate)
    n_context: int  # the context's length with the forced tokens
    t0: float
    pad: int = 0  # rows after the draft that only give the batch a size the curve favours (`padded_rows`)
    asked_s: float = 0.0  # the time spent asking the drafters and weighing their offers (0: not asked)

    @property
    def first(self) -> int:
        """The row that decides the first token after the pending ones."""
        return len(self.pending) - 1

    @property
    def tokens(self) -> list[int]:
        """The batch's rows: the pending tokens, the draft, and the padding
        (the draft's last token again: its rows' logits are never read, and
        its cells go with the rejected drafts)."""
        rows = [*self.pending, *(self.draft.tokens if self.draft is not None else ())]
        return rows + rows[-1:] * self.pad


class SpeculativeStepper:
    """One speculative step at a time for ``target``: ask the drafters, let
    the controller choose, then a plain step or a verify step; the controller
    observes each, and the tally counts the drafts.

    Decoding alone, `next` evaluates the step's batch itself. Decoding in a
    batch with other sequences, `prepare` gives the rows the sequence puts
    in the shared batch and `settle` checks them once it is decoded; there
    it drafts with copies of the drafters that run no model (prompt lookup),
    its own, which follow its text alone (a draft model follows one sequence)."""

    def __init__(self, target: SteppedSequence, speculation: Drafting, sampling: SamplingParams) -> None:
        self.target = target
        self.speculation = speculation
        self.sampling = sampling
        self.rng = default_rng(sampling.seed)
        self.tally = Tally([d.profile.name for d in speculation.drafters])
        self.status = DecodeStatus.OK
        self._round: Round | None = None
        self._own: list[Drafter | None] | None = None  # its copies of the free drafters, once in a batch
        self._plain_run = 0  # steps in a row the drafters were asked and the controller took a plain step
        self._rest = 0  # steps the drafters are not asked for now (see `_asked`)
        self._rest_next = 0  # ... and how many the next rest takes
        self._rested = 0  # steps in a row the controller rested the drafters for (`_plain`)

    def begin(self) -> None:
        for drafter in self.speculation.drafters:
            drafter.begin(self.target.context)

    def stats(self) -> DraftStats:
        return self.tally.snapshot()

    def next(self) -> list[int]:
        """The tokens the next step decides (none when decoding must stop):
        first any the grammar forces (jump-forward), which ride in the step's
        batch ahead of the draft and need no logits of their own."""
        target, control = self.target, self.speculation.controller
        resting = not control.wants_offers()  # speculation did not pay its way here: `control.Payoff`
        if resting and target.constraint is None:
            return self._plain()
        self._rested = 0
        start = time.perf_counter()
        r = self._prepare(0, resting=resting)
        if not r.pending:
            return r.forced
        tokens = r.tokens
        t1 = time.perf_counter()
        status = target.evaluate(tokens) if r.draft is None else target.evaluate_rows(tokens, r.first)
        decided = self._decide(r, status)
        t2 = time.perf_counter()
        if decided and len(tokens) == 1:
            control.observe_plain(t2 - t1)
        elif decided:
            control.observe_verify(len(tokens), t2 - t1)
        out = self._settle(r, decided, t2 - r.t0)
        if decided:  # the whole step, so that speculation pays its own way (`control.Payoff`)
            drafted = len(r.draft.tokens) if r.draft is not None else 0
            control.observe_step(time.perf_counter() - start, r.first + len(decided), r.asked_s, drafted)
        return out

    def _plain(self) -> list[int]:
        """A plain step while the controller rests the drafters, without a
        grammar: `next`'s plain step less its bookkeeping (a step can take a
        tenth of a millisecond). The first `MEASURED` steps of a rest, and one
        in `MEASURED` after them, are measured as `next` measures a step."""
        target = self.target
        if target.left < 1:
            return []
        self._rested += 1
        if self._rested > MEASURED and self._rested % MEASURED:
            self.status = status = target.evaluate(target.context[target.n_past :])
            return [target.sample()] if status == DecodeStatus.OK else []
        control = self.speculation.controller
        pending = target.context[target.n_past :]
        t1 = time.perf_counter()
        self.status = status = target.evaluate(pending)
        if status != DecodeStatus.OK:
            return []
        token = target.sample()
        seconds = time.perf_counter() - t1
        if len(pending) == 1:
            control.observe_plain(seconds)
        else:
            control.observe_verify(len(pending), seconds)
        control.observe_round(PLAIN, seconds, len(pending))
        control.observe_step(seconds, len(pending), 0.0, 0)
        return [token]

    def prepare(self, company: int) -> tuple[list[int], int]:
        """This sequence's step in a batch shared with ``company`` rows of
        other sequences: (the rows to evaluate after its KV cache, the first
        that needs logits). The controller weighs a draft against the others'
        rows as against forced tokens: they ride in the batch either way."""
        if self._own is None:
            self._own = [copy.copy(d) if d.profile.free else None for d in self.speculation.drafters]
            for drafter in self._own:
                if drafter is not None:
                    drafter.begin(self.target.context)  # a free drafter's begin sets all its state anew
        self._round = self._prepare(company, self._own)
        return self._round.tokens, max(self._round.first, 0)

    def settle(self, status: DecodeStatus, seconds: float) -> list[int]:
        """The tokens the prepared step decides, once the shared batch is
        decoded with ``status`` (its rows in the target's rows of it);
        ``seconds``: this sequence's share of the batch's time."""
        r, self._round = self._round, None
        assert r is not None
        if not r.pending:
            return r.forced
        return self._settle(r, self._decide(r, status), seconds)

    def _prepare(
        self, company: int, drafters: Sequence[Drafter | None] | None = None, *, resting: bool = False
    ) -> Round:
        """The step's round; ``resting``: the controller rests the drafters
        (`Controller.wants_offers`), which are not asked."""
        target = self.target
        forced = target.fast_forward()
        context = [*target.context, *forced] if forced else target.context
        left = target.left - len(forced)  # tokens the output may take after the forced ones
        if left < 1:
            return Round(PLAIN, None, forced, [], len(context), time.perf_counter())
        pending = context[target.n_past :]  # decided, not yet in the KV cache: the last token, then the forced
        if not company:  # alone: its rows cost what rows at its depth do (`control.StepGrowth`)
            self.speculation.controller.observe_depth(target.n_past)
        t0 = time.perf_counter()
        if resting or not self._asked():
            return Round(PLAIN, None, forced, pending, len(context), t0)
        # rows past the decided are cut back once checked: a recurrent memory keeps snapshots of so many
        room = min(left - 1, target.n_ctx - len(context), target.n_batch - len(pending), target.draft_room)
        plan, draft = propose(
            self.speculation,
            context,
            room,
            len(pending) - 1 + company,
            self.sampling,
            self.rng,
            target.constraint,
            drafters,
        )
        self._answered(plan)
        r = Round(plan, draft, forced, pending, len(context), t0, asked_s=time.perf_counter() - t0)
        if draft is not None and not company:  # alone: its batch is the step's shape
            rows = len(pending) + len(draft.tokens)
            limit = min(target.n_batch, target.n_ctx - target.n_past, len(pending) + target.draft_room)
            r.pad = padded_rows(self.speculation.curve, rows, limit) - rows
        return r

    def _asked(self) -> bool:
        """Whether the drafters are asked this step. After `QUIET` steps in
        a row for which they drafted nothing (no offer, or the controller
        weighed theirs and took a plain step), they rest: a step, then,
        after each later asking that drafts nothing, twice as many, up to
        `MAX_REST`. The first draft asks them at every step again. Asking
        costs tens of microseconds of Python (an n-gram search, the text's
        characters followed, the controller's weighing), which counts
        where a step takes a millisecond or two (a small model, a GPU), on
        text they never draft for; resting, a copy that starts is found up
        to `MAX_REST` steps late (the drafters catch up on the tokens they
        were not asked about). Decoding alone, the controller rests them
        too, for longer, where speculation does not pay its way
        (`control.Payoff`)."""
        if self._rest > 0:
            self._rest -= 1
            return False
        return True

    def _answered(self, plan: Plan) -> None:
        if plan.offer is not None:
            self._plain_run = self._rest_next = 0
            return
        self._plain_run += 1
        if self._rest_next or self._plain_run >= QUIET:
            self._rest = self._rest_next = min(max(2 * self._rest_next, 1), MAX_REST)

    def _decide(self, r: Round, status: DecodeStatus) -> list[int]:
        """The tokens the evaluated rows decide; the rejected drafts (and the
        padding) are forgotten from the KV cache."""
        target = self.target
        self.status = status
        if status != DecodeStatus.OK:
            if r.draft is not None:
                target.rollback(target.n_past)
            return []
        if r.draft is None:
            return [target.sample()]
        decided = self._check(r.draft, r.first)
        target.rollback(r.n_context + len(decided) - 1)  # forget the rejected drafts
        return decided

    def _settle(self, r: Round, decided: list[int], seconds: float) -> list[int]:
        """The controller observes the step's outcome and time, the tally counts its draft."""
        if not decided:
            return []
        control, offer = self.speculation.controller, r.plan.offer
        drafted = len(r.draft.tokens) if r.draft is not None and offer is not None else 0
        if drafted:
            assert offer is not None
            control.observe_outcome(offer, drafted, len(decided) - 1)
        control.observe_round(r.plan, seconds, r.first + len(decided))
        if drafted:
            assert offer is not None
            self.tally.add(offer.drafter, drafted, len(decided) - 1)
        return [*r.forced, *decided]

    def _check(self, draft: Draft, first: int) -> list[int]:
        """Check the drafted tokens against the batch's rows from ``first`` on:
        the tokens kept, then the token the first failing row (or the last row)
        decides. With a grammar, each row is masked to what it allows after the
        tokens before it."""
        target, sampling = self.target, self.sampling
        if draft.probs is None or sampling.greedy:  # a deterministic draft: kept while the target agrees
            return accept_rows(target.sample, draft.tokens, first)
        decided: list[int] = []
        for i, (token, q) in enumerate(zip(draft.tokens, draft.probs, strict=True)):  # speculative sampling
            p = target_probs(target.logits(first + i), sampling, [*target.generated, *decided])
            replacement = check_draft(p, token, q, self.rng)
            chosen = token if replacement is None else replacement
            target.accept(chosen)  # the native chain's penalty window follows every decided token
            decided.append(chosen)
            if replacement is not None:
                return decided
        decided.append(target.sample(first + len(draft.tokens)))
        return decided


def propose(
    speculation: Drafting,
    context: list[int],
    room: int,
    forced: int,
    sampling: SamplingParams,
    rng: np.random.Generator,
    constraint: Constraint | None,
    drafters: Sequence[Drafter | None] | None = None,
) -> tuple[Plan, Draft | None]:
    """The controller's way for this step, and the draft it asks for (None:
    a plain step), cut at the first token the grammar rejects. ``forced``:
    decided tokens (or other sequences' rows) that ride in the batch ahead of
    the draft. ``drafters``: those to ask, by the speculation's index (None:
    not asked); the speculation's own by default."""
    pool = speculation.drafters if drafters is None else drafters
    offers = [
        offer
        for i, drafter in enumerate(pool)
        if drafter is not None and i not in speculation.disabled and (offer := drafter.offer(context, i)) is not None
    ]
    plan = speculation.controller.choose(offers, room, forced=forced)
    draft = _make_draft(speculation, pool, plan, context, sampling, rng, constraint)
    if draft is not None and constraint is not None:
        keep = constraint.allowed_prefix(draft.tokens)
        draft.tokens = draft.tokens[:keep]
        draft.probs = draft.probs[:keep] if draft.probs is not None else None
    return plan, draft if draft is not None and draft.tokens else None


def accept_rows(sample: Callable[[int], int], tokens: Sequence[int], first: int = 0) -> list[int]:
    """A deterministic draft checked against a batch's rows from ``first`` on
    (``sample`` decides a row's token, masked and accepted as the output
    takes it): the drafted tokens kept while the row agrees, then the token
    of the first row that does not (or of the last row)."""
    decided: list[int] = []
    for i, token in enumerate(tokens):
        chosen = sample(first + i)
        decided.append(chosen)
        if chosen != token:
            return decided
    decided.append(sample(first + len(tokens)))
    return decided


def _make_draft(
    speculation: Drafting,
    pool: Sequence[Drafter | None],
    plan: Plan,
    context: list[int],
    sampling: SamplingParams,
    rng: np.random.Generator,
    constraint: Constraint | None,
) -> Draft | None:
    offer: Offer | None = plan.offer
    if offer is None or plan.n < 1:
        return None
    mask = constraint.fork() if constraint is not None else None
    drafter = pool[offer.drafter]
    assert drafter is not None  # it made the offer
    try:
        draft = drafter.draft(context, plan.n, sampling, rng, mask)
    except LocalrunError:  # a draft model that cannot load here (memory): go on without it
        speculation.disabled.add(offer.drafter)
        with suppress(LocalrunError):
            drafter.close()
        return None
    speculation.controller.observe_draft(offer.drafter, draft)
    return draft
