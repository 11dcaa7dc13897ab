#!/usr/bin/env python3
"""Measure `localrun generate --batch` side by side with the alternatives, in one run.

    .venv/bin/python scripts/bench_batch.py [MODEL] [--threads N] [--prompts 32]
        [--tokens 128] [--rounds 1] [--sweep 1,2,4,8,16]
        [--serve 8] [--native PATH/TO/llama-batched-bench] [--quick]

1. batch vs one by one: the same prompts of mixed length (one system prompt,
   greedy, up to --tokens each) through `localrun generate --batch` with its
   default --parallel (column "batch": the command as a user runs it, in this
   environment, no --parallel and, unless --threads is given, no --threads),
   and one after another through localrun's own loop
   (`localrun.runtime.generate.generate`, one decoder, so the system prompt is reused
   there too; --threads, else localrun's default_threads()). Aggregate tokens/sec
   = generated tokens / wall time of the generation (model load and tokenization
   left out of both). It also counts how many texts are identical in the two
   runs (greedy decoding).
   The sweep (columns p1, p2, ... p16): the same `localrun generate --batch`
   with a fixed `--parallel p` for each p of --sweep (values above the number
   of prompts are left out: they would run the same as p = prompts), in the
   same rounds. It prints each one's aggregate rate and the ratio batch / the
   best --parallel in hindsight (the sweep point with the highest median rate,
   named; the issue's goal: >= 0.95x), taken within each round.
2. with --serve P: the same prompts through `localrun generate --batch
   --parallel P` against a `localrun serve --parallel P` process on 127.0.0.1
   (column "remote": the OpenAI API, streamed, 8 requests in flight for P = 8)
   beside local `generate --batch --parallel P` (column "local"), in the same
   rounds; the ratio remote / local of aggregate tokens/sec (the issue's goal:
   >= 0.9x) and how many greedy texts are identical.
3. with --native: localrun's batching core against llama.cpp's
   llama-batched-bench at the same batch size (the --parallel of part 1),
   both on random prompts of --pp tokens generating --tokens each, no shared
   prefix. Prints total and decode-phase tokens/sec and their ratios.

Rounds rotate the order of the contenders; ratios are taken within a round,
then the median over rounds. A shared machine is noisy: read the ranges.
`--quick` (8 prompts, 64 tokens, --pp 64) is a shorter run.

MODEL is any localrun model name (a registry alias, owner/repo:QUANT,
hf://owner/repo/file.gguf or a GGUF path); a registry model is pulled on
first use.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from localrun.events import BatchProgress, DoneEvent, TokenEvent
from localrun.openmp import others_environ
from localrun.runtime.batch.scheduler import BatchRequest, run_batch
from localrun.runtime.decoder import Decoder
from localrun.runtime.engine import Engine
from localrun.runtime.generate import generate
from localrun.runtime.prompt import prompt_tokens
from localrun.runtime.sampling import SamplingParams
from localrun.system import default_threads
from scripts._models import HelpFormatter, engine_config, model_path
from scripts._stats import median_ratio, ratio_summary

HERE = Path(__file__).resolve().parent.parent

DEFAULT_MODEL = "qwen2.5-coder:1.5b"
SYSTEM = "You are a concise coding assistant. Answer with short, correct code and at most two sentences."
SHORT = [
    "Write a Python function that reverses a string.",
    "What does the Unix command tee do?",
    "Give a regex that matches an IPv4 address.",
    "Write a bash loop that prints the numbers 1 to 10.",
    "How do I read a JSON file in Go?",
    "Write a SQL query that selects the ten newest orders.",
    "What is the difference between a list and a tuple in Python?",
    "Write a JavaScript function that debounces another function.",
    "How do I make an HTTP GET request with curl and show the headers?",
    "Write a C function that swaps two integers through pointers.",
    "Explain what a mutex is in one sentence.",
    "Write a Rust function that sums a vector of i32.",
    "How do I list the ten largest files in a directory on Linux?",
    "Write a Python generator that yields Fibonacci numbers.",
    "What does git rebase do, in two sentences?",
    "Write a TypeScript type for a user with a name, an email and an optional age.",
    "How do I parse command-line flags in Python?",
    "Write a Java method that checks whether a string is a palindrome.",
    "What is a race condition?",
    "Write a Makefile rule that compiles main.c into main.",
]
SNIPPETS = [
    "def mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total / len(xs)\n",
    "function fetchAll(urls) {\n  const out = [];\n  urls.forEach(async (u) => {\n"
    "    out.push(await fetch(u));\n  });\n  return out;\n}\n",
    "int find(int *a, int n, int key) {\n  int lo = 0, hi = n;\n  while (lo < hi) {\n    int mid = (lo + hi) / 2;\n"
    "    if (a[mid] < key) lo = mid; else hi = mid;\n  }\n  return lo;\n}\n",
    "class Cache:\n    def __init__(self, size):\n        self.size = size\n        self.data = {}\n"
    "    def get(self, key):\n        return self.data.get(key)\n    def put(self, key, value):\n"
    "        if len(self.data) > self.size:\n            self.data.pop(next(iter(self.data)))\n"
    "        self.data[key] = value\n",
]
MEDIUM = [
    f"{task}\n\n```\n{code}```" for code in SNIPPETS for task in ("Explain what this code does.", "Find the bug.")
]
LONG = [
    "Review this module and list its problems, most serious first.\n\n```python\n"
    + "".join(SNIPPETS[i % 4].replace("def ", f"def v{i}_") for i in range(k, k + 4))
    + "```"
    for k in range(4)
]


def bench_prompts(n: int) -> list[str]:
    """``n`` prompts, short, medium and long mixed 3:2:1; a prompt used again gets a suffix."""
    kinds = {"s": SHORT, "m": MEDIUM, "l": LONG}
    used = dict.fromkeys(kinds, 0)
    out = []
    for i in range(n):
        kind = "ssmsml"[i % 6]
        pool, j = kinds[kind], used[kind]
        used[kind] += 1
        out.append(pool[j % len(pool)] + (f" (take {j // len(pool) + 1})" if j >= len(pool) else ""))
    return out


# --------------------------------------------------------------- part 1 --

_SUMMARY = re.compile(r"batch done: (\d+)/(\d+) prompts, (\d+) tokens in ([\d.]+)s")
_PARALLEL = re.compile(r"(\d+) at a time")


def run_cli_batch(
    model: Path | str,
    prompts: list[str],
    args: argparse.Namespace,
    fixed: int | None = None,
    extra: tuple[str, ...] = (),
) -> tuple[float, int, list[str], int]:
    """(aggregate tok/s, generated tokens, texts, parallel) of `localrun generate --batch`,
    with localrun's default --parallel unless ``fixed`` is given, and ``extra``
    options; ``model`` a server's URL runs it there (the server has the threads)."""
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for i, p in enumerate(prompts):
            f.write(json.dumps({"id": i, "prompt": p}) + "\n")
    cmd = [sys.executable, "-m", "localrun", "generate", "-m", str(model)]
    if args.threads is not None and not str(model).startswith("http"):
        cmd += ["--threads", str(args.threads)]
    if fixed is not None:
        cmd += ["--parallel", str(fixed)]
    cmd += ["-t", "0", "-n", str(args.tokens), "-s", SYSTEM, "--stats", *extra, "--batch", f.name]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=HERE, stdin=subprocess.DEVNULL)
    Path(f.name).unlink()
    found = _SUMMARY.search(out.stderr)
    if out.returncode != 0 or not found:
        raise RuntimeError(f"localrun generate --batch failed ({out.returncode}):\n{out.stderr[-2000:]}")
    records = [json.loads(line) for line in out.stdout.splitlines()]
    texts = [r["text"] for r in sorted(records, key=lambda r: int(r["id"]))]
    generated, seconds = int(found.group(3)), float(found.group(4))
    parallel = _PARALLEL.search(out.stderr)
    return generated / seconds, generated, texts, int(parallel.group(1)) if parallel else 0


