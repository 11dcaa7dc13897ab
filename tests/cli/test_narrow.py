"""Tables on narrow terminals: `logs`, `list` and `bench` never cut the ID,
the model or the technique; they wrap or leave out the long columns instead."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from localrun.bench.harness import BenchResult, Plan
from localrun.bench.stats import Advice, Row
from localrun.events import DraftStats, Stats
from localrun.history.record import Recorder, RunContext
from localrun.store.registry import load
from localrun.ui.bench import table
from tests.helpers import cli

WIDTHS = (60, 80, 110)
LONG_MODEL = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"  # a model given by path is logged by its file name


def _log_runs(n: int) -> None:
    for i in range(n):
        model = LONG_MODEL if i % 2 else "qwen2.5-coder:1.5b"
        rec = Recorder(RunContext("generate", model=model, kv="q8_0/q4_0", draft="auto", cpu="test CPU"), warn=print)
        prompt = f"run {i}: explain what this long function does and suggest better names for its variables"
        stats = Stats(120, 256, 0.35, 41.5, 6.2, "length", draft=DraftStats("lookup", 90, 60, 30))
        rec.add(stats, prompt=prompt, response="reply")
        rec.flush(0)


@pytest.mark.parametrize("width", WIDTHS)
def test_logs_keeps_every_id_and_model_whole(width: int) -> None:
    _log_runs(12)  # two-digit IDs
    res = cli("logs", "-n", "5", columns=width)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert all(len(line) <= width for line in lines), res.stdout
    rows = [line.split() for line in lines[1:] if line.strip() and line.split()[0].isdigit()]
    assert [r[0] for r in rows] == ["12", "11", "10", "9", "8"], res.stdout
    models = {word for r in rows for word in r if word.startswith("qwen")}
    assert models == {LONG_MODEL, "qwen2.5-coder:1.5b"}, res.stdout


@pytest.mark.parametrize("width", WIDTHS)
def test_list_keeps_every_alias_whole(width: int) -> None:
    res = cli("list", "--all", columns=width)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert all(len(line) <= width for line in lines), res.stdout
    firsts = {line.split()[0] for line in lines[1:] if line.strip() and not line.startswith("total")}
    assert set(load().entries) <= firsts, res.stdout
    assert "…" not in res.stdout


def _bench_result() -> BenchResult:
    def row(technique: str, rate: float, **kw: object) -> Row:
        return Row(
            technique,
            decode_tokens_per_s=rate,
            speedup=rate / 20,
            spread=0.03,
            p50_token_ms=48.2,
            p95_token_ms=55.0,
            ttft_s=0.31,
            peak_rss_bytes=1_300_000_000,
            kv_bytes_per_token=28_672,
            context_fits=32_768,
            perplexity=9.81,
            **kw,  # type: ignore[arg-type]
        )

    rows = [
        row("baseline", 20.0),
        row("kv-cache q8_0", 19.0, note="a quantized cache buys room for context, not speed, on this CPU"),
        row("speculative auto", 26.0, extra={"acceptance": 0.81, "mean_accepted": 2.4}),
        row("batching n=4", 61.0, sequences=4),
        Row("speculative draft-model", available=False, note="no draft model beside the target: pull one"),
    ]
    advice = Advice("speculative auto", "batching n=4", {}, "use speculative auto")
    return BenchResult(Path("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"), "Q4_K_M", Plan(), 2, 8 << 30, rows, advice)


@pytest.mark.parametrize("width", WIDTHS)
def test_bench_keeps_every_technique_whole(width: int) -> None:
    screen = io.StringIO()
    Console(file=screen, width=width).print(table(_bench_result()))
    shown = screen.getvalue()
    assert all(len(line) <= width for line in shown.splitlines()), shown
    for name in ("baseline", "kv-cache q8_0", "speculative auto", "batching n=4 (x4)", "speculative draft-model"):
        assert name in shown, shown
    assert "…" not in shown
    if width >= 80:  # the note wraps at word ends, not one word a line
        assert "a quantized cache buys" in shown, shown
