#!/usr/bin/env python3
"""Measure localrun's decode loop side by side with the alternatives, in one run.

    .venv/bin/python scripts/bench_decode.py MODEL [MODEL ...]
        [--tokens 128] [--reps 3] [--threads N] [--native PATH/TO/llama-completion]
        [--columns panel,stock,native,default,ll-default,ll-other,threads]
        [--flash-attn auto|on|off] [--load N] [--sample] [--spec none|auto|lookup]

Columns, each the median of --reps interleaved runs on the same prompt (a
~250-token raw prompt, no chat template), greedy, or with --sample sampled as
localrun and llama.cpp sample by default (temperature 0.8, top-k 40, top-p
0.95, min-p 0.05) with a fixed seed on every side:
  localrun     localrun's own loop (localrun.runtime.generate.generate), text into a pipe,
               with --threads and --flash-attn; it runs whenever panel, stock or
               native does (their ratios are against it), or with --tree
  panel        the same loop rendered by the Rich live panel into a fake terminal
  stock        llama-cpp-python's own path (Llama.generate)
  native       llama.cpp's llama-completion binary (--native), with localrun's
               --threads, flash-attention mode and context; its decode rate counts
               its sampling time too, as localrun's does
  cli, tree    with --tree DIR: `localrun generate --json`, plain decoding, as a
               process, from this checkout (cli) and from the checkout in DIR
               with its own .venv (tree): the same command before and after a
               change, in one run; prompt tok/s there is prompt tokens over the
               time to the first token
Columns of each side's defaults, each a process started as a user would start it:
  default      `localrun generate --spec none --raw -t 0 -n TOKENS --json PROMPT`
               (--spec and --sample change its --spec and -t)
               from this checkout, in this environment (config.toml, the
               per-machine defaults and LOCALRUN_HOME as they are): no --threads,
               --flash-attn, --ctx or --kv, plain decoding (speculation is
               measured by bench_spec.py). Decode rate: its done event's; prompt
               rate: prompt tokens over the time to the first token; the
               threads it ended with and the settings its done event reports
               (with where each came from: default, wisdom, config...) are printed
  ll-default   llama-completion (--native) with its own defaults: no -t, -fa,
               -c, -b or -ub (greedy, --ignore-eos, -no-cnv, --no-warmup only);
               the threads and flash-attention mode it settled on are printed
  ll-other     the same, with the flash-attention mode its default did not
               settle on (`-fa off` when its auto chose on, as on the CPU;
               `-fa on` otherwise), learnt from a 1-token run before the rounds
  threads      `default` with a fixed `--threads t`, one column t1 ... tN for
               t = 1 to the CPUs this process may use; --load adds them
--own-cost: instead of the columns, localrun's own CPU time per token, the
plain loop with llama_decode answering at once after the prompt (greedy, and
sampled with the chain above): what the loop adds to each step, as on a GPU
whose step takes a fraction of a millisecond.
It prints decode and prompt-processing tokens/sec and the ratios, each the
median of the ratios within a round:
  localrun/stock, localrun/native, panel/localrun, cli/tree
  default / the faster of ll-default and ll-other (the one with the higher
      median decode rate, named; the issue's goal: >= 0.97x)
  default / ll-default (goal under --load 2: >= 1.4x)
  default / the best fixed --threads in hindsight (the column tN with the
      highest median decode rate, named; goal under --load 2: >= 0.95x, idle:
      no loss)
Absolute figures drift on a shared machine; the ratios are what to read.

--load N: N competing CPU-bound processes (busy loops, like `yes > /dev/null`)
run through every round of every model, and are always stopped afterwards (at
the end, on an error, on Ctrl-C or SIGTERM).

MODEL is any localrun model name (a registry alias such as qwen2.5-coder:1.5b,
owner/repo:QUANT, hf://owner/repo/file.gguf or a GGUF path); a registry model
is pulled on first use.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import llama_cpp
from rich.console import Console

from localrun.events import Stats
from localrun.openmp import others_environ
from localrun.runtime.engine import Engine
from localrun.runtime.generate import generate
from localrun.runtime.sampling import SamplingParams
from localrun.system import default_threads
from localrun.ui.stream import LiveRenderer, PlainRenderer
from scripts._load import cpu_load
from scripts._models import HelpFormatter, engine_config, model_path
from scripts._native import timings
from scripts._stats import median_ratio, ratio_summary

PROMPT = (
    "Below is a long technical article about how computers store and process numbers, "
    "written for curious beginners. It covers binary, integers, floating point, rounding, "
    "overflow, and how CPUs add and multiply.\n\n"
) * 6 + "Chapter 1. Bits and bytes\n\n"

HERE = Path(__file__).resolve().parent.parent
IN_PROCESS = ("panel", "stock", "native")  # columns compared with the in-process localrun column
DEFAULTS = ("default", "ll-default", "ll-other", "threads")
COLUMNS = (*IN_PROCESS, *DEFAULTS)
NEEDS_NATIVE = ("native", "ll-default", "ll-other")

Figures = tuple[float, float]  # (decode tok/s, prompt tok/s)


@dataclass(frozen=True)
class Sampling:
    """How every column samples: greedy, or llama.cpp's and localrun's default
    chain (top-k, top-p, min-p, temperature) with one seed."""

    temperature: float = 0.0
    top_k: int = SamplingParams.top_k  # localrun's defaults, from their one home
    top_p: float = SamplingParams.top_p
    min_p: float = SamplingParams.min_p
    seed: int = 1

    @property
    def label(self) -> str:
        if self.temperature <= 0:
            return "greedy"
        return f"sampled (temperature {self.temperature}, top-k {self.top_k}, top-p {self.top_p}, min-p {self.min_p})"

    def params(self) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p, seed=self.seed
        )

    def native(self) -> list[str]:
        """llama-completion's options."""
        if self.temperature <= 0:
            return ["--temp", "0"]
        chain = ["--top-k", str(self.top_k), "--top-p", str(self.top_p), "--min-p", str(self.min_p)]
        return ["--temp", str(self.temperature), *chain, "--seed", str(self.seed)]

    def cli(self) -> list[str]:
        """`localrun generate`'s options."""
        if self.temperature <= 0:
            return ["-t", "0"]
        chain = ["--top-k", str(self.top_k), "--top-p", str(self.top_p), "--min-p", str(self.min_p)]
        return ["-t", str(self.temperature), *chain, "--seed", str(self.seed)]


