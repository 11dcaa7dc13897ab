#!/usr/bin/env python3
"""Measure localrun against llama.cpp's own tools on whatever GPU is present,
side by side, in one run: the device check of the GPU issue.

    python3 scripts/bench_gpu.py --bin BUILD/bin MODEL [MODEL ...]
        [--gpu-layers all] [--flash-attn on] [--budget SECONDS] [--table FILE] [--quick]

llama.cpp's tools come from --bin (a build of the same llama.cpp source as
the libllama localrun runs on: scripts/device_check makes both). For each
MODEL, in this order (a section is left out, and said so, when the time
budget left cannot hold it):
  decode   `localrun generate -n 128` (greedy, plain decoding, a short raw
           prompt: its done event's decode rate) vs `llama-bench -n 128`
           (tg128), the same flash-attention mode           goal >= 0.95x
  prompt   `localrun generate` on a ~512-token raw prompt (prompt tokens
           over the time to the first token) vs `llama-bench -p 512`
           (pp512)                                          goal >= 0.95x
  batch    `localrun generate --batch`, 64 prompts x 128 tokens, --parallel
           64: generated tokens over the batch's time, vs
           `llama-batched-bench` at the same parallel (random prompts of
           --pp tokens; its generated tokens over its whole time)
                                                            goal >= 0.9x
           and vs one stream (localrun's decode rate)      goal >= 10x
  serve    16 concurrent streaming clients against `localrun serve
           --parallel 16` vs `llama-server -np 16`, aggregate generated
           tokens/s                                         goal >= 0.9x
  sampling scripts/bench_sampling.py at 1 and 2 x --clients sequences:
           llama.cpp's sampler chains in its graph vs the batch
           scheduler's host sampling (localrun against itself; above 1,
           --batch and serve would gain from sampling in the graph here)
                                                            goal >= 1.0x
localrun runs as its command line, as a user runs it, with `--gpu-layers
VALUE` (and LOCALRUN_GPU_LAYERS=VALUE in its environment); llama.cpp's
tools with `-ngl` (all: 99). A localrun without the --gpu-layers option is
said in one line and its rows are not measured (exit status 3): llama.cpp's
figures still are. `--gpu-layers 0` measures both on the CPU (the dry run).
Ratios are localrun / llama.cpp, the median of the ratios within each round.
The weights of synthetic models are random: greedy text can end early, so
rates are per token actually generated.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from localrun.openmp import others_environ
from localrun.runtime.devices import probe
from localrun.system import default_threads
from scripts._models import HelpFormatter
from scripts._stats import median_ratio
from scripts.bench_batch import bench_prompts, run_cli_batch, run_native
from scripts.bench_serve import concurrent, llama_server, localrun_server, long_answer_prompts

HERE = Path(__file__).resolve().parent.parent
THREADS = default_threads()  # llama-batched-bench's -t (the GPU does the work when layers are offloaded)
T = TypeVar("T")
GPU_OPTION = "--gpu-layers"
SHORT_PROMPT = "Once upon a time"
# words of one token each in Qwen2.5's vocabulary: ~1 token per word
PROMPT_WORDS = ["the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "on", "be", "by", "at", "or"]


@dataclass
class Row:
    model: str
    what: str
    ours: list[float] = field(default_factory=list)
    theirs: list[float] = field(default_factory=list)
    goal: float = 0.0
    against: str = "llama.cpp"
    note: str = ""
    where: str = ""  # where localrun ran, as its --json says
    failed: bool = False

    def say(self, note: str) -> None:
        self.note = f"{self.note}; {note}" if self.note else note

    def cells(self) -> list[str]:
        ours = f"{statistics.median(self.ours):.1f}" if self.ours else "-"
        theirs = f"{statistics.median(self.theirs):.1f}" if self.theirs else "-"
        if self.ours and self.theirs:
            pairs = list(zip(self.ours, self.theirs, strict=False))
            ratio = median_ratio([a for a, _ in pairs], [b for _, b in pairs])
            met = "met" if ratio >= self.goal else "NOT met"
            verdict = [f"{ratio:.3f}x", f">= {self.goal:g}x {met}"]
        else:
            verdict = ["-", f">= {self.goal:g}x not measured"]
        note = "; ".join(n for n in (f"localrun on {self.where}" if self.where else "", self.note) if n)
        return [self.model, self.what, ours, self.against, theirs, *verdict, note]


HEADER = ["model", "measure", "localrun tok/s", "against", "tok/s", "ratio", "goal", "note"]


def table(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in rows]
    return "\n".join(lines)


class Budget:
    """The seconds left of the run's budget; a section asks before it starts."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def allows(self, seconds: float) -> bool:
        return self.left() >= seconds


