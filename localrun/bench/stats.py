"""The arithmetic of `localrun bench`: the spread between repeats
(percentiles: `localrun.quantiles`), and the advice drawn from a finished table. Pure functions on
numbers, so tests can feed them known samples and synthetic rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from localrun.quantiles import median

# A setting whose perplexity rises more than this over the baseline is not
# recommended, however fast it is (a q4_0 K cache ruins Qwen2.5: docs/benchmarks.md).
QUALITY_LIMIT = 0.02


def relative_range(samples: Sequence[float]) -> float:
    """(max - min) / median of the repeats: how far apart they landed; 0 for one
    (a row's `spread`; `localrun.tune.race.relative_iqr` weighs noise with quartiles)."""
    mid = median(samples)
    return (max(samples) - min(samples)) / mid if mid > 0 else 0.0


@dataclass
class Row:
    """One line of the table: a technique measured over several repeats, or
    a slot whose technique this build cannot run (``available`` False)."""

    technique: str
    available: bool = True
    note: str = ""
    sequences: int = 1  # sequences decoded together; tokens/sec is their aggregate
    decode_tokens_per_s: float | None = None  # median of the repeats
    repeats_tokens_per_s: list[float] = field(default_factory=list)
    spread: float | None = None
    speedup: float | None = None  # against the baseline's median
    p50_token_ms: float | None = None
    p95_token_ms: float | None = None
    ttft_s: float | None = None
    peak_rss_bytes: int | None = None
    kv_bytes_per_token: float | None = None  # measured: llama.cpp's KV buffer / its cells
    context_fits: int | None = None  # tokens of KV cache that fit the memory budget
    perplexity: float | None = None
    perplexity_change: float | None = None  # relative to the baseline's perplexity
    settings: dict[str, Any] | None = None  # the user defaults this row stands for; None: not a setting
    extra: dict[str, float] = field(default_factory=dict)  # technique-specific figures

    @property
    def measured(self) -> bool:
        return self.available and self.decode_tokens_per_s is not None

    def as_dict(self) -> dict[str, Any]:
        return {
            "technique": self.technique,
            "available": self.available,
            "note": self.note,
            "sequences": self.sequences,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "speedup": self.speedup,
            "p50_token_ms": self.p50_token_ms,
            "p95_token_ms": self.p95_token_ms,
            "ttft_s": self.ttft_s,
            "peak_rss_bytes": self.peak_rss_bytes,
            "spread": self.spread,
            "repeats_tokens_per_s": self.repeats_tokens_per_s,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "context_fits": self.context_fits,
            "perplexity": self.perplexity,
            "perplexity_change": self.perplexity_change,
            "settings": self.settings,
            **self.extra,
        }


def relate_to_baseline(rows: Sequence[Row], baseline: Row) -> None:
    """Fill each measured row's speedup and perplexity change."""
    for row in rows:
        if row.measured and baseline.decode_tokens_per_s:
            row.speedup = (row.decode_tokens_per_s or 0.0) / baseline.decode_tokens_per_s
        if row.perplexity is not None and baseline.perplexity:
            row.perplexity_change = row.perplexity / baseline.perplexity - 1


@dataclass(frozen=True)
class Advice:
    interactive: str | None  # technique of the row to use for one conversation
    batch: str | None  # for throughput over many requests
    defaults: dict[str, Any]  # what --save-defaults writes
    text: str

    def as_dict(self) -> dict[str, Any]:
        return {"interactive": self.interactive, "batch": self.batch, "defaults": self.defaults, "text": self.text}


def _quality_ok(row: Row) -> bool:
    return row.perplexity_change is None or row.perplexity_change <= QUALITY_LIMIT


def _beats(row: Row, other: Row) -> bool:
    """Faster than ``other`` by more than the spread of either's repeats."""
    a, b = row.decode_tokens_per_s or 0.0, other.decode_tokens_per_s or 0.0
    if b <= 0:
        return a > 0
    noise = max(row.spread or 0.0, other.spread or 0.0)
    return a / b - 1 > noise


def _pick(candidates: Sequence[Row], baseline: Row) -> Row:
    best = max(candidates, key=lambda r: r.decode_tokens_per_s or 0.0)
    return best if best is baseline or _beats(best, baseline) else baseline


def _describe(row: Row, baseline: Row) -> str:
    rate = f"{row.decode_tokens_per_s or 0:.1f} tok/s{' aggregate' if row.sequences > 1 else ''}"
    if row is baseline:
        return f"{row.technique} ({rate})"
    return f"{row.technique} ({rate}, {row.speedup or 0:.2f}x)"


def advise(rows: Sequence[Row], baseline: Row) -> Advice:
    """The fastest setting for interactive use (one sequence) and for batch
    work (any number of sequences, by aggregate tokens/sec), among rows that
    stand for a setting and keep perplexity within QUALITY_LIMIT of the
    baseline. A row wins over the baseline only by more than the noise (the
    larger spread of the two); otherwise the baseline is advised."""
    candidates = [r for r in rows if r.measured and r.settings is not None and _quality_ok(r)]
    if baseline not in candidates:
        candidates.append(baseline)
    interactive = _pick([r for r in candidates if r.sequences == 1], baseline)
    batch = _pick(candidates, baseline)
    defaults = dict(interactive.settings or {})
    if batch.sequences > 1:
        defaults.update({k: v for k, v in (batch.settings or {}).items() if k == "parallel"})
    parts = [f"interactive: {_describe(interactive, baseline)}"]
    parts.append(f"batch: {_describe(batch, baseline)}" if batch is not interactive else "batch: the same")
    rejected = [r.technique for r in rows if r.measured and not _quality_ok(r)]
    if rejected:
        parts.append(f"not advised for quality (perplexity over +{QUALITY_LIMIT:.0%}): {', '.join(rejected)}")
    if interactive is baseline and batch is baseline:
        parts.append("no technique beat the baseline by more than the noise")
    return Advice(interactive.technique, batch.technique, defaults, "; ".join(parts))


def merge_extra(samples: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Median of each technique-specific figure over the repeats."""
    keys = sorted({k for s in samples for k in s})
    return {k: median([s[k] for s in samples if k in s]) for k in keys}
