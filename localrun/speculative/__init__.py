"""Speculative decoding: drafters propose, the target verifies a batch, the
controller decides each step whether drafting pays.

The loop keeps one decided token pending (not yet in the target's KV cache).
A step evaluates [pending, d1..dn] in one batch with logits for every row;
row i decides the token after position i: d(i+1) is kept if it passes, and
the first row whose draft fails (or the last row) yields a new pending token.
Rejected drafts are rolled back from the KV cache. A plain step is the same
with n = 0, through the single-token path plain decoding uses.

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
from collections.abc import Iterator, Sequence
from contextlib import suppress
from dataclasses import replace
from pathlib import Path

import numpy as np

from localrun.errors import LocalrunError
from localrun.events import DraftStats, Event, StopReason
from localrun.runtime.decode import Checkpoint, Decoder, Sampler, SamplingParams, TokenOutput
from localrun.runtime.engine import Engine
from localrun.speculative.control import AdaptiveController, Controller, Plan
from localrun.speculative.drafters import Draft, Drafter, DraftModelDrafter, Offer, PromptLookupDrafter
from localrun.speculative.sampling import check_draft, target_probs
from localrun.speculative.textlookup import TextLookupDrafter

_DECODE_OK, _DECODE_ABORTED = 0, 2
DRAFT_CHOICES = ("auto", "none", "lookup")


class Speculation:
    """Drafters and the controller that arbitrates between them and plain
    decoding. Lives as long as the target engine: a chat keeps one across
    turns, so measurements and the draft's cache carry over."""

    def __init__(self, drafters: Sequence[Drafter], controller: Controller | None = None) -> None:
        if not drafters:
            raise ValueError("speculation needs at least one drafter")
        self.drafters = list(drafters)
        self.controller = controller or AdaptiveController([d.profile for d in self.drafters])
        self.disabled: set[int] = set()  # drafters that failed to load

    @property
    def label(self) -> str:
        return "+".join(d.profile.name for d in self.drafters)

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
        """Like `decode.generate`, with speculation."""
        return generate_speculative(
            engine,
            prompt_tokens,
            sampling,
            speculation=self,
            max_tokens=max_tokens,
            stop=stop,
            ignore_eos=ignore_eos,
            decoder=decoder,
            checkpoint=checkpoint,
        )

    def close(self) -> None:
        for drafter in self.drafters:
            drafter.close()

    def __enter__(self) -> Speculation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def lookup_drafters(engine: Engine) -> list[Drafter]:
    """Prompt lookup, by tokens and by text with its spacing set aside."""
    return [PromptLookupDrafter(), TextLookupDrafter.for_engine(engine)]


def open_speculation(engine: Engine, choice: str, draft_path: Path | None = None) -> Speculation | None:
    """The speculation `--draft CHOICE` asks for. ``choice``: none (None is
    returned), lookup (`lookup_drafters`), auto (prompt lookup, plus ``draft_path`` if given: the
    model's matched draft, loaded only if the controller wants it), or anything
    else with ``draft_path`` naming that draft model (loaded now)."""
    if choice == "none":
        return None
    drafters: list[Drafter] = []
    if choice in ("auto", "lookup"):
        drafters += lookup_drafters(engine)
    if choice != "lookup" and draft_path is not None:
        drafters.append(DraftModelDrafter(draft_path, engine, eager=choice != "auto"))
    return Speculation(drafters) if drafters else None