@dataclass
class Setup:
    bin: Path
    gpu_layers: str
    flash_attn: str
    has_gpu_option: bool

    @property
    def ngl(self) -> str:
        return "99" if self.gpu_layers == "all" else self.gpu_layers

    @property
    def ours_runs(self) -> bool:
        """Whether localrun can run as asked: a CPU run always, a GPU run with the option."""
        return self.gpu_layers == "0" or self.has_gpu_option

    def localrun_options(self) -> list[str]:
        return [GPU_OPTION, self.gpu_layers] if self.has_gpu_option and self.gpu_layers != "0" else []

    def tool(self, name: str) -> Path | None:
        path = self.bin / name
        return path if path.exists() else None


def _localrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "localrun", *args]


def has_gpu_option() -> bool:
    """Whether this localrun's generate and serve take --gpu-layers."""
    helps = [
        subprocess.run(_localrun(cmd, "--help"), capture_output=True, text=True, check=False, cwd=HERE).stdout
        for cmd in ("generate", "serve")
    ]
    return all(GPU_OPTION in text for text in helps)


def llama_bench(setup: Setup, model: Path, reps: int) -> tuple[float, float]:
    """(pp512, tg128) tokens/s of llama-bench, the median of ``reps`` runs."""
    tool = setup.tool("llama-bench")
    if tool is None:
        raise RuntimeError(f"no llama-bench in {setup.bin}")
    cmd = [str(tool), "-m", str(model), "-ngl", setup.ngl, "-fa", setup.flash_attn, "-p", "512", "-n", "128"]
    cmd += ["-r", str(reps), "-o", "json"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=others_environ())
    try:
        tests = json.loads(done.stdout)
        rate = {(t["n_prompt"], t["n_gen"]): float(t["avg_ts"]) for t in tests}
        return rate[(512, 0)], rate[(0, 128)]
    except (ValueError, KeyError, TypeError) as exc:
        raise RuntimeError(f"could not read llama-bench's output ({done.returncode}):\n{done.stderr[-2000:]}") from exc


def localrun_generate(setup: Setup, model: Path, prompt: str, tokens: int) -> tuple[float, float, str]:
    """(prompt tok/s, decode tok/s, where it ran) of one `localrun generate --json`."""
    cmd = _localrun("generate", "-m", str(model), "-n", str(tokens), "-t", "0", "--spec", "none", "--raw")
    cmd += ["--flash-attn", setup.flash_attn, "--no-prompt-cache", "--no-log", "--json", *setup.localrun_options()]
    done = subprocess.run([*cmd, prompt], capture_output=True, text=True, check=False, cwd=HERE)
    lines = done.stdout.strip().splitlines()
    event = json.loads(lines[-1]) if lines else {}
    if done.returncode != 0 or event.get("type") != "done":
        raise RuntimeError(f"localrun generate failed ({done.returncode}):\n{done.stderr[-2000:]}")
    settings = event.get("settings", {})
    placement = settings.get("placement", {}).get("value", "?")
    where = f"{placement}, sampling on the {settings.get('sample_on', {}).get('value', '?')}"
    return event["prompt_tokens"] / event["ttft_s"], event["decode_tokens_per_s"], where


def long_prompt(words: int = 511) -> str:
    return " ".join(PROMPT_WORDS[i % len(PROMPT_WORDS)] for i in range(words))


Failure = (RuntimeError, OSError, subprocess.SubprocessError, ValueError, KeyError)


def attempt(row: Row, side: str, run: Callable[[], T]) -> T | None:
    """``run()``, or None when it fails: said on the row and printed, and the other side still runs."""
    try:
        return run()
    except Failure as exc:
        row.failed = True
        row.say(f"{side} FAILED")
        print(f"  {row.model} {row.what}: {side} failed: {exc}", flush=True)
        return None


def section_decode(setup: Setup, model: Path, rows: list[Row], reps: int) -> float | None:
    """decode and prompt rows; localrun's one-stream decode rate (for the batch row)."""
    decode, prompt = Row(model.stem, "decode tg128", goal=0.95), Row(model.stem, "prompt pp512", goal=0.95)
    decode.against = prompt.against = "llama-bench"
    rows += [decode, prompt]
    for _ in range(reps):
        theirs = attempt(decode, "llama-bench", lambda: llama_bench(setup, model, reps=1))
        ours = ours_pp = None
        if setup.ours_runs:
            ours = attempt(decode, "localrun", lambda: localrun_generate(setup, model, SHORT_PROMPT, 128))
            ours_pp = attempt(prompt, "localrun", lambda: localrun_generate(setup, model, long_prompt(), 1))
        if theirs is not None:
            prompt.theirs.append(theirs[0])
            decode.theirs.append(theirs[1])
        if ours is not None and ours_pp is not None:
            decode.ours.append(ours[1])
            prompt.ours.append(ours_pp[0])
            decode.where = prompt.where = ours[2]
        print(f"  {model.stem}: {decode.cells()[2:6]} {prompt.cells()[2:6]}", flush=True)
    return statistics.median(decode.ours) if decode.ours else None


