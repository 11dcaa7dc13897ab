#!/usr/bin/env python3
"""Decode speed while other processes compete for the cores: localrun's
default (adapting) thread count against every fixed --threads, in one run.

    .venv/bin/python scripts/bench_load.py MODEL [MODEL ...] [--loads 0,1,2]
        [--rounds 3] [--tokens 64] [--batch 16] [--batch-loads 1]
        [--native PATH/TO/llama-completion] [--draft DRAFT --draft-loads 1]
        [--chat 4 --chat-loads 1]

For each model and each load (N CPU-bound busy loops, like `yes > /dev/null`,
running through every round of it), each round runs, in a rotating order:
  default   `localrun generate --spec none --raw -t 0 -n TOKENS --json PROMPT`
            as a user starts it (no --threads)
  t1 .. tN  the same with a fixed --threads t, t = 1 to the CPUs this process may use
  ll        llama-completion with its own defaults (--native; loads of 2 or more)
and, with --batch K under the loads of --batch-loads, the same K prompts
through `localrun generate --batch` (batch, then bt1 .. btN with --threads):
aggregate tokens/sec = generated tokens / the last record's elapsed seconds;
and with --draft, generate with `--draft-model DRAFT` (speculation as the
controller decides: draft, then dt1 .. dtN with --threads), under the loads
of --draft-loads: the draft model's context follows the target's threads;
and with --chat K, K turns of `localrun chat` in a pipe as a user runs it
(its speculation as configured: none given), under the loads of
--chat-loads (chat, then ct1 .. ctN with --threads): the turns' tokens over
their decode seconds.

Printed per column: the median decode tok/s and its range; for `default`, the
threads its runs ended with, and its time per token p50 and p95 (from each
run's history record, the median over rounds). Then the ratios, each the
median of the ratios within a round, with the range:
  default / the best fixed --threads in hindsight  (goal >= 0.95x at every load)
  default / llama-completion's default              (goal >= 1.4x under 2 processes)
  p95 / p50 of default's time per token              (goal <= 3x under 1 process)
  batch / the best fixed --threads of --batch       (goal >= 0.9x under 1 process)
  draft / the best fixed --threads with the draft   (goal >= 0.9x)
  chat / --threads 1 of chat                         (goal >= 1x under 1 process: no worse)
Every localrun run writes its history into a temporary LOCALRUN_HOME: no
wisdom or config of this machine applies (a new user's defaults).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from localrun.openmp import others_environ
from localrun.system import cpu_count
from scripts._load import cpu_load
from scripts._models import HelpFormatter, model_path
from scripts._native import timings
from scripts._stats import median_ratio, ratio_summary
from scripts.bench_decode import PROMPT

HERE = Path(__file__).resolve().parent.parent
BATCH_PROMPTS = (
    "Write a Python function that reverses a string.",
    "Explain what a hash map is in two sentences.",
    "List three uses of a binary search.",
    "What does the `yield` keyword do in Python?",
)


class Runner:
    """Runs each column once and returns its figures: (tok/s, p50 ms, p95 ms)."""

    def __init__(
        self,
        model: Path,
        tokens: int,
        home: Path,
        batch_file: Path | None,
        native: str | None,
        draft: Path | None = None,
        chat_turns: int = 0,
    ) -> None:
        self.model, self.tokens, self.batch_file, self.native, self.draft = model, tokens, batch_file, native, draft
        self.chat_turns = chat_turns
        self.env = {**others_environ(), "LOCALRUN_HOME": str(home)}
        self.ended: list[int] = []

    def _localrun(
        self, *args: str, command: str = "generate", stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        raw = ["--raw"] if command == "generate" else []  # a chat's turns go through the chat template
        cmd = [sys.executable, "-m", "localrun", command, "-m", str(self.model), *raw, "-t", "0", *args]
        piped = {"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, env=self.env, check=False, **piped)
        if out.returncode != 0:
            raise RuntimeError(f"localrun failed ({out.returncode}):\n{out.stderr[-2000:]}")
        return out

    def _last_record(self) -> dict[str, object]:
        cmd = [sys.executable, "-m", "localrun", "logs", "-n", "1", "--json"]
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, env=self.env, check=True)
        records: list[dict[str, object]] = json.loads(out.stdout)
        return records[0]

    def generate(self, threads: int | None) -> tuple[float, float, float]:
        args = ["--spec", "none", "-n", str(self.tokens), "--json"]
        args += ["--threads", str(threads)] if threads else []
        done = json.loads(self._localrun(*args, PROMPT).stdout.strip().splitlines()[-1])
        if threads is None:
            self.ended.append(done["threads"])
        record = self._last_record()
        p50, p95 = record.get("p50_token_ms"), record.get("p95_token_ms")
        return done["decode_tokens_per_s"], float(p50 or 0), float(p95 or 0)  # type: ignore[arg-type]

    def drafted(self, threads: int | None) -> tuple[float, float, float]:
        assert self.draft is not None
        args = ["--draft-model", str(self.draft), "-n", str(self.tokens), "--json", "--no-log"]
        args += ["--threads", str(threads)] if threads else []
        done = json.loads(self._localrun(*args, PROMPT).stdout.strip().splitlines()[-1])
        return done["decode_tokens_per_s"], 0.0, 0.0

    def batch(self, threads: int | None) -> tuple[float, float, float]:
        assert self.batch_file is not None
        args = ["--batch", str(self.batch_file), "-n", str(self.tokens), "--no-log"]
        args += ["--threads", str(threads)] if threads else []
        records = [json.loads(line) for line in self._localrun(*args).stdout.splitlines() if line.startswith("{")]
        tokens = sum(r["generated_tokens"] for r in records)
        return tokens / max(r["elapsed_s"] for r in records), 0.0, 0.0

    def chat(self, threads: int | None) -> tuple[float, float, float]:
        lines = "".join(BATCH_PROMPTS[i % len(BATCH_PROMPTS)] + "\n" for i in range(self.chat_turns))
        args = ["-n", str(self.tokens), "--json", "--no-log"]
        args += ["--threads", str(threads)] if threads else []
        records = [json.loads(line) for line in self._localrun(*args, command="chat", stdin=lines).stdout.splitlines()]
        done = [r for r in records if r.get("type") == "done" and r["decode_tokens_per_s"] > 0]
        tokens = sum(r["generated_tokens"] - 1 for r in done)  # a turn's rate runs from its first token on
        return tokens / sum((r["generated_tokens"] - 1) / r["decode_tokens_per_s"] for r in done), 0.0, 0.0

    def llama(self) -> tuple[float, float, float]:
        assert self.native is not None
        cmd = [self.native, "-m", str(self.model), "-p", PROMPT, "-n", str(self.tokens), "--temp", "0"]
        cmd += ["--ignore-eos", "-no-cnv", "--no-warmup"]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=others_environ())
        return timings(out.stderr).decode_per_s, 0.0, 0.0


def _columns(runner: Runner, load: int, args: argparse.Namespace) -> dict[str, object]:
    """The columns that run under ``load``, by name."""
    cpus = cpu_count()
    columns: dict[str, object] = {"default": lambda: runner.generate(None)}
    columns |= {f"t{t}": (lambda t=t: runner.generate(t)) for t in range(1, cpus + 1)}
    if runner.native and load >= 2:
        columns["ll"] = runner.llama
    if runner.batch_file is not None and load in args.batch_loads:
        columns["batch"] = lambda: runner.batch(None)
        columns |= {f"bt{t}": (lambda t=t: runner.batch(t)) for t in range(1, cpus + 1)}
    if runner.draft is not None and load in args.draft_loads:
        columns["draft"] = lambda: runner.drafted(None)
        columns |= {f"dt{t}": (lambda t=t: runner.drafted(t)) for t in range(1, cpus + 1)}
    if runner.chat_turns and load in args.chat_loads:
        columns["chat"] = lambda: runner.chat(None)
        columns |= {f"ct{t}": (lambda t=t: runner.chat(t)) for t in range(1, cpus + 1)}
    return columns


def _run_load(runner: Runner, load: int, args: argparse.Namespace) -> None:
    cpus = cpu_count()
    columns = _columns(runner, load, args)
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in columns}
    runner.ended = []
    names = list(columns)
    with contextlib.ExitStack() as stack:
        if load:
            stack.enter_context(cpu_load(load))
        for r in range(args.rounds):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                results[name].append(columns[name]())  # type: ignore[operator]
    print(f"\n{runner.model.name}, {load} competing CPU-bound processes, {args.rounds} rounds")
    for name, figures in results.items():
        rates = [f[0] for f in figures]
        print(f"  {name:<8} {statistics.median(rates):8.2f} tok/s  ({min(rates):.2f}-{max(rates):.2f})")
    default = [f[0] for f in results["default"]]
    print(f"  default ended on {', '.join(map(str, runner.ended))} threads")
    p50s, p95s = [f[1] for f in results["default"]], [f[2] for f in results["default"]]
    if all(p50s):
        ratios = [b / a for a, b in zip(p50s, p95s, strict=True)]
        print(
            f"  default p50 {statistics.median(p50s):.1f} ms, p95 {statistics.median(p95s):.1f} ms per token: "
            f"p95/p50 {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
        )
    _versus(results, "default", [f"t{t}" for t in range(1, cpus + 1)], 0.95)
    if "ll" in results:
        ll = [f[0] for f in results["ll"]]
        met = "met" if median_ratio(default, ll) >= 1.4 else "NOT met"
        print(f"  default / llama-completion's default: {ratio_summary(default, ll)}  (goal >= 1.4x: {met})")
    if "batch" in results:
        _versus(results, "batch", [f"bt{t}" for t in range(1, cpus + 1)], 0.9)
    if "draft" in results:
        _versus(results, "draft", [f"dt{t}" for t in range(1, cpus + 1)], 0.9)
    if "chat" in results:
        _versus(results, "chat", [f"ct{t}" for t in range(1, cpus + 1)], None)
        _versus(results, "chat", ["ct1"], 1.0)


def _versus(
    results: dict[str, list[tuple[float, float, float]]], name: str, fixed: Sequence[str], goal: float | None
) -> None:
    """``name`` against the best of the ``fixed`` columns in hindsight (one: that column)."""
    best = max(fixed, key=lambda c: statistics.median(f[0] for f in results[c]))
    a, b = [f[0] for f in results[name]], [f[0] for f in results[best]]
    against = f"best fixed ({best})" if len(fixed) > 1 else best
    met = "" if goal is None else f"  (goal >= {goal}x: {'met' if median_ratio(a, b) >= goal else 'NOT met'})"
    print(f"  {name} / {against}: {ratio_summary(a, b)}{met}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("models", nargs="+", help="model names or GGUF paths")
    ap.add_argument("--loads", default="0,1,2", help="competing processes, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=0, help="prompts for the --batch columns (0: none)")
    ap.add_argument("--batch-loads", default="1", help="the loads the --batch columns run under")
    ap.add_argument("--native", help="path to llama-completion (its default under 2 or more processes)")
    ap.add_argument("--draft", help="a draft model for the target: the --draft-model columns")
    ap.add_argument("--draft-loads", default="1", help="the loads the draft columns run under")
    ap.add_argument("--chat", type=int, default=0, help="turns of each `localrun chat` run (0: no chat columns)")
    ap.add_argument("--chat-loads", default="1", help="the loads the chat columns run under")
    args = ap.parse_args()
    args.batch_loads = {int(x) for x in args.batch_loads.split(",")}
    args.draft_loads = {int(x) for x in args.draft_loads.split(",")}
    args.chat_loads = {int(x) for x in args.chat_loads.split(",")}
    loads = [int(x) for x in args.loads.split(",")]
    print(f"{cpu_count()} CPUs, {args.tokens} greedy tokens per run; GOMP_SPINCOUNT as localrun sets it")
    with tempfile.TemporaryDirectory() as home:
        batch_file = None
        if args.batch:
            batch_file = Path(home) / "prompts.txt"
            lines = (BATCH_PROMPTS[i % len(BATCH_PROMPTS)] + f" ({i})" for i in range(args.batch))
            batch_file.write_text("\n".join(lines) + "\n")
        for name in args.models:
            draft = model_path(args.draft) if args.draft else None
            runner = Runner(model_path(name), args.tokens, Path(home), batch_file, args.native, draft, args.chat)
            for load in loads:
                _run_load(runner, load, args)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