class _Tally:
    """Proposed/accepted counts for the events."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = names
        self.proposed = [0] * len(names)
        self.accepted = [0] * len(names)
        self.rounds = 0
        self.current = "plain"

    def add(self, drafter: int, proposed: int, accepted: int) -> None:
        self.proposed[drafter] += proposed
        self.accepted[drafter] += accepted
        self.rounds += 1

    def snapshot(self, *, final: bool = False) -> DraftStats:
        if final:
            used = sorted((i for i, p in enumerate(self.proposed) if p), key=lambda i: -self.proposed[i])
            name = "+".join(self.names[i] for i in used) or "plain"
        else:
            name = self.current
        return DraftStats(name, sum(self.proposed), sum(self.accepted), self.rounds)


def generate_speculative(
    engine: Engine,
    prompt_tokens: Sequence[int],
    sampling: SamplingParams,
    *,
    speculation: Speculation,
    max_tokens: int | None = None,
    stop: Sequence[str] = (),
    ignore_eos: bool = False,
    decoder: Decoder | None = None,
    checkpoint: Checkpoint | None = None,
) -> Iterator[Event]:
    """`decode.generate` with speculative decoding: the same events, the same
    text (see the module's note), and a `DraftStats` on each event."""
    engine.check_fits(len(prompt_tokens))
    decoder = decoder or Decoder(engine)
    sampler = Sampler(sampling, engine.n_vocab)
    rng = np.random.default_rng(sampling.seed)
    out = TokenOutput(engine, n_prompt=len(prompt_tokens), stop=stop, ignore_eos=ignore_eos)
    limit = engine.n_ctx - len(prompt_tokens)
    if max_tokens is not None:
        limit = min(limit, max_tokens)
    drafters = speculation.drafters
    control = speculation.controller
    tally = _Tally([d.profile.name for d in drafters])
    context = list(prompt_tokens)  # the prompt and every token decided so far
    reason: StopReason = "length"
    try:
        status = _DECODE_OK
        if limit > 0:
            status, cached = decoder.prefill(prompt_tokens, checkpoint)
            out.prompt_done(cached)
        if status == _DECODE_ABORTED:
            reason = "interrupted"
        decided: list[int] = []
        if status == _DECODE_OK and limit > 0:
            for drafter in drafters:
                drafter.begin(context)
            decided = [decoder.sample(sampler)]
        while decided:
            for token in decided:  # stream what the step decided
                context.append(token)
                event = out.push(token)
                if event is not None:
                    yield replace(event, draft=tally.snapshot())
                if out.reason is not None or out.n_gen >= limit:
                    break
            if out.reason is not None or out.n_gen >= limit:
                break
            if engine.abort_requested:
                reason = "interrupted"
                break
            room = min(limit - out.n_gen - 1, engine.n_ctx - len(context), engine.n_batch - 1)
            offers = [
                offer
                for i, drafter in enumerate(drafters)
                if i not in speculation.disabled and (offer := drafter.offer(context, i)) is not None
            ]
            plan = control.choose(offers, room)
            t0 = time.perf_counter()
            draft = _make_draft(speculation, plan, context, sampling, rng)
            if draft is None or not draft.tokens:
                tally.current = "plain"
                t1 = time.perf_counter()
                status = decoder.evaluate((context[-1],))
                if status != _DECODE_OK:
                    reason = "interrupted" if status == _DECODE_ABORTED else "length"
                    break
                decided = [decoder.sample(sampler)]
                t2 = time.perf_counter()
                control.observe_plain(t2 - t1)
                control.observe_round(plan, t2 - t0, 1)
                continue
            assert plan.offer is not None
            t1 = time.perf_counter()
            status = decoder.evaluate_rows([context[-1], *draft.tokens], abortable=False)  # short: no callback
            if status != _DECODE_OK:
                decoder.rollback(len(context) - 1)
                reason = "interrupted" if status == _DECODE_ABORTED else "length"
                break
            decided = _verify(decoder, sampler, sampling, draft, rng, out.tokens)
            accepted = len(decided) - 1
            decoder.rollback(len(context) + accepted)  # forget the rejected drafts
            t2 = time.perf_counter()
            control.observe_verify(len(draft.tokens) + 1, t2 - t1)
            control.observe_outcome(plan.offer, len(draft.tokens), accepted)
            control.observe_round(plan, t2 - t0, len(decided))
            tally.current = drafters[plan.offer.drafter].profile.name
            tally.add(plan.offer.drafter, len(draft.tokens), accepted)
        decoder.rollback(min(decoder.n_past, len(context)))  # the cache holds only decided tokens
        yield from out.finish(
            reason, prompt_cache=getattr(checkpoint, "outcome", None), draft=tally.snapshot(final=True)
        )
    finally:
        sampler.close()


def _make_draft(
    speculation: Speculation, plan: Plan, context: list[int], sampling: SamplingParams, rng: np.random.Generator
) -> Draft | None:
    offer: Offer | None = plan.offer
    if offer is None or plan.n < 1:
        return None
    try:
        draft = speculation.drafters[offer.drafter].draft(context, plan.n, sampling, rng)
    except LocalrunError:  # a draft model that cannot load here (memory): go on without it
        speculation.disabled.add(offer.drafter)
        with suppress(LocalrunError):
            speculation.drafters[offer.drafter].close()
        return None
    speculation.controller.observe_draft(offer.drafter, draft)
    return draft


def _verify(
    decoder: Decoder,
    sampler: Sampler,
    sampling: SamplingParams,
    draft: Draft,
    rng: np.random.Generator,
    generated: list[int],
) -> list[int]:
    """Check the drafted tokens against the batch's rows: the tokens kept,
    then the token the first failing row (or the last row) decides."""
    decided: list[int] = []
    for row, token in enumerate(draft.tokens):
        if draft.probs is None or sampling.greedy:
            chosen = decoder.sample(sampler, row)  # a deterministic draft: kept if the target agrees
            decided.append(chosen)
            if chosen != token:
                return decided
        else:
            p = target_probs(decoder.logits(row), sampling, [*generated, *decided])
            replacement = check_draft(p, token, draft.probs[row], rng)
            chosen = token if replacement is None else replacement
            sampler.accept(chosen)  # the native chain's penalty window follows every decided token
            decided.append(chosen)
            if replacement is not None:
                return decided
    decided.append(decoder.sample(sampler, len(draft.tokens)))
    return decided
