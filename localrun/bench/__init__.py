"""`localrun bench`: a ladder of techniques measured on the same prompts.

A technique is a function in `TECHNIQUES` that returns row specs: a label,
the user defaults the row stands for, and a `measure` function that runs one
round of it (load, warm up, generate every prompt) and returns a `Round`.
Rounds are interleaved (round 1 of every row, then round 2 of every row...),
so a slow spell of a noisy machine lands on all rows alike; each row's figure
is the median of its rounds, and the spread between rounds is shown.

To add a technique, write a function ``def rows(bench: Bench) -> list[RowSpec]``
and put it in `TECHNIQUES`; rows a model cannot take are `unavailable(...)`,
which the table shows as such.

The core never prints: it reports `Progress` to a callback.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from localrun.bench.harness import (
    PROMPTS,
    Bench,
    BenchResult,
    Plan,
    Progress,
    Round,
    RowSpec,
    Technique,
    token_times,
)
from localrun.bench.stats import Advice, Row, advise, merge_extra, relate_to_baseline, relative_range
from localrun.bench.techniques import (
    TECHNIQUES,
    attention_rows,
    baseline_rows,
    batching_rows,
    kv_cache_rows,
    other_weights,
    plain_row,
    speculative_rows,
    unavailable,
    weights_rows,
)
from localrun.errors import LocalrunError
from localrun.quantiles import median, percentile
from localrun.runtime.load import LoadWatch
from localrun.runtime.perplexity import Perplexity
from localrun.system import default_threads

__all__ = [
    "PROMPTS",
    "TECHNIQUES",
    "Bench",
    "BenchResult",
    "Plan",
    "Progress",
    "Round",
    "RowSpec",
    "Technique",
    "attention_rows",
    "baseline_rows",
    "batching_rows",
    "kv_cache_rows",
    "other_weights",
    "plain_row",
    "run",
    "speculative_rows",
    "token_times",
    "unavailable",
    "weights_rows",
]


def _summarize(spec: RowSpec, rounds: list[Round], ppl: Perplexity | None) -> Row:
    rates = [r.decode_tokens_per_s for r in rounds]
    times = [t for r in rounds for t in r.token_ms]
    return Row(
        technique=spec.technique,
        note=spec.note or ", ".join(sorted({d for r in rounds for d in r.drafters})),
        sequences=spec.sequences,
        decode_tokens_per_s=median(rates),
        repeats_tokens_per_s=rates,
        spread=relative_range(rates),
        p50_token_ms=percentile(times, 50) if times else None,
        p95_token_ms=percentile(times, 95) if times else None,
        ttft_s=median([r.ttft_s for r in rounds]),
        peak_rss_bytes=max(r.peak_rss_bytes for r in rounds),
        kv_bytes_per_token=rounds[-1].kv_bytes_per_token,
        context_fits=rounds[-1].context_fits,
        perplexity=ppl.value if ppl else None,
        settings=spec.settings,
        extra=merge_extra([r.extra for r in rounds]),
    )


def run(
    bench: Bench,
    progress: Callable[[Progress], None] | None = None,
    techniques: Sequence[Technique] | None = None,
) -> BenchResult:
    """Measure every row in interleaved rounds, then perplexity once per row.
    Ctrl-C (KeyboardInterrupt) once the baseline has a round ends the
    measuring: the result holds what was measured (`interrupted`)."""
    specs = [spec for technique in (techniques or TECHNIQUES) for spec in technique(bench)]
    live = [s for s in specs if s.measure is not None]
    measured = _Measured({s.technique: [] for s in live}, {}, {}, LoadWatch())
    try:
        _measure(bench, live, measured, progress)
    except KeyboardInterrupt:
        if not measured.rounds.get("baseline"):
            raise
        measured.interrupted = True
    finally:
        bench.close()
    rows = [_row(spec, measured) for spec in specs]
    baseline = next((r for r in rows if r.technique == "baseline" and r.measured), None)
    if baseline is None:
        raise RuntimeError("the ladder has no baseline row: a technique list must start with baseline_rows")
    relate_to_baseline(rows, baseline)
    busy = measured.load.busy()
    advice = advise(rows, baseline)
    if busy is not None:
        advice = Advice(None, None, {}, f"none: {busy}; run it again when the machine is idle")
    return BenchResult(
        model=bench.model,
        quantization=bench.shape.quantization,
        plan=bench.plan,
        threads=bench.plan.threads or default_threads(),
        budget_bytes=bench.budget,
        rows=rows,
        advice=advice,
        interrupted=measured.interrupted,
        busy=busy,
    )


@dataclass
class _Measured:
    rounds: dict[str, list[Round]]
    quality: dict[str, Perplexity]
    failed: dict[str, str]  # technique -> why it could not be measured
    load: LoadWatch  # the machine's load, read before each round of a row
    interrupted: bool = False


def _measure(bench: Bench, live: list[RowSpec], got: _Measured, progress: Callable[[Progress], None] | None) -> None:  # noqa: C901  rounds interleaved over rows, then perplexities
    total = bench.plan.rounds * len(live) + sum(1 for s in live if s.quality is not None)
    done = 0

    def step(label: str) -> None:
        nonlocal done
        if progress is not None:
            progress(Progress(done, total, label))
        done += 1

    for r in range(bench.plan.rounds):
        for spec in live:
            if spec.technique in got.failed or spec.measure is None:
                continue
            step(f"round {r + 1}/{bench.plan.rounds} · {spec.technique}")
            got.load.read()
            try:
                got.rounds[spec.technique].append(spec.measure(bench))
            except LocalrunError as exc:  # e.g. a head size a quantized KV cache cannot take
                if spec.technique == "baseline":
                    raise
                got.failed[spec.technique] = exc.message
    for spec in live:
        if spec.quality is not None and spec.technique not in got.failed:
            step(f"perplexity · {spec.technique}")
            got.quality[spec.technique] = spec.quality(bench)
    if progress is not None:
        progress(Progress(total, total, "done"))


def _row(spec: RowSpec, measured: _Measured) -> Row:
    if spec.measure is None or spec.technique in measured.failed:
        return Row(spec.technique, available=False, note=measured.failed.get(spec.technique, spec.note))
    if not measured.rounds[spec.technique]:
        return Row(spec.technique, available=False, note="not measured: interrupted")
    return _summarize(spec, measured.rounds[spec.technique], measured.quality.get(spec.technique))
