"""Ratios between two contenders measured in interleaved rounds.

Each ratio is taken within a round (runs seconds apart), then summarised over
rounds by the median: slow drift of a shared machine cancels out.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable


def round_ratios(a: Iterable[float], b: Iterable[float]) -> list[float]:
    """``a / b`` for each round, sorted."""
    return sorted(x / y for x, y in zip(a, b, strict=True))


def median_ratio(a: Iterable[float], b: Iterable[float]) -> float:
    """The median over rounds of the ratio within each round."""
    return statistics.median(round_ratios(a, b))


def ratio_summary(a: Iterable[float], b: Iterable[float], *, range_of_one: bool = True) -> str:
    """``1.234x (range 1.100-1.300)``: the median ratio and its range over
    rounds; with ``range_of_one`` false, a single round shows no range."""
    r = round_ratios(a, b)
    text = f"{statistics.median(r):.3f}x"
    if len(r) > 1 or range_of_one:
        text += f" (range {r[0]:.3f}-{r[-1]:.3f})"
    return text
