"""The run history's two goals, measured: what logging adds to a run, and how
long `localrun logs stats` takes over a large history.

Everything happens in a temporary folder (LOCALRUN_HOME), with a synthetic
history of --records runs: three models, three KV types, drafting on and
off, four commands, prompts and responses of a few dozen words, spread over
--days days. No model is loaded.

Figures printed:
- record: the time `Recorder.flush` takes to write one run (median and p95
  over --repeats runs), into an empty history and into the large one; and
  what `Recorder.watch` adds per token (its wrapper and one list append);
- stats: `localrun logs stats` in process (median of --repeats), for a
  plain summary, --by model,kv,draft, --compare kv=f16 kv=q8_0, a -q search
  and the newest-first listing; and one `python -m localrun logs stats
  --by model,kv` process, start-up included.

    .venv/bin/python scripts/bench_history.py                 # 100k records
    .venv/bin/python scripts/bench_history.py --records 2000  # a quick look
"""

from __future__ import annotations

import argparse
import io
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localrun.events import Event

WORDS = [
    *("function", "class", "return", "value", "list", "string", "parse", "json", "file", "error", "test"),
    *("model", "token", "cache", "speed", "memory", "thread", "python", "rust", "sort", "merge", "branch"),
    *("commit", "refactor", "rename", "variable", "loop", "index", "query", "table", "schema", "server"),
]


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def build(path: Path, records: int, days: float, seed: int = 0) -> float:
    """A synthetic history of ``records`` runs at ``path``; seconds it took."""
    from localrun.events import DraftStats, Stats
    from localrun.history.db import connect, transaction
    from localrun.history.record import _INSERT, COLUMNS, RunContext, row

    rng = random.Random(seed)
    models = {"qwen-coder:1.5b": 11.0, "qwen-coder:0.5b": 26.0, "smollm2:135m": 60.0}
    kv_speed = {"f16": 1.0, "q8_0": 0.85, "q4_0": 0.7}
    contexts = {
        (m, kv, draft, command): RunContext(
            command, model=m, kv=kv, flash_attn="auto", draft=draft, ctx=4096, threads=2, cpu="synthetic CPU"
        )
        for m in models
        for kv in kv_speed
        for draft in ("auto", "none")
        for command in ("generate", "chat", "batch", "serve")
    }
    keys = list(contexts)
    now = time.time()
    t0 = time.perf_counter()
    with connect(path) as conn:
        batch: list[list[object]] = []
        for i in range(records):
            m, kv, draft, _ = key = rng.choice(keys)
            rate = models[m] * kv_speed[kv] * rng.uniform(0.8, 1.1) * (1.1 if draft == "auto" else 1.0)
            n = rng.randint(16, 400)
            drafted = rng.randint(0, n) if draft == "auto" else 0
            stats = Stats(
                prompt_tokens=rng.randint(10, 800),
                generated_tokens=n,
                ttft_s=rng.uniform(0.05, 1.5),
                decode_tokens_per_s=rate,
                elapsed_s=n / rate,
                stop_reason="eos",
                draft=DraftStats("lookup", drafted, int(drafted * rng.uniform(0.3, 0.9))) if drafted else None,
            )
            values = row(
                contexts[key],
                stats,
                prompt=_text(rng, rng.randint(5, 40)),
                response=_text(rng, rng.randint(20, 80)),
                exit_status=0,
                when=now - days * 86400 * (1 - i / records),
                token_p50_ms=1000 / rate,
                token_p95_ms=1300 / rate,
            )
            batch.append([values.get(name) for name in COLUMNS])
            if len(batch) == 5000:
                with transaction(conn):
                    conn.executemany(_INSERT, batch)
                batch.clear()
        if batch:
            with transaction(conn):
                conn.executemany(_INSERT, batch)
    return time.perf_counter() - t0


def _events(n: int) -> Iterator[Event]:
    from localrun.events import DoneEvent, Stats, TokenEvent

    for i in range(1, n + 1):
        yield TokenEvent(" tok", i, 0.1, 0.1 + i * 0.02, 50.0)
    yield DoneEvent(Stats(20, n, 0.1, 50.0, 0.1 + n * 0.02, "eos"))


