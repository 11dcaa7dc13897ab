"""Percentiles of measured samples, one way for the whole package: q from 0
to 100, interpolating linearly between the two nearest ranks (numpy's
default "linear" method)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) of ``samples`` (in any order)."""
    if not samples:
        raise ValueError("percentile of no samples")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0-100")
    ordered = sorted(samples)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(samples: Sequence[float]) -> float:
    return percentile(samples, 50)