GREEDY = Sampling()
SAMPLED = Sampling(temperature=SamplingParams.temperature)


def bench_localrun(engine: Engine, tokens: list[int], n: int, renderer: str, sampling: Sampling = GREEDY) -> Figures:
    events = generate(engine, tokens, sampling.params(), max_tokens=n, ignore_eos=True)
    sink = io.StringIO()
    if renderer == "panel":
        console = Console(file=sink, force_terminal=True, width=100, height=30, color_system="truecolor")
        stats: Stats = LiveRenderer(console, title="bench").render(events)
    else:
        stats = PlainRenderer(sink, sink).render(events)
    return stats.decode_tokens_per_s, stats.prompt_tokens_per_s


def bench_stock(llm: llama_cpp.Llama, tokens: list[int], n: int, sampling: Sampling = GREEDY) -> Figures:
    llm.reset()  # type: ignore[no-untyped-call]  # forget the previous run: no prompt reuse
    t0 = time.perf_counter()
    t_first = t_last = t0
    count = 0
    greedy = sampling.temperature <= 0
    if not greedy:
        llm.set_seed(sampling.seed)
    for _tok in llm.generate(
        tokens,
        temp=sampling.temperature if not greedy else 0.0,
        top_k=sampling.top_k if not greedy else 1,
        top_p=sampling.top_p,
        min_p=sampling.min_p,
        repeat_penalty=1.0,
        reset=True,
    ):
        t_last = time.perf_counter()
        count += 1
        if count == 1:
            t_first = t_last
        if count == n:
            break
    return (count - 1) / (t_last - t_first), len(tokens) / (t_first - t0)


_THREADS = re.compile(r"system_info: n_threads = (\d+)")
_FA_AUTO = re.compile(r"Flash Attention (enabled|not supported)")