def time_record(repeats: int, tokens: int) -> tuple[list[float], float]:
    """(flush times in ms, watch overhead per token in ns)."""
    from localrun.history.record import Recorder, RunContext

    context = RunContext("generate", model="bench", kv="f16", draft="auto", ctx=4096, threads=2)
    flushes = []
    for _ in range(repeats):
        recorder = Recorder(context, warn=lambda m: print("warning:", m, file=sys.stderr))
        for _ev in recorder.watch(_events(tokens), "a prompt of a few words"):
            pass
        t0 = time.perf_counter()
        recorder.flush(0)
        flushes.append((time.perf_counter() - t0) * 1000)
    plain, watched = [], []
    for _ in range(repeats):
        events = list(_events(tokens))
        t0 = time.perf_counter()
        for _ev in events:
            pass
        plain.append(time.perf_counter() - t0)
        recorder = Recorder(context, warn=lambda m: None)
        t0 = time.perf_counter()
        for _ev in recorder.watch(events, "p"):
            pass
        watched.append(time.perf_counter() - t0)
    per_token_ns = (statistics.median(watched) - statistics.median(plain)) / tokens * 1e9
    return flushes, per_token_ns


def _cli_seconds(args: list[str], repeats: int) -> float:
    from localrun.cli import main
    from localrun.cli._env import Environment

    times = []
    for _ in range(repeats):
        stdout, stderr = io.StringIO(), io.StringIO()
        t0 = time.perf_counter()
        code = main(args, Environment(io.StringIO(), stdout, stderr))
        times.append(time.perf_counter() - t0)
        if code != 0:
            raise SystemExit(f"localrun {' '.join(args)} failed: {stderr.getvalue()}")
    return statistics.median(times)


def _ms(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return f"median {statistics.median(ordered):.2f} ms, p95 {p95:.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--days", type=float, default=90)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per recorded run")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-history-") as tmp:
        os.environ["LOCALRUN_HOME"] = tmp
        os.environ.pop("LOCALRUN_NO_LOG", None)
        from localrun import paths

        flushes, per_token = time_record(args.repeats, args.tokens)
        print(f"record one run ({args.tokens} tokens) into a new history: {_ms(flushes)}")
        print(f"watch, per token: {per_token:.0f} ns")

        paths.history_db().unlink()
        seconds = build(paths.history_db(), args.records, args.days)
        size = paths.history_db().stat().st_size / 2**20
        print(f"built {args.records} records in {seconds:.1f} s ({size:.0f} MiB)")

        flushes, _ = time_record(args.repeats, args.tokens)
        print(f"record one run into the {args.records}-record history: {_ms(flushes)}")

        runs: list[tuple[str, list[str]]] = [
            ("logs stats", ["logs", "stats"]),
            ("logs stats --by model,kv,draft", ["logs", "stats", "--by", "model,kv,draft"]),
            ("logs stats --compare kv=f16 kv=q8_0", ["logs", "stats", "--compare", "kv=f16", "kv=q8_0"]),
            ("logs stats --by day --since 30d", ["logs", "stats", "--by", "day", "--since", "30d"]),
            ("logs -q 'refactor rename'", ["logs", "-q", "refactor rename"]),
            ("logs -n 20", ["logs"]),
        ]
        repeats = max(3, min(args.repeats, 5))
        for label, argv in runs:
            print(f"{label}: {_cli_seconds(argv, repeats) * 1000:.0f} ms (in process, median of {repeats})")
        chart = Path(tmp) / "chart.svg"
        seconds = _cli_seconds(["logs", "stats", "--by", "kv", "--chart", str(chart)], 1)
        print(f"logs stats --by kv --chart: {seconds * 1000:.0f} ms (in process)")

        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "localrun", "logs", "stats", "--by", "model,kv"],
            check=True,
            capture_output=True,
            env={**os.environ, "LOCALRUN_HOME": tmp},
        )
        print(f"python -m localrun logs stats --by model,kv: {(time.perf_counter() - t0) * 1000:.0f} ms (a process)")


if __name__ == "__main__":
    main()