_LISTENING = re.compile(r"serving .* on (http://127\.0\.0\.1:\d+)/v1")


class ServeProcess:
    """`localrun serve MODEL --parallel P` on 127.0.0.1, any free port; its URL once it listens."""

    def __init__(self, model: Path, parallel: int, threads: int | None) -> None:
        cmd = [sys.executable, "-m", "localrun", "serve", "-m", str(model), "--port", "0", "--parallel", str(parallel)]
        cmd += ["--queue", "1024", "--ctx", "4096"] + (["--threads", str(threads)] if threads is not None else [])
        self.proc = subprocess.Popen(cmd, cwd=HERE, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)  # fmt: skip
        assert self.proc.stderr is not None
        seen = []
        for line in self.proc.stderr:
            seen.append(line)
            found = _LISTENING.search(line)
            if found:
                self.url = found.group(1) + "/v1"
                break
        else:
            raise RuntimeError("localrun serve did not start:\n" + "".join(seen[-20:]))
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()  # keep its pipe drained

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)


def run_one_by_one(engine: Engine, prompts: list[str], tokens: int) -> tuple[float, int, list[str]]:
    """(aggregate tok/s, generated tokens, texts) of localrun's loop, one prompt after another."""
    decoder = Decoder(engine)
    prompt_ids = [prompt_tokens(engine, p, system=SYSTEM) for p in prompts]
    texts, generated = [], 0
    t0 = time.perf_counter()
    for ids in prompt_ids:
        text = ""
        for ev in generate(engine, ids, SamplingParams(temperature=0.0), max_tokens=tokens, decoder=decoder):
            if isinstance(ev, TokenEvent):
                text += ev.text
            elif isinstance(ev, DoneEvent):
                generated += ev.stats.generated_tokens
        texts.append(text)
    return generated / (time.perf_counter() - t0), generated, texts


