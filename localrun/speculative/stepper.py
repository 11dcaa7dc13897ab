"""One speculative step at a time: the drafters offer, the controller
chooses, the target takes a plain step or verifies a draft, and the
controller observes the step. `SpeculativeStepper` is what every loop that
drafts uses (`runtime.stepper.Stepper`): the single-sequence loop
(`loop.py`) and the batch scheduler's sequence decoding alone.

The target keeps one decided token pending (not yet in its KV cache). A step
evaluates [pending, d1..dn] in one batch with logits for every row; row i
decides the token after position i: d(i+1) is kept if it passes, and the
first row whose draft fails (or the last row) yields a new pending token.
Rejected drafts are rolled back from the KV cache. A plain step is the same
with n = 0, through the single-token path plain decoding uses; only those
steps are timed for the thread governor (localrun.runtime.threads), since a
verify step's time depends on its rows.

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

import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import TYPE_CHECKING, Protocol

import numpy as np

from localrun.errors import LocalrunError
from localrun.events import DraftStats
from localrun.runtime.llama import DecodeStatus
from localrun.runtime.sampling import SamplingParams
from localrun.runtime.stepper import Target
from localrun.speculative.base import Draft, Drafter, Offer
from localrun.speculative.control import Controller, Plan
from localrun.speculative.sampling import check_draft, target_probs

if TYPE_CHECKING:
    from localrun.structured.constraint import Constraint


class Drafting(Protocol):
    """What a stepper needs of `localrun.speculative.Speculation`: the
    drafters, those that failed to load, and the controller."""

    drafters: list[Drafter]
    disabled: set[int]
    controller: Controller


class Tally:
    """Proposed/accepted counts for the events, named after the drafters that
    drafted (the most tokens first); "plain" while none has."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = names
        self.proposed = [0] * len(names)
        self.accepted = [0] * len(names)
        self.rounds = 0

    def add(self, drafter: int, proposed: int, accepted: int) -> None:
        self.proposed[drafter] += proposed
        self.accepted[drafter] += accepted
        self.rounds += 1

    def snapshot(self) -> DraftStats:
        used = sorted((i for i, p in enumerate(self.proposed) if p), key=lambda i: -self.proposed[i])
        name = "+".join(self.names[i] for i in used) or "plain"
        return DraftStats(name, sum(self.proposed), sum(self.accepted), self.rounds)


class SpeculativeStepper:
    """One speculative step at a time for ``target``: ask the drafters, let
    the controller choose, then a plain step or a verify step; the controller
    observes each, and the tally counts the drafts."""

    def __init__(self, target: Target, speculation: Drafting, sampling: SamplingParams) -> None:
        self.target = target
        self.speculation = speculation
        self.sampling = sampling
        self.rng = np.random.default_rng(sampling.seed)
        self.tally = Tally([d.profile.name for d in speculation.drafters])
        self.status = DecodeStatus.OK

    def begin(self) -> None:
        for drafter in self.speculation.drafters:
            drafter.begin(self.target.context)

    def stats(self) -> DraftStats:
        return self.tally.snapshot()

    def next(self) -> list[int]:
        """The tokens the next step decides (none when decoding must stop):
        first any the grammar forces (jump-forward), which ride in the step's
        batch ahead of the draft and need no logits of their own."""
        target = self.target
        forced = target.fast_forward()
        context = [*target.context, *forced] if forced else target.context
        left = target.left - len(forced)  # tokens the output may take after the forced ones
        if left < 1:
            return forced
        pending = context[target.n_past :]  # decided, not yet in the KV cache: the last token, then the forced
        room = min(left - 1, target.n_ctx - len(context), target.n_batch - len(pending))
        t0 = time.perf_counter()
        plan, draft = propose(
            self.speculation, context, room, len(pending) - 1, self.sampling, self.rng, target.constraint
        )
        if draft is None:
            decided = self._plain(plan, pending, t0)
        else:
            decided = self._verify(plan, len(context), pending, draft, t0)
        return [*forced, *decided] if decided else []

    def _plain(self, plan: Plan, pending: list[int], t0: float) -> list[int]:
        target, control = self.target, self.speculation.controller
        t1 = time.perf_counter()
        self.status = target.evaluate(pending)
        if self.status != DecodeStatus.OK:
            return []
        decided = [target.sample()]
        t2 = time.perf_counter()
        if len(pending) == 1:
            control.observe_plain(t2 - t1)
        else:
            control.observe_verify(len(pending), t2 - t1)
        control.observe_round(plan, t2 - t0, len(pending) - 1 + len(decided))
        return decided

    def _verify(self, plan: Plan, n_context: int, pending: list[int], draft: Draft, t0: float) -> list[int]:
        target, control = self.target, self.speculation.controller
        assert plan.offer is not None
        t1 = time.perf_counter()
        first = len(pending) - 1  # the row that decides the first drafted token
        self.status = target.evaluate_rows([*pending, *draft.tokens], first)
        if self.status != DecodeStatus.OK:
            target.rollback(target.n_past)
            return []
        decided = self._check(draft, first)
        accepted = len(decided) - 1
        target.rollback(n_context + accepted)  # forget the rejected drafts
        t2 = time.perf_counter()
        control.observe_verify(len(pending) + len(draft.tokens), t2 - t1)
        control.observe_outcome(plan.offer, len(draft.tokens), accepted)
        control.observe_round(plan, t2 - t0, first + len(decided))
        self.tally.add(plan.offer.drafter, len(draft.tokens), accepted)
        return decided

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
) -> tuple[Plan, Draft | None]:
    """The controller's way for this step, and the draft it asks for (None:
    a plain step), cut at the first token the grammar rejects. ``forced``:
    decided tokens that ride in the batch ahead of the draft."""
    offers = [
        offer
        for i, drafter in enumerate(speculation.drafters)
        if i not in speculation.disabled and (offer := drafter.offer(context, i)) is not None
    ]
    plan = speculation.controller.choose(offers, room, forced=forced)
    draft = _make_draft(speculation, plan, context, sampling, rng, constraint)
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
    try:
        draft = speculation.drafters[offer.drafter].draft(context, plan.n, sampling, rng, mask)
    except LocalrunError:  # a draft model that cannot load here (memory): go on without it
        speculation.disabled.add(offer.drafter)
        with suppress(LocalrunError):
            speculation.drafters[offer.drafter].close()
        return None
    speculation.controller.observe_draft(offer.drafter, draft)
    return draft