@dataclass
class Native:
    """llama-completion's runs: the part of each decode time its sampling
    took, and what its defaults settled on (from its log)."""

    binary: str
    sampling: Sampling = GREEDY
    shares: list[float] = field(default_factory=list)
    threads: dict[str, int] = field(default_factory=dict)  # column: threads it ran with

    def run(self, column: str, model: Path, n: int, options: list[str]) -> tuple[Figures, str]:
        """Decode and prompt rates of one run with ``options``; and its log."""
        cmd = [self.binary, "-m", str(model), "-p", PROMPT, "-n", str(n), *self.sampling.native(), "--ignore-eos"]
        cmd.append("-no-cnv")
        cmd += ["--no-warmup", *options]
        out = subprocess.run(
            cmd, capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL, env=others_environ()
        )
        figures = timings(out.stderr)
        if threads := _THREADS.search(out.stderr):
            self.threads[column] = int(threads.group(1))
        self.shares.append(figures.sampling_share)
        return (figures.decode_per_s, figures.prompt_per_s), out.stderr

    def default_fa(self, model: Path) -> str:
        """The flash-attention mode llama-completion's default (auto) settles on
        for ``model``: "on" or "off", from a 1-token run's log."""
        _, log = self.run("probe", model, 1, ["-lv", "4"])  # the level at which its auto says what it chose
        found = _FA_AUTO.search(log)
        if found is None:
            print("  (llama-completion's log does not say how auto settled; taken as on, as on the CPU)")
            return "on"
        return "on" if found.group(1) == "enabled" else "off"


def native_options(threads: int, flash_attn: str) -> list[str]:
    """The native column's options: localrun's threads, flash-attention mode and context."""
    return ["-t", str(threads), "-c", "4096", "-b", "2048", "-ub", "512", "-fa", flash_attn]


def bench_cli(
    python: Path, cwd: Path, model: Path, n: int, threads: int, flash_attn: str, sampling: Sampling = GREEDY
) -> Figures:
    """`localrun generate` of the checkout at ``cwd`` as a process, plain decoding
    (config.toml's `draft = "none"`, which every version reads): its own decode
    rate (the done event), and prompt tokens over the time to the first token."""
    cmd = [str(python), "-m", "localrun", "generate", "-m", str(model), "--raw", *sampling.cli(), "-n", str(n)]
    cmd += ["--ctx", "4096", "--threads", str(threads), "--flash-attn", flash_attn, "--json", PROMPT]
    with tempfile.TemporaryDirectory() as home:
        config = Path(home) / "config" / "config.toml"
        config.parent.mkdir(parents=True)
        config.write_text('[defaults]\ndraft = "none"\n')
        env = {**others_environ(), "LOCALRUN_HOME": home}  # each side sets its own OpenMP spin
        out = subprocess.run(
            cmd, capture_output=True, text=True, check=True, cwd=cwd, env=env, stdin=subprocess.DEVNULL
        )
    done = json.loads(out.stdout.strip().splitlines()[-1])
    return done["decode_tokens_per_s"], done["prompt_tokens"] / done["ttft_s"]


def bench_default(
    model: Path,
    n: int,
    threads: int | None = None,
    ended: list[int] | None = None,
    settled: list[str] | None = None,
    *,
    spec: str = "none",
    sampling: Sampling = GREEDY,
) -> Figures:
    """`localrun generate` from this checkout as a user runs it, in this
    environment, with ``spec`` (plain decoding: none); with ``threads``, a fixed --threads. Appends
    to ``ended`` the threads its done event says it decoded with at the end,
    and puts in ``settled`` the settings it says it ran with, and where each came from."""
    cmd = [sys.executable, "-m", "localrun", "generate", "-m", str(model), "--spec", spec, "--raw", *sampling.cli()]
    cmd += ["-n", str(n), "--json"]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    cmd.append(PROMPT)
    out = subprocess.run(
        cmd, capture_output=True, text=True, cwd=HERE, stdin=subprocess.DEVNULL, check=False, env=others_environ()
    )
    if out.returncode != 0:
        raise RuntimeError(f"localrun generate failed ({out.returncode}):\n{out.stderr[-2000:]}")
    done = json.loads(out.stdout.strip().splitlines()[-1])
    if ended is not None and isinstance(done.get("threads"), int):
        ended.append(done["threads"])
    if settled is not None and isinstance(done.get("settings"), dict):
        settled[:] = [
            f"{key} {item.get('value')} ({item.get('source')})"
            for key, item in done["settings"].items()
            if isinstance(item, dict)
        ]
    return done["decode_tokens_per_s"], done["prompt_tokens"] / done["ttft_s"]