# --------------------------------------------------------------- part 2 --

Figures = tuple[float, float]  # (total tok/s: prompt + generated, decode-phase tok/s)


def run_core_random(engine: Engine, n: int, pp: int, tg: int, seed: int) -> Figures:
    """localrun's batching core, batched-bench's way: n random prompts of pp
    tokens, all started together, tg tokens each."""
    rng = random.Random(seed)
    requests = [
        BatchRequest(i, [rng.randrange(engine.n_vocab) for _ in range(pp)], max_tokens=tg, ignore_eos=True)
        for i in range(n)
    ]
    first: BatchProgress | None = None
    final: BatchProgress | None = None
    for ev in run_batch(engine, requests, share_prefix=False):
        if isinstance(ev, BatchProgress):
            first = first or ev  # after the first decode: every prompt evaluated, first tokens sampled
            final = ev
    assert first is not None and final is not None and final.generated_tokens == n * tg
    total = n * (pp + tg) / final.elapsed_s
    decode = n * (tg - 1) / (final.elapsed_s - first.elapsed_s)
    return total, decode


_ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|(.*)$", re.MULTILINE)


def run_native(binary: str, model: Path, n: int, pp: int, tg: int, threads: int, extra: Sequence[str] = ()) -> Figures:
    """llama-batched-bench's figures for ``n`` sequences (``extra``: more of its options, e.g. -ngl)."""
    ctx = n * (pp + tg)
    cmd = [binary, "-m", str(model), "-t", str(threads), "-c", str(ctx), "-b", "2048", "-ub", "512"]
    cmd += ["-npp", str(pp), "-ntg", str(tg), "-npl", str(n), *extra]
    out = subprocess.run(
        cmd, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL, env=others_environ()
    )
    for m in _ROW.finditer(out.stdout + out.stderr):
        cols = [c.strip() for c in m.group(4).split("|") if c.strip()]
        # N_KV, T_PP s, S_PP t/s, T_TG s, S_TG t/s, T s, S t/s
        return float(cols[6]), float(cols[4])
    raise RuntimeError(f"could not read llama-batched-bench's table ({out.returncode}):\n{out.stderr[-2000:]}")


# ------------------------------------------------------------------ main --


def parse_sweep(value: str) -> list[int]:
    if value.strip() in ("", "none"):
        return []
    values = sorted({int(v) for v in value.split(",") if v.strip()})
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError("--parallel values are 1 or more")
    return values


