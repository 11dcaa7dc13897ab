"""Speculative decoding: drafters propose, the target verifies a batch, the
controller decides each step whether drafting pays (the step: `stepper.py`,
the single-sequence loop: `loop.py`).

`Speculation` is a `runtime.generate.Decoding`: a caller that has one calls
its `generate` as it would plain decoding's. It is a
`runtime.stepper.Speculative` too: the batch scheduler asks it for each
sequence's stepper, and whether sequences decoding together may draft."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Unpack

from localrun.errors import EngineError, MTPUnavailableError, UsageError
from localrun.events import Event
from localrun.runtime.engine import Engine
from localrun.runtime.generate import GenerateOptions
from localrun.runtime.sampling import SamplingParams
from localrun.runtime.stepper import SteppedSequence
from localrun.speculative.base import Drafter
from localrun.speculative.control import (
    AdaptiveController,
    Controller,
    StepGrowth,
    checked_curve,
    drafts_in_batch,
    padded_rows,
)
from localrun.speculative.draftmodel import DraftModelDrafter
from localrun.speculative.lookup import PromptLookupDrafter
from localrun.speculative.loop import generate_speculative
from localrun.speculative.mtp import MTPDrafter
from localrun.speculative.stepper import SpeculativeStepper
from localrun.speculative.textlookup import TextLookupDrafter


class Speculation:
    """Drafters and the controller that arbitrates between them and plain
    decoding. Lives as long as the target engine: a chat keeps one across
    turns, so measurements and the draft's cache carry over.

    ``verify_curve``: the cost of a verify batch of r rows over one row's
    (r = 1..), as `localrun tune` measured it on this machine, for the
    `AdaptiveController` made when no ``controller`` is given, and for the
    shape of batches: padding, drafting in a shared batch; ``growth``: how
    a plain step grows with the context there, for the curve at depth
    (`control.StepGrowth`)."""

    def __init__(
        self,
        drafters: Sequence[Drafter],
        controller: Controller | None = None,
        verify_curve: Sequence[float] | None = None,
        growth: StepGrowth | None = None,
    ) -> None:
        if not drafters:
            raise ValueError("speculation needs at least one drafter")
        self.drafters = list(drafters)
        self.controller = controller or AdaptiveController(
            [d.profile for d in self.drafters], verify_curve=verify_curve, growth=growth
        )
        self.disabled: set[int] = set()  # drafters that failed to load
        self.curve = None if verify_curve is None else checked_curve(verify_curve)  # for batch shapes

    def drafts_in_batch(self, rows: int) -> bool:
        """Whether sequences decoding together in a batch of ``rows`` rows may
        draft: the verify curve says extra rows are nearly free there (a GPU)."""
        return drafts_in_batch(self.curve, rows)

    def padded(self, rows: int, limit: int) -> int:
        """The size a batch of ``rows`` rows is padded to where the verify curve favours it."""
        return padded_rows(self.curve, rows, limit)

    def observe_batch(self, rows: int, seconds: float) -> None:
        """The controller learns a shared batch's time."""
        self.controller.observe_batch(rows, seconds)

    @property
    def label(self) -> str:
        return "+".join(d.profile.name for d in self.drafters)

    def generate(
        self, engine: Engine, prompt_tokens: Sequence[int], sampling: SamplingParams, **options: Unpack[GenerateOptions]
    ) -> Iterator[Event]:
        """Like `runtime.generate.generate`, with speculation."""
        return generate_speculative(engine, prompt_tokens, sampling, speculation=self, **options)

    def stepper(self, target: SteppedSequence, sampling: SamplingParams) -> SpeculativeStepper:
        """The stepper of one sequence: its drafts, checked by ``sampling``, and their tally."""
        return SpeculativeStepper(target, self, sampling)

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


def speculation_refused(engine: Engine) -> str | None:
    """Why ``engine`` cannot speculate, or None: a recurrent memory of an
    architecture llama.cpp keeps no rollback snapshots for (it clamps
    ``n_rs_seq`` to 0), so every rejected draft would cost evaluating the
    sequence again."""
    cuts = engine.cuts
    if not cuts.recurrent or cuts.depth > 0:
        return None
    return (
        f"{engine.info.architecture} models keep a recurrent state that llama.cpp cannot take back "
        "to a rejected draft's position"
    )


def open_speculation(
    engine: Engine,
    choice: str,
    draft_path: Path | None = None,
    verify_curve: Sequence[float] | None = None,
    growth: StepGrowth | None = None,
) -> Speculation | None:
    """The speculation `--draft CHOICE` asks for. ``choice``: none (None is
    returned), lookup (`lookup_drafters`), mtp (the model's own MTP head:
    `MTPDrafter`, an error where it has none), auto (prompt lookup, the MTP
    head where the model has one and it can run, plus ``draft_path`` if given: the
    model's matched draft, loaded only if the controller wants it), or anything
    else with ``draft_path`` naming that draft model (loaded now).
    ``verify_curve``, ``growth``: the verify-cost curve `localrun tune`
    measured for this model on this machine, and how a step grows with the
    context, if known (see `Speculation`)."""
    if choice == "none":
        return None
    refused = speculation_refused(engine)
    if refused is not None:
        if choice == "auto":
            return None
        raise UsageError(f"--spec {choice} cannot run here: {refused}", hint="--spec none (or leave --spec out)")
    if choice == "mtp":
        return Speculation([MTPDrafter(engine)], verify_curve=verify_curve, growth=growth)
    drafters: list[Drafter] = []
    if choice in ("auto", "lookup"):
        drafters += lookup_drafters(engine)
    try:
        if choice != "lookup" and draft_path is not None:
            drafters.append(DraftModelDrafter(draft_path, engine, eager=choice != "auto", verify_curve=verify_curve))
        if choice == "auto" and engine.mtp_layers:
            # the controller stops it where it does not pay; where it cannot run (no room for its context), auto
            # goes on without it
            with suppress(MTPUnavailableError, EngineError):
                drafters.append(MTPDrafter(engine))
    except BaseException:
        for made in drafters:  # nothing of a speculation that could not be made stays hooked to the engine
            made.close()
        raise
    return Speculation(drafters, verify_curve=verify_curve, growth=growth) if drafters else None