def own_cost(model: Path, threads: int, n: int = 2000, rounds: int = 7) -> None:
    """localrun's own cost per token: the plain loop (sampling, the output,
    the events into a pipe) with llama_decode answering at once after the
    prompt, so every step samples the prompt's last logits again. CPU time of
    this thread, the least of ``rounds``: a figure other processes' load
    hardly moves, unlike a decode rate."""
    engine = Engine(engine_config(model, ctx="4096", threads=threads))
    tokens = engine.tokenize(PROMPT)[:32]
    real = llama_cpp.llama_decode
    print(f"\n{model.name}: localrun's own cost per token, llama_decode answering at once ({n} tokens)")
    try:
        for sampling in (GREEDY, SAMPLED):
            costs = []
            for _ in range(rounds):
                calls = [0]

                def stub(ctx: object, batch: object, calls: list[int] = calls) -> int:
                    calls[0] += 1
                    return int(real(ctx, batch)) if calls[0] == 1 else 0  # the prompt runs

                llama_cpp.llama_decode = stub
                sink = io.StringIO()
                events = generate(engine, tokens, sampling.params(), max_tokens=n, ignore_eos=True)
                start = time.thread_time()
                PlainRenderer(sink, sink).render(events)
                costs.append((time.thread_time() - start) / n)
                llama_cpp.llama_decode = real
            print(f"  {sampling.label}: {min(costs) * 1e6:.1f} us (median {statistics.median(costs) * 1e6:.1f})")
    finally:
        llama_cpp.llama_decode = real
        engine.close()


def paired(results: dict[str, list[Figures]], a: str, b: str, col: int) -> str:
    """Ratios taken within each round (runs seconds apart), then the median
    over rounds: slow drift of the machine cancels out."""
    return ratio_summary((x[col] for x in results[a]), (y[col] for y in results[b]))


def fastest(results: dict[str, list[Figures]], names: Sequence[str]) -> str:
    """Of ``names``, the column with the highest median decode rate: the best in hindsight."""
    return max(names, key=lambda name: statistics.median(r[0] for r in results[name]))


def goal(results: dict[str, list[Figures]], a: str, b: str, target: float | None) -> str:
    """``a``/``b`` decode, and whether its median meets ``target``."""
    text = paired(results, a, b, 0)
    if target is None:
        return text
    ratio = median_ratio((x[0] for x in results[a]), (y[0] for y in results[b]))
    return f"{text}  (goal >= {target}x: {'met' if ratio >= target else 'NOT met'})"