def section_batch(
    setup: Setup, model: Path, rows: list[Row], one_stream: float | None, args: argparse.Namespace
) -> None:
    n, tokens = args.prompts, args.tokens
    row = Row(model.stem, f"--batch {n}x{tokens}", goal=0.9, against=f"batched-bench -npl {n}")
    alone = Row(model.stem, f"--batch {n}x{tokens} vs one stream", goal=10.0, against="localrun decode")
    rows += [row, alone]
    tool = str(setup.bin / "llama-batched-bench")
    extra = ("-ngl", setup.ngl, "-fa", setup.flash_attn)
    theirs = attempt(row, "llama-batched-bench", lambda: run_native(tool, model, n, args.pp, tokens, THREADS, extra))
    if theirs is not None:
        row.theirs.append(theirs[0] * tokens / (args.pp + tokens))  # generated tokens over the whole time
    options = argparse.Namespace(threads=None, tokens=tokens)
    ours_extra = ("--flash-attn", setup.flash_attn, "--no-log", *setup.localrun_options())
    ours = None
    if setup.ours_runs:
        ours = attempt(row, "localrun", lambda: run_cli_batch(model, bench_prompts(n), options, n, ours_extra))
    if ours is not None:
        rate, generated, _, parallel = ours
        row.ours.append(rate)
        row.say(f"localrun: {generated} tokens, {parallel} at a time")
        if one_stream:
            alone.ours.append(rate)
            alone.theirs.append(one_stream)
    print(f"  {model.stem}: {row.cells()[2:6]} {alone.cells()[2:6]}", flush=True)


def section_serve(setup: Setup, model: Path, rows: list[Row], args: argparse.Namespace) -> None:
    n = args.clients
    row = Row(model.stem, f"serve, {n} clients x{args.tokens}", goal=0.9, against=f"llama-server -np {n}")
    rows.append(row)
    options = argparse.Namespace(ctx=args.serve_ctx, load=4 * n, threads=None)
    prompts = long_answer_prompts(n)

    def theirs() -> tuple[float, int, int]:
        with llama_server(setup.bin / "llama-server", model, n, options, setup.flash_attn, "-ngl", setup.ngl) as s:
            return concurrent(s, prompts, args.tokens)

    def ours() -> tuple[float, int, int]:
        extra = ("--flash-attn", setup.flash_attn, "--no-log", *setup.localrun_options())
        with localrun_server(model, n, options, *extra) as s:
            return concurrent(s, prompts, args.tokens)

    for side, run, rates in (("llama-server", theirs, row.theirs), ("localrun", ours, row.ours)):
        if side == "localrun" and not setup.ours_runs:
            continue
        got = attempt(row, side, run)
        if got is not None:
            rates.append(got[0])
            row.say(f"{side}: {got[1]} tokens, {got[2]}/{n} to the end")
    print(f"  {model.stem}: {row.cells()[2:6]}", flush=True)


def section_sampling(setup: Setup, model: Path, rows: list[Row], args: argparse.Namespace, seconds: float) -> None:
    counts = (1, 2 * args.clients)
    found = {n: Row(model.stem, f"in-graph sampling, {n} seq.", goal=1.0, against="host sampling") for n in counts}
    rows += found.values()
    if not setup.ours_runs:
        return
    cmd = [sys.executable, str(HERE / "scripts" / "bench_sampling.py"), str(model), "--json"]
    cmd += ["--sequences", ",".join(map(str, counts)), "--rounds", str(args.reps), "--steps", str(max(args.tokens, 16))]
    cmd += ["--gpu-layers", setup.gpu_layers, "--flash-attn", setup.flash_attn]

    def run() -> None:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=HERE, timeout=seconds)
        if done.returncode != 0:
            raise RuntimeError(f"bench_sampling.py failed ({done.returncode}):\n{done.stderr[-2000:]}")
        records = {r["sequences"]: r for r in (json.loads(x) for x in done.stdout.splitlines() if x.startswith("{"))}
        if set(records) != set(counts):
            raise RuntimeError(f"bench_sampling.py gave counts {sorted(records)}, not {list(counts)}")
        for n, row in found.items():  # tokens/s of a step, each side's in the same rounds
            row.ours += [1000 * n / ms for ms in records[n]["in_graph_ms"]]
            row.theirs += [1000 * n / ms for ms in records[n]["host_ms"]]

    first, *others = found.values()
    if attempt(first, "bench_sampling.py", run) is None and first.failed:
        for row in others:
            row.failed = True
            row.say("bench_sampling.py FAILED")
    print(f"  {model.stem}: " + " ".join(str(r.cells()[2:6]) for r in found.values()), flush=True)


