"""How `localrun bench` shows its results: the Rich table, the progress bar
on stderr while it runs, and the SVG chart."""

from __future__ import annotations

import time
from typing import IO

from rich.progress import BarColumn, MofNCompleteColumn, TaskID, TextColumn, TimeElapsedColumn

from localrun import bench
from localrun.bench.stats import Row
from localrun.ui.progress import bar
from localrun.ui.svgchart import Bar, bar_chart
from localrun.ui.table import Column, FitTable
from localrun.units import count, human_bytes

_DASH = "-"


def _num(value: float | None, fmt: str) -> str:
    return _DASH if value is None else format(value, fmt)


def _tokens(n: int | None) -> str:
    if n is None:
        return _DASH
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f}M"
    return f"{n / 1000:.0f}k" if n >= 10_000 else str(n)


def _perplexity(row: Row) -> str:
    if row.perplexity is None:
        return _DASH
    if row.technique == "baseline" or row.perplexity_change is None:
        return f"{row.perplexity:.2f}"
    return f"{row.perplexity_change:+.1%}"


def _extra(key: str, value: float) -> str:
    if key == "acceptance":
        return f"{value:.0%} of drafted tokens kept"
    if key == "mean_accepted":
        return f"{value:.1f} per step"
    if key == "total_tokens_per_s":
        return f"{value:.3g} tok/s with prompt evaluation"
    return f"{key} {value:.3g}"


def _note(row: Row) -> str:
    parts = [row.note] if row.note else []
    parts += [_extra(k, v) for k, v in row.extra.items()]
    return ", ".join(parts)


def subtitle(result: bench.BenchResult) -> str:
    plan = result.plan
    return (
        f"{'quick' if plan.quick else 'full'}: {count(plan.rounds, 'round')} x {count(len(plan.prompts), 'prompt')} "
        f"x {count(plan.max_tokens, 'token')}, greedy; {count(result.threads, 'thread')}; "
        f"memory budget {result.budget_bytes / 2**30:.1f} GiB"
    )


# the technique and its speed are never cut; the note wraps, and on a narrow
# terminal the other figures go, least telling first
COLUMNS = (
    Column("technique"),
    Column("tok/s", "right"),
    Column("speedup", "right", drop=1),
    Column("spread", "right", drop=8),
    Column("p50 ms", "right", drop=9),
    Column("p95 ms", "right", drop=6),
    Column("TTFT s", "right", drop=7),
    Column("peak RSS", "right", drop=5),
    Column("KV B/tok", "right", drop=10),
    Column("KV fits", "right", drop=4),
    Column("ppl", "right", drop=3),
    Column("note", wrap=24, drop=2),
)


def table(result: bench.BenchResult) -> FitTable:
    t = FitTable(
        COLUMNS, title=f"{result.model.name} ({result.quantization})", caption=subtitle(result), caption_justify="left"
    )
    for row in result.rows:
        if not row.measured:
            t.add_row(row.technique, *[_DASH] * 10, row.note, style="dim")
            continue
        t.add_row(
            row.technique + (f" (x{row.sequences})" if row.sequences > 1 else ""),
            _num(row.decode_tokens_per_s, ".1f"),
            _num(row.speedup, ".2f") + "x",
            _num(row.spread, ".0%"),
            _num(row.p50_token_ms, ".1f"),
            _num(row.p95_token_ms, ".1f"),
            _num(row.ttft_s, ".2f"),
            human_bytes(row.peak_rss_bytes) if row.peak_rss_bytes else _DASH,
            _num(row.kv_bytes_per_token, ",.0f"),
            _tokens(row.context_fits),
            _perplexity(row),
            _note(row),
        )
    return t


def chart(result: bench.BenchResult) -> str:
    bars = []
    for row in result.rows:
        if row.measured and row.decode_tokens_per_s is not None:
            rates = row.repeats_tokens_per_s
            bars.append(
                Bar(
                    row.technique,
                    row.decode_tokens_per_s,
                    f"{row.decode_tokens_per_s:.1f} tok/s  {row.speedup or 0:.2f}x",
                    low=min(rates) if rates else None,
                    high=max(rates) if rates else None,
                )
            )
        else:
            bars.append(Bar(row.technique, None, row.note))
    baseline = next((r.decode_tokens_per_s for r in result.rows if r.technique == "baseline"), None)
    return bar_chart(
        f"localrun bench: {result.model.name} ({result.quantization})",
        subtitle(result) + "\nbars: median of the rounds; whiskers: their range; dashed line: the baseline",
        bars,
        unit="decode tokens/sec",
        reference=baseline,
    )


class BenchProgress:
    """A progress bar on stderr when it is a terminal; otherwise a line per step."""

    def __init__(self, err: IO[str], *, terminal: bool | None = None) -> None:
        self.err = err
        self._t0 = time.perf_counter()
        self._task: TaskID | None = None
        self._progress = bar(
            err,
            TextColumn("bench"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            terminal=terminal,
        )

    def __enter__(self) -> BenchProgress:
        if self._progress is not None:
            self._progress.start()
            self._task = self._progress.add_task("loading", total=None)
        return self

    def update(self, step: bench.Progress) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=step.done, total=step.total, description=step.label)
        elif step.done < step.total:
            elapsed = time.perf_counter() - self._t0
            self.err.write(f"bench [{step.done + 1}/{step.total}] {elapsed:5.0f}s {step.label}\n")
            self.err.flush()

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