def bench_model(model: Path, args: argparse.Namespace) -> None:  # noqa: C901, PLR0912, PLR0915  a script's columns
    in_process = bool(args.columns & set(IN_PROCESS)) or args.tree is not None
    sampling = SAMPLED if args.sample else GREEDY
    native = Native(args.native, sampling) if args.native else None
    runners: dict[str, Callable[[], Figures]] = {}
    engine: Engine | None = None
    stock: llama_cpp.Llama | None = None
    flash_attn = args.flash_attn
    tokens: list[int] = []
    if in_process:
        engine = Engine(engine_config(model, ctx="4096", threads=args.threads, flash_attn=args.flash_attn))
        flash_attn = engine.flash_attn  # what auto resolved to: every in-process column runs with it
        tokens = engine.tokenize(PROMPT)
        eng = engine
        runners["localrun"] = lambda: bench_localrun(eng, tokens, args.tokens, "plain", sampling)
        if "panel" in args.columns:
            runners["panel"] = lambda: bench_localrun(eng, tokens, args.tokens, "panel", sampling)
        if "stock" in args.columns:
            stock = llm = llama_cpp.Llama(
                model_path=str(model),
                n_ctx=4096,
                n_batch=2048,
                n_ubatch=512,
                n_threads=args.threads,
                n_threads_batch=args.threads,
                flash_attn=flash_attn != "off",  # auto: on, as llama.cpp settles it for the CPU
                verbose=False,
            )
            runners["stock"] = lambda: bench_stock(llm, tokens, args.tokens, sampling)
    if native is not None and "native" in args.columns:
        options = native_options(args.threads, flash_attn)
        runners["native"] = lambda: native.run("native", model, args.tokens, options)[0]
    if args.tree is not None:
        runners["cli"] = lambda: bench_cli(
            Path(sys.executable), HERE, model, args.tokens, args.threads, flash_attn, sampling
        )
        runners["tree"] = lambda: bench_cli(
            args.tree / ".venv" / "bin" / "python", args.tree, model, args.tokens, args.threads, flash_attn, sampling
        )
    ended: list[int] = []  # the default column's threads at the end of each run, when it says
    settled: list[str] = []  # the settings of its last run, when it says
    if "default" in args.columns:
        runners["default"] = lambda: bench_default(
            model, args.tokens, ended=ended, settled=settled, spec=args.spec, sampling=sampling
        )
    native_default = "on"
    if native is not None and "ll-default" in args.columns:
        runners["ll-default"] = lambda: native.run("ll-default", model, args.tokens, [])[0]
    if native is not None and "ll-other" in args.columns:
        native_default = native.default_fa(model)  # also warms the page cache
        other = ["-fa", "off" if native_default == "on" else "on"]
        runners["ll-other"] = lambda: native.run("ll-other", model, args.tokens, other)[0]
    if "threads" in args.columns:
        for t in range(1, default_threads() + 1):
            runners[f"t{t}"] = partial(bench_default, model, args.tokens, t, spec=args.spec, sampling=sampling)
    if not runners:
        raise SystemExit("error: no column to run")
    if engine is not None:
        bench_localrun(engine, tokens, 8, "plain")  # warm the page cache and the weights
    elif "ll-other" not in runners:
        bench_default(model, 2)  # warm the page cache
    results: dict[str, list[Figures]] = {name: [] for name in runners}
    order = list(runners)
    for rep in range(args.reps):  # rotate the order so no column always runs first
        for name in order[rep % len(order) :] + order[: rep % len(order)]:
            results[name].append(runners[name]())
    what = f"flash attention {flash_attn} in the in-process columns" if in_process else "each side's defaults"
    print(f"\n{model.name}  ({len(tokens) or '~250'} prompt tokens, {what}, {sampling.label})")
    print(f"  {'':10} {'decode tok/s':>13} {'prompt tok/s':>13}")
    for name, rs in results.items():
        print(f"  {name:10} {statistics.median(r[0] for r in rs):13.2f} {statistics.median(r[1] for r in rs):13.2f}")
    for other_column in ("stock", "native"):
        if other_column in results:
            decode, prompt = paired(results, "localrun", other_column, 0), paired(results, "localrun", other_column, 1)
            print(f"  localrun/{other_column}: decode {decode}, prompt {prompt}")
    if "panel" in results:
        print(f"  panel/localrun: decode {paired(results, 'panel', 'localrun', 0)}")
    if "tree" in results:
        print(f"  cli/tree: decode {paired(results, 'cli', 'tree', 0)}, prompt {paired(results, 'cli', 'tree', 1)}")
    lls = [name for name in ("ll-default", "ll-other") if name in results]
    if native is not None and lls:
        threads = native.threads.get("ll-default") or native.threads.get("ll-other")
        other_fa = "off" if native_default == "on" else "on"
        chose = f" (settled on {native_default}; ll-other: -fa {other_fa})" if "ll-other" in results else ""
        print(f"  llama-completion's defaults: {threads or '?'} threads, flash attention auto{chose}")
    if "default" in results:
        if "native" in results:
            print(f"  default/native: decode {paired(results, 'default', 'native', 0)} (--spec {args.spec})")
        if ended:
            print(f"  localrun's default decoded with {', '.join(map(str, ended))} threads at the end of its runs")
        if settled:
            print(f"  localrun's default settings (source): {', '.join(settled)}")
        if lls:
            best = fastest(results, lls)
            print(f"  default / faster of {' and '.join(lls)} ({best}): decode {goal(results, 'default', best, 0.97)}")
        if "ll-default" in results:
            target = 1.4 if args.load >= 2 else None
            note = "" if target else "  (the goal, >= 1.4x, is under --load 2)"
            print(f"  default / ll-default: decode {goal(results, 'default', 'll-default', target)}{note}")
        sweep = [name for name in results if name[0] == "t" and name[1:].isdigit()]
        if sweep:
            best = fastest(results, sweep)
            target = 0.95 if args.load >= 2 else None
            note = "" if target else "  (the goal: >= 0.95x under --load 2; idle, no loss)"
            print(f"  default / best fixed --threads in hindsight ({best}): decode ", end="")
            print(goal(results, "default", best, target) + note)
    if native is not None and native.shares and "native" in results:
        share = statistics.median(native.shares)
        print(f"  native's sampling: {share:.1%} of its decode time (its own 'eval' figure leaves it out)")
    if stock is not None:
        stock.close()
    if engine is not None:
        engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("models", nargs="+", metavar="MODEL", help="model names or GGUF paths, each measured in turn")
    ap.add_argument("--tokens", type=int, default=128, help="tokens to generate per run")
    ap.add_argument(
        "--sample",
        action="store_true",
        help="sample (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, seed 1) instead of greedy, on every side",
    )
    ap.add_argument(
        "--own-cost",
        action="store_true",
        help="only localrun's own cost per token (llama_decode answering at once), greedy and sampled",
    )
    ap.add_argument(
        "--spec",
        choices=("none", "auto", "lookup"),
        default="none",
        help="the default and tN columns' --spec (the in-process columns decode plainly)",
    )
    ap.add_argument("--reps", type=int, default=3, help="interleaved rounds; each column's figure is the median")
    ap.add_argument(
        "--threads", type=int, default=default_threads(), help="threads of localrun, panel, stock and native"
    )
    ap.add_argument("--native", help="path to llama.cpp's llama-completion binary")
    ap.add_argument(
        "--columns",
        type=lambda v: {c.strip() for c in v.split(",")},
        default="panel,stock,native",
        help="comma-separated subset of " + ",".join(COLUMNS) + " (native and ll-* need --native)",
    )
    ap.add_argument(
        "--tree",
        type=Path,
        help="another checkout (with its .venv set up): adds the cli and tree columns, before/after in one run",
    )
    ap.add_argument(
        "--flash-attn",
        choices=("auto", "on", "off"),
        default="auto",
        help="as localrun's option, for the in-process columns, native, cli and tree",
    )
    ap.add_argument(
        "--load",
        type=int,
        default=0,
        help="competing CPU-bound processes during the measurement; adds the threads columns",
    )
    args = ap.parse_args()
    if args.load:
        args.columns.add("threads")
    unknown = args.columns - set(COLUMNS) - {"none"}
    if unknown:
        ap.error(f"unknown column {', '.join(sorted(unknown))}; choose from {', '.join(COLUMNS)}")
    if not args.native and args.columns & {"ll-default", "ll-other"}:
        ap.error("the ll-default and ll-other columns need --native PATH/TO/llama-completion")
    models = [model_path(name) for name in args.models]
    load = f", {args.load} competing CPU-bound processes" if args.load else ""
    how = "sampled" if args.sample else "greedy"
    print(f"threads {args.threads}, {args.tokens} {how} tokens, {args.reps} rounds{load}; tok/s are medians")
    with ExitStack() as stack:
        if args.load:
            pids = stack.enter_context(cpu_load(args.load))
            print(f"load: processes {', '.join(map(str, pids))}")
        for model in models:
            if args.own_cost:
                own_cost(model, args.threads)
            else:
                bench_model(model, args)


if __name__ == "__main__":
    main()
