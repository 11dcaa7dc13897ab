"""What a drafter is: the `Drafter` interface, and what it tells the
controller (`Profile`, `Offer`) and gives the loop (`Draft`).

A drafter first makes an `Offer` (cheap: how long a draft it could make, a
bucket that predicts how good it will be, how many tokens it must catch up
on); the controller picks, and `draft` makes the tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from localrun.runtime.sampling import SamplingParams
from localrun.speculative.sampling import Probs

LOOKUP_MAX = 32  # the longest draft prompt lookup offers
MODEL_MAX = 8  # the longest draft a draft model offers


@dataclass(frozen=True)
class Profile:
    """What the controller assumes about a drafter before it has measured it."""

    name: str
    step_cost: float  # one drafted token, as a fraction of a plain target step
    catch_up_cost: float  # one token of catch-up evaluation, as a fraction of a plain step
    setup_s: float  # a one-time cost before the first draft (loading), seconds
    acceptance: tuple[float, ...]  # prior acceptance per bucket
    free: bool  # drafting costs next to nothing (no model runs)


@dataclass(frozen=True)
class Offer:
    """What a drafter could do at this step."""

    drafter: int  # its index in the speculation's drafters
    bucket: int = 0  # a class of situation with its own acceptance estimate
    max_len: int = 1
    catch_up: int = 0  # tokens it must evaluate before it can draft


@dataclass
class Draft:
    tokens: list[int]
    probs: list[Probs] | None = None  # the distribution each token was drawn from; None: deterministic
    n_sync: int = 0  # tokens evaluated to catch up before drafting
    sync_s: float = 0.0
    steps_s: float = 0.0  # the rest of the drafting time


class Mask(Protocol):
    """What the grammar allows, for drafting under it (a fork of the output's
    state: `localrun.structured.constraint.Constraint.fork`)."""

    n_vocab: int

    def apply(self, logits: Any) -> None:
        """Mask one row of logits in place to what the grammar allows next."""

    def consume(self, token: int) -> None: ...

    @property
    def stopped(self) -> bool: ...


class Drafter(Protocol):
    profile: Profile

    def begin(self, context: Sequence[int]) -> None:
        """A new generation starts after ``context`` (its prompt)."""

    def offer(self, context: Sequence[int], index: int) -> Offer | None:
        """What it could draft after ``context`` now, cheaply; None: nothing."""

    def draft(
        self,
        context: Sequence[int],
        n: int,
        sampling: SamplingParams,
        rng: np.random.Generator,
        mask: Mask | None = None,
    ) -> Draft:
        """Up to ``n`` tokens to follow ``context``; a drafter that runs a model
        drafts under ``mask`` when there is one (the loop cuts any draft at the
        first token the grammar rejects)."""

    def close(self) -> None: ...
