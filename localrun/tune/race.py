"""Interleaved repeated measurement: every candidate once per round, in a
rotating order, until the best is separated from the rest beyond noise, or
the rounds or the time run out.

Separated: the best's upper quartile lies below the other's lower quartile
and their medians differ by more than the tie margin and the samples' own
spread. A candidate that
cannot be separated from the best is tied with it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from localrun.tune.wisdom import TIE_MARGIN

K = TypeVar("K", bound=Hashable)


def _quartiles(xs: Sequence[float]) -> tuple[float, float]:
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def relative_iqr(xs: Sequence[float]) -> float:
    """The interquartile range as a share of the median: how noisy a candidate's samples are."""
    lo, hi = _quartiles(xs)
    m = statistics.median(xs)
    return (hi - lo) / m if m > 0 else 0.0


def separated(best: Sequence[float], other: Sequence[float], margin: float = TIE_MARGIN) -> bool:
    """Whether ``best`` (lower is better) is faster than ``other`` beyond noise:
    its upper quartile below the other's lower one, and the medians further
    apart than the margin and than the samples' own typical spread."""
    mb, mo = statistics.median(best), statistics.median(other)
    noise = (relative_iqr(best) + relative_iqr(other)) / 2
    return mo - mb > max(margin, noise) * mb and _quartiles(best)[1] < _quartiles(other)[0]


def settled_tie(a: Sequence[float], b: Sequence[float], margin: float = TIE_MARGIN) -> bool:
    """Whether ``a`` and ``b`` are surely within the margin of each other: both
    interquartile ranges lie inside a band of the margin's width."""
    lo = min(_quartiles(a)[0], _quartiles(b)[0])
    hi = max(_quartiles(a)[1], _quartiles(b)[1])
    return hi - lo <= margin * lo


@dataclass
class Race(Generic[K]):
    """Samples per candidate (lower is better: seconds, or seconds per token)."""

    candidates: Sequence[K]
    samples: dict[K, list[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for c in self.candidates:
            self.samples.setdefault(c, [])

    def median(self, c: K) -> float:
        return statistics.median(self.samples[c])

    @property
    def best(self) -> K:
        return min(self.candidates, key=self.median)

    def tied(self) -> list[K]:
        """The candidates the best cannot be told apart from (the best first)."""
        best = self.best
        return [best] + [c for c in self.candidates if c != best and not separated(self.samples[best], self.samples[c])]

    def decided(self) -> bool:
        """Every other candidate is either separated from the best or surely tied with it."""
        best = self.samples[self.best]
        return all(
            separated(best, self.samples[c]) or settled_tie(best, self.samples[c])
            for c in self.candidates
            if c != self.best
        )

    def run(
        self,
        sample: Callable[[K], float],
        *,
        min_rounds: int = 3,
        max_rounds: int = 10,
        deadline: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_round: Callable[[int], None] | None = None,
    ) -> Race[K]:
        """Add rounds until `decided`, ``max_rounds``, or ``deadline`` (a
        ``clock`` time; at least one round always runs)."""
        for r in range(max_rounds):
            order = list(self.candidates)
            k = r % len(order)
            for c in order[k:] + order[:k]:  # rotate: no candidate always runs first after a pause
                self.samples[c].append(sample(c))
            if on_round is not None:
                on_round(r + 1)
            if r + 1 >= min_rounds and self.decided():
                break
            if deadline is not None and clock() >= deadline:
                break
        return self

    def choice(self, default: K | None) -> K | None:
        """The best, or ``default`` (None: no choice) when the best is tied with another."""
        tied = self.tied()
        if len(tied) == 1:
            return tied[0]
        return default if default in tied or default is None else tied[0]
