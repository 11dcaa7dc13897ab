#!/usr/bin/env python3
"""Measure localrun's decode loop side by side with the alternatives, in one run.

    .venv/bin/python scripts/bench_decode.py MODEL [MODEL ...]
        [--tokens 128] [--reps 3] [--threads N] [--native PATH/TO/llama-completion]
        [--columns panel,stock,native] [--flash-attn auto|on|off]

Columns, each the median of --reps interleaved runs on the same greedy prompt:
  localrun     localrun's own loop (localrun.runtime.generate.generate), text into a pipe
  panel        the same loop rendered by the Rich live panel into a fake terminal
  stock        llama-cpp-python's own path (Llama.generate)
  native       llama.cpp's llama-completion binary, when --native is given; its
               decode rate counts its sampling time too, as localrun's does
  cli, tree    with --tree DIR: `localrun generate --json`, plain decoding, as a
               process, from this checkout (cli) and from the checkout in DIR
               with its own .venv (tree): the same command before and after a
               change, in one run; prompt tok/s there is prompt tokens over the
               time to the first token
It prints decode and prompt-processing tokens/sec and the ratios
localrun/stock, localrun/native and panel/localrun, each the median of the
ratios within a round. Absolute figures drift on
a shared machine; the ratios are what to read.

MODEL is any localrun model name (a registry alias such as qwen2.5-coder:1.5b,
owner/repo:QUANT, hf://owner/repo/file.gguf or a GGUF path); a registry model
is pulled on first use.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import llama_cpp
from rich.console import Console

from localrun.events import Stats
from localrun.runtime.engine import Engine, EngineConfig
from localrun.runtime.generate import generate
from localrun.runtime.sampling import SamplingParams
from localrun.system import default_threads
from localrun.ui.stream import LiveRenderer, PlainRenderer
from scripts._models import HelpFormatter, model_path
from scripts._stats import ratio_summary

PROMPT = (
    "Below is a long technical article about how computers store and process numbers, "
    "written for curious beginners. It covers binary, integers, floating point, rounding, "
    "overflow, and how CPUs add and multiply.\n\n"
) * 6 + "Chapter 1. Bits and bytes\n\n"

Figures = tuple[float, float]  # (decode tok/s, prompt tok/s)


def bench_localrun(engine: Engine, tokens: list[int], n: int, renderer: str) -> Figures:
    events = generate(engine, tokens, SamplingParams(temperature=0.0), max_tokens=n, ignore_eos=True)
    sink = io.StringIO()
    if renderer == "panel":
        console = Console(file=sink, force_terminal=True, width=100, height=30, color_system="truecolor")
        stats: Stats = LiveRenderer(console, title="bench").render(events)
    else:
        stats = PlainRenderer(sink, sink).render(events)
    return stats.decode_tokens_per_s, stats.prompt_tokens_per_s


def bench_stock(llm: llama_cpp.Llama, tokens: list[int], n: int) -> Figures:
    llm.reset()  # type: ignore[no-untyped-call]  # forget the previous run: no prompt reuse
    t0 = time.perf_counter()
    t_first = t_last = t0
    count = 0
    for _tok in llm.generate(tokens, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
        t_last = time.perf_counter()
        count += 1
        if count == 1:
            t_first = t_last
        if count == n:
            break
    return (count - 1) / (t_last - t_first), len(tokens) / (t_first - t0)


_PERF = re.compile(r"(prompt eval|\beval) time\s*=\s*([\d.]+) ms /\s*(\d+)")
_SAMPLING = re.compile(r"sampling time\s*=\s*([\d.]+) ms")


def bench_native(binary: str, model: Path, n: int, threads: int, flash_attn: str, shares: list[float]) -> Figures:
    """llama-completion's decode and prompt rates; appends to ``shares`` the
    part of its decode time that sampling took."""
    cmd = [
        binary,
        "-m",
        str(model),
        "-p",
        PROMPT,
        "-n",
        str(n),
        "-t",
        str(threads),
        "--temp",
        "0",
        "--ignore-eos",
        "-no-cnv",
        "-c",
        "4096",
        "-b",
        "2048",
        "-ub",
        "512",
        "--no-warmup",
        "-fa",
        flash_attn,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL)
    found = {m.group(1): (float(m.group(2)), int(m.group(3))) for m in _PERF.finditer(out.stderr)}
    sampling = _SAMPLING.search(out.stderr)
    if "eval" not in found or "prompt eval" not in found or sampling is None:
        raise RuntimeError("could not read llama-completion's timings:\n" + out.stderr[-2000:])
    (eval_ms, runs), (prompt_ms, prompt_n) = found["eval"], found["prompt eval"]
    # its "eval" figure counts llama_decode alone; localrun's decode rate is
    # the wall clock from the first sampled token to the last, sampling
    # included, so the runs' share of the sampling time (runs + 1 samples) is added
    sample_ms = float(sampling.group(1)) * runs / (runs + 1)
    shares.append(sample_ms / (eval_ms + sample_ms))
    return 1000 * runs / (eval_ms + sample_ms), 1000 * prompt_n / prompt_ms


def bench_cli(python: Path, cwd: Path, model: Path, n: int, threads: int, flash_attn: str) -> Figures:
    """`localrun generate` of the checkout at ``cwd`` as a process, plain decoding
    (config.toml's `draft = "none"`, which every version reads): its own decode
    rate (the done event), and prompt tokens over the time to the first token."""
    cmd = [str(python), "-m", "localrun", "generate", "-m", str(model), "--raw", "-t", "0", "-n", str(n)]
    cmd += ["--ctx", "4096", "--threads", str(threads), "--flash-attn", flash_attn, "--json", PROMPT]
    with tempfile.TemporaryDirectory() as home:
        config = Path(home) / "config" / "config.toml"
        config.parent.mkdir(parents=True)
        config.write_text('[defaults]\ndraft = "none"\n')
        env = {**os.environ, "LOCALRUN_HOME": home}
        out = subprocess.run(
            cmd, capture_output=True, text=True, check=True, cwd=cwd, env=env, stdin=subprocess.DEVNULL
        )
    done = json.loads(out.stdout.strip().splitlines()[-1])
    return done["decode_tokens_per_s"], done["prompt_tokens"] / done["ttft_s"]


def paired(results: dict[str, list[Figures]], a: str, b: str, col: int) -> str:
    """Ratios taken within each round (runs seconds apart), then the median
    over rounds: slow drift of the machine cancels out."""
    return ratio_summary((x[col] for x in results[a]), (y[col] for y in results[b]))


def bench_model(model: Path, args: argparse.Namespace) -> None:  # noqa: C901  a script's columns
    engine = Engine(EngineConfig(model_path=model, n_ctx=4096, n_threads=args.threads, flash_attn=args.flash_attn))
    flash_attn = engine.flash_attn  # what auto resolved to: every column runs with it
    tokens = engine.tokenize(PROMPT)
    stock = (
        llama_cpp.Llama(
            model_path=str(model),
            n_ctx=4096,
            n_batch=2048,
            n_ubatch=512,
            n_threads=args.threads,
            n_threads_batch=args.threads,
            flash_attn=flash_attn != "off",  # auto: on, as llama.cpp settles it for the CPU
            verbose=False,
        )
        if "stock" in args.columns
        else None
    )
    runners: dict[str, Callable[[], Figures]] = {
        "localrun": lambda: bench_localrun(engine, tokens, args.tokens, "plain"),
        "panel": lambda: bench_localrun(engine, tokens, args.tokens, "panel"),
    }
    if stock is not None:
        runners["stock"] = lambda: bench_stock(stock, tokens, args.tokens)
    sampling_shares: list[float] = []
    if args.native:
        runners["native"] = lambda: bench_native(
            args.native, model, args.tokens, args.threads, flash_attn, sampling_shares
        )
    if args.tree is not None:
        here = Path(__file__).resolve().parent.parent
        runners["cli"] = lambda: bench_cli(Path(sys.executable), here, model, args.tokens, args.threads, flash_attn)
        runners["tree"] = lambda: bench_cli(
            args.tree / ".venv" / "bin" / "python", args.tree, model, args.tokens, args.threads, flash_attn
        )
    runners = {
        name: run for name, run in runners.items() if name in ("localrun", "cli", "tree") or name in args.columns
    }
    bench_localrun(engine, tokens, 8, "plain")  # warm the page cache and the weights
    results: dict[str, list[Figures]] = {name: [] for name in runners}
    order = list(runners)
    for rep in range(args.reps):  # rotate the order so no column always runs first
        for name in order[rep % len(order) :] + order[: rep % len(order)]:
            results[name].append(runners[name]())
    print(f"\n{model.name}  ({len(tokens)} prompt tokens, flash attention {flash_attn} in every column)")
    print(f"  {'':10} {'decode tok/s':>13} {'prompt tok/s':>13}")
    for name, rs in results.items():
        print(f"  {name:10} {statistics.median(r[0] for r in rs):13.2f} {statistics.median(r[1] for r in rs):13.2f}")
    for other in ("stock", "native"):
        if other in results:
            decode, prompt = paired(results, "localrun", other, 0), paired(results, "localrun", other, 1)
            print(f"  localrun/{other}: decode {decode}, prompt {prompt}")
    if "panel" in results:
        print(f"  panel/localrun: decode {paired(results, 'panel', 'localrun', 0)}")
    if "tree" in results:
        print(f"  cli/tree: decode {paired(results, 'cli', 'tree', 0)}, prompt {paired(results, 'cli', 'tree', 1)}")
    if sampling_shares:
        share = statistics.median(sampling_shares)
        print(f"  native's sampling: {share:.1%} of its decode time (its own 'eval' figure leaves it out)")
    if stock is not None:
        stock.close()
    engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("models", nargs="+", metavar="MODEL", help="model names or GGUF paths, each measured in turn")
    ap.add_argument("--tokens", type=int, default=128, help="greedy tokens to generate per run")
    ap.add_argument("--reps", type=int, default=3, help="interleaved rounds; each column's figure is the median")
    ap.add_argument("--threads", type=int, default=default_threads(), help="threads for every column")
    ap.add_argument("--native", help="path to llama.cpp's llama-completion binary")
    ap.add_argument(
        "--columns",
        type=lambda v: {c.strip() for c in v.split(",")},
        default="panel,stock,native",
        help="comma-separated subset of panel,stock,native (localrun always runs; native needs --native)",
    )
    ap.add_argument(
        "--tree",
        type=Path,
        help="another checkout (with its .venv set up): adds the cli and tree columns, before/after in one run",
    )
    ap.add_argument(
        "--flash-attn", choices=("auto", "on", "off"), default="auto", help="as localrun's option; all columns match it"
    )
    args = ap.parse_args()
    models = [model_path(name) for name in args.models]
    print(f"threads {args.threads}, {args.tokens} greedy tokens, {args.reps} rounds; tok/s are medians")
    for model in models:
        bench_model(model, args)


if __name__ == "__main__":
    main()