def main() -> None:  # noqa: C901, PLR0912, PLR0915  a script's main
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("model", nargs="?", default=DEFAULT_MODEL, help="model name or GGUF path")
    ap.add_argument(
        "--threads", type=int, help="threads for every contender (default: localrun's own default for the CLI runs)"
    )
    ap.add_argument("--prompts", type=int, default=32, help="number of prompts (short, medium, long mixed 3:2:1)")
    ap.add_argument("--tokens", type=int, default=128, help="tokens to generate per prompt (at most)")
    ap.add_argument("--pp", type=int, default=128, help="prompt tokens per sequence in the native comparison")
    ap.add_argument("--rounds", type=int, default=1, help="rounds; the contenders' order rotates")
    ap.add_argument(
        "--sweep", type=parse_sweep, default="1,2,4,8,16", help="the fixed --parallel values beside the default; none"
    )
    ap.add_argument(
        "--serve", type=int, metavar="P", help="also --batch --parallel P through `localrun serve --parallel P`"
    )
    ap.add_argument("--native", help="path to llama-batched-bench")
    ap.add_argument("--quick", action="store_true", help="8 prompts, 64 tokens, --pp 64")
    args = ap.parse_args()
    args.model = model_path(args.model)
    if args.quick:
        args.prompts, args.tokens, args.pp = 8, 64, 64
    prompts = bench_prompts(args.prompts)
    sweep = [p for p in args.sweep if p <= len(prompts)]
    threads = args.threads or default_threads()
    print(
        f"model {args.model.name}, threads {args.threads or 'localrun default'}, {len(prompts)} prompts, "
        f"up to {args.tokens} tokens each; --parallel sweep {', '.join(map(str, sweep)) or 'none'}"
    )
    if len(sweep) < len(args.sweep):
        print(f"  (--parallel above {len(prompts)} left out: no more prompts than that to run together)")

    seq_ctx = 4096
    single = Engine(engine_config(args.model, ctx=str(seq_ctx), threads=threads))
    lengths = [len(prompt_tokens(single, p, system=SYSTEM)) for p in prompts]
    print(f"prompt tokens: {min(lengths)} to {max(lengths)}, {sum(lengths)} in all")
    rates: dict[str, list[float]] = {"batch": [], "alone": [], **{f"p{p}": [] for p in sweep}}
    parallel = 0
    contenders = list(rates)
    for r in range(args.rounds):
        shift = r % len(contenders)
        for which in contenders[shift:] + contenders[:shift]:  # the order rotates from round to round
            if which == "batch":
                rate, n, batch_texts, parallel = run_cli_batch(args.model, prompts, args)
            elif which == "alone":
                rate, n, alone_texts = run_one_by_one(single, prompts, args.tokens)
            else:
                rate, n, _, _ = run_cli_batch(args.model, prompts, args, int(which[1:]))
            rates[which].append(rate)
            print(f"  round {r + 1} {which:5s}: {n} tokens, {rate:.2f} tok/s aggregate", flush=True)
    same = sum(a == b for a, b in zip(batch_texts, alone_texts, strict=True))
    single.close()
    batch_rate, alone_rate = rates["batch"], rates["alone"]
    print(f"--batch (default --parallel = {parallel}) {statistics.median(batch_rate):.2f} tok/s; "
          f"one by one {statistics.median(alone_rate):.2f} tok/s")  # fmt: skip
    print(f"batch / one by one: {ratio_summary(batch_rate, alone_rate, range_of_one=False)}  (goal >= 1.8x)")
    print(f"identical greedy texts: {same}/{len(prompts)}")
    if sweep:
        print("  ".join(f"--parallel {p}: {statistics.median(rates[f'p{p}']):.2f}" for p in sweep) + " tok/s")
        best = max((f"p{p}" for p in sweep), key=lambda name: statistics.median(rates[name]))
        ratio = median_ratio(batch_rate, rates[best])
        print(
            f"batch / best --parallel in hindsight (--parallel {best[1:]}): "
            f"{ratio_summary(batch_rate, rates[best], range_of_one=False)}  "
            f"(goal >= 0.95x: {'met' if ratio >= 0.95 else 'NOT met'})"
        )

    if args.serve:
        run_remote_column(args, prompts)

    if args.native:
        n = parallel or 16
        engine = Engine(replace(engine_config(args.model, ctx=str(n * 512), threads=threads), n_seq_max=n))
        run_core_random(engine, min(n, 2), 16, 2, seed=0)  # warm up, as batched-bench does
        ours: list[Figures] = []
        native: list[Figures] = []
        print(f"same batch size {n}, random prompts of {args.pp} tokens, {args.tokens} generated each:")
        for r in range(args.rounds):
            order = ["localrun", "native"] if r % 2 == 0 else ["native", "localrun"]
            for which in order:
                if which == "localrun":
                    figures = run_core_random(engine, n, args.pp, args.tokens, seed=r)
                    ours.append(figures)
                else:
                    figures = run_native(args.native, args.model, n, args.pp, args.tokens, threads)
                    native.append(figures)
                print(f"  round {r + 1} {which:8s}: {figures[0]:.2f} tok/s total, {figures[1]:.2f} tok/s decoding")
        engine.close()
        total = ratio_summary([o[0] for o in ours], [x[0] for x in native], range_of_one=False)
        decoding = ratio_summary([o[1] for o in ours], [x[1] for x in native], range_of_one=False)
        print(f"localrun / llama-batched-bench: total {total}, decoding {decoding}  (goal >= 0.95x)")


def run_remote_column(args: argparse.Namespace, prompts: list[str]) -> None:
    """--batch --parallel P over the API of `localrun serve --parallel P` beside local --batch --parallel P."""
    p = args.serve
    server = ServeProcess(args.model, p, args.threads)
    rates: dict[str, list[float]] = {"local": [], "remote": []}
    texts: dict[str, list[str]] = {}
    print(f"--batch --parallel {p}: local, and through `localrun serve --parallel {p}` at {server.url}:")
    try:
        for r in range(args.rounds):
            for which in ["local", "remote"] if r % 2 == 0 else ["remote", "local"]:
                model = args.model if which == "local" else server.url
                rate, n, texts[which], _ = run_cli_batch(model, prompts, args, p)
                rates[which].append(rate)
                print(f"  round {r + 1} {which:6s}: {n} tokens, {rate:.2f} tok/s aggregate", flush=True)
    finally:
        server.close()
    ratio = median_ratio(rates["remote"], rates["local"])
    same = sum(a == b for a, b in zip(texts["remote"], texts["local"], strict=True))
    print(
        f"remote / local: {ratio_summary(rates['remote'], rates['local'], range_of_one=False)}  "
        f"(goal >= 0.9x: {'met' if ratio >= 0.9 else 'NOT met'}); identical greedy texts: {same}/{len(prompts)}"
    )


if __name__ == "__main__":
    main()
