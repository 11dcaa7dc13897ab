"""The single-sequence speculative loop: `runtime.generate.generate` with a
stepper (`stepper.py`) deciding each step's tokens, on sequence 0 of the
engine's context (`Generation`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Unpack

from localrun.events import Event
from localrun.runtime.engine import Engine
from localrun.runtime.generate import GenerateOptions, Generation
from localrun.runtime.llama import DecodeStatus
from localrun.runtime.sampling import SamplingParams
from localrun.runtime.stepper import Speculative

if TYPE_CHECKING:
    from localrun.structured.constraint import Constraint


def generate_speculative(
    engine: Engine,
    prompt_tokens: Sequence[int],
    sampling: SamplingParams,
    *,
    speculation: Speculative,
    **options: Unpack[GenerateOptions],
) -> Iterator[Event]:
    """`runtime.generate.generate` with speculative decoding: the same events,
    the same text (see `stepper.py`), and a `DraftStats` on each event."""
    with Generation(engine, prompt_tokens, sampling, **options) as run:
        target = GenerationTarget(run)
        step = speculation.stepper(target, sampling)
        decided: list[int] = []
        if run.prefill() == DecodeStatus.OK and run.limit > 0:
            step.begin()
            decided = run.fast_forward() or [run.sample()]  # a text the grammar starts with, else the first sample
        while decided:
            for token in decided:  # stream what the step decided
                target.context.append(token)
                yield from run.out.push_events(token, run.threads, step.stats())
                if run.ended():
                    break
            if run.ended():
                break
            if engine.abort_requested:
                run.reason = "interrupted"
                break
            decided = step.next()
        run.decoder.rollback(min(run.decoder.n_past, len(target.context)))  # the cache holds only decided tokens
        yield from run.finish(draft=step.stats())


class GenerationTarget:
    """A `Generation` as a stepper drives it (`runtime.stepper.SteppedSequence`):
    sequence 0 of the engine's context, through the generation's decoder."""

    def __init__(self, run: Generation) -> None:
        self.run = run
        self.context = list(run.prompt_tokens)

    @property
    def n_past(self) -> int:
        return self.run.decoder.n_past

    @property
    def left(self) -> int:
        return int(self.run.limit - self.run.out.n_gen)

    @property
    def n_ctx(self) -> int:
        return int(self.run.engine.n_ctx)

    @property
    def n_batch(self) -> int:
        return int(self.run.engine.n_batch)

    @property
    def draft_room(self) -> int:
        return self.run.engine.cuts.room

    @property
    def constraint(self) -> Constraint | None:
        return self.run.constraint

    @property
    def generated(self) -> Sequence[int]:
        return self.run.out.tokens

    def fast_forward(self) -> list[int]:
        return self.run.fast_forward()

    def evaluate(self, tokens: Sequence[int]) -> DecodeStatus:
        return self.run.step(tokens)

    def evaluate_rows(self, tokens: Sequence[int], first: int) -> DecodeStatus:
        return self.run.note(self.run.decoder.evaluate_rows(tokens, abortable=False, first=first))  # short

    def sample(self, row: int = -1) -> int:
        return self.run.sample(row)

    def logits(self, row: int) -> Any:
        logits = self.run.decoder.logits(row)
        self.run.guard.mask(logits)
        return logits

    def accept(self, token: int) -> None:
        self.run.sampler.accept(token)
        self.run.guard.accepted(token)

    def rollback(self, pos: int) -> None:
        self.run.decoder.rollback(pos)