Section = Callable[[Path], None]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("models", nargs="+", type=Path, help="GGUF files, smallest first")
    ap.add_argument("--bin", type=Path, required=True, help="the folder of llama.cpp's tools (llama-bench ...)")
    ap.add_argument("--gpu-layers", default="all", help="layers on the GPU for both sides: all, N, or 0 for the CPU")
    ap.add_argument("--flash-attn", default="on", choices=["on", "off"], help="the mode of both sides")
    ap.add_argument("--budget", type=float, default=240.0, help="seconds for all the measurements")
    ap.add_argument("--reps", type=int, default=2, help="rounds of the decode and prompt rows")
    ap.add_argument("--prompts", type=int, default=64, help="--batch prompts (and the parallel of both sides)")
    ap.add_argument("--tokens", type=int, default=128, help="tokens per sequence in --batch and serve")
    ap.add_argument("--pp", type=int, default=128, help="llama-batched-bench's prompt tokens per sequence")
    ap.add_argument("--clients", type=int, default=16, help="concurrent clients of the servers")
    ap.add_argument("--serve-ctx", type=int, default=2048, help="context per server slot")
    ap.add_argument("--table", type=Path, help="also write the table (markdown) here")
    ap.add_argument("--quick", action="store_true", help="a dry run's sizes: 1 rep, 8 prompts, 16 tokens, 4 clients")
    args = ap.parse_args()
    if args.quick:
        args.reps, args.prompts, args.tokens, args.pp, args.clients = 1, 8, 16, 32, 4
    budget = Budget(args.budget)
    os.environ["LOCALRUN_GPU_LAYERS"] = args.gpu_layers  # every localrun started from here
    setup = Setup(args.bin, args.gpu_layers, args.flash_attn, has_gpu_option())
    missing = [t for t in ("llama-bench", "llama-batched-bench", "llama-server") if setup.tool(t) is None]
    if missing:
        print(f"not in {args.bin} (not built): {', '.join(missing)}; their columns stay empty", flush=True)
    absent = (
        f"localrun here has no {GPU_OPTION} option (its GPU path is not in this checkout): "
        "localrun's rows are not measured; llama.cpp's are"
    )
    if not setup.ours_runs:
        print(absent, flush=True)
    gib = 2**30
    found = ", ".join(f"{d.name} ({d.description}, {d.free / gib:.1f}/{d.total / gib:.1f} GiB free)" for d in probe())
    print(f"devices as localrun finds them: {found}", flush=True)
    rows: list[Row] = []
    one_stream: dict[Path, float | None] = {}
    # each section in the order of the goals, every model before the next section; (name, seconds it may need)
    sections: list[tuple[str, float, Section]] = [
        ("decode/prompt", 15.0, lambda m: one_stream.__setitem__(m, section_decode(setup, m, rows, args.reps))),
        ("batch", 20.0, lambda m: section_batch(setup, m, rows, one_stream.get(m), args)),
        ("serve", 25.0, lambda m: section_serve(setup, m, rows, args)),
        ("sampling", 30.0, lambda m: section_sampling(setup, m, rows, args, max(budget.left() - 10, 30))),
    ]
    for name, need, run in sections:
        for model in args.models:
            weight = 1 + model.stat().st_size / 2**32  # a larger model takes longer: 7B about twice 0.5B
            if not budget.allows(need * weight):
                print(f"{name} on {model.stem}: left out, {budget.left():.0f}s of the budget left", flush=True)
                continue
            print(f"{name} on {model.stem} ({budget.left():.0f}s left)", flush=True)
            run(model)
    text = table(rows) + ("" if setup.ours_runs else f"\n\n{absent}")
    print(text)
    if args.table:
        args.table.write_text(text + "\n")
    return 1 if any(r.failed for r in rows) else (0 if setup.ours_runs else 3)


if __name__ == "__main__":
    sys.exit(main())
