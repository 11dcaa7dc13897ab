#!/usr/bin/env python3
"""The whole request against llama-completion's defaults: a prompt filled and
an answer decoded, each phase and the total, for several shapes of request.

    scripts/bench_request.py MODEL [MODEL ...] --native PATH/TO/llama-completion
        [--shapes 1800:64,1800:512,32:512] [--rounds 3] [--spec none]

Each shape is PROMPT:ANSWER in tokens: a prompt cut from localrun's own
source files to PROMPT tokens of the model's vocabulary (code, no repeats: a
long prompt lookup could copy from is not what this measures) and a budget
of ANSWER tokens, greedy. Each round runs both sides once, in alternating
order:

  localrun     `localrun generate -m MODEL --raw -t 0 -n ANSWER --json
               --no-prompt-cache PROMPT` with everything else at its defaults,
               as a user runs it after `localrun tune` (the wisdom in this
               user's cache decides, for this shape); its done event gives the
               prompt phase (time to the first token) and the decode rate.
  llama        llama-completion with its own defaults (`-m MODEL -f FILE -n
               ANSWER --temp 0 -no-cnv --no-warmup`: its threads, flash
               attention auto, f16 KV); its log gives the prompt eval time and
               the decode rate (sampling included, as localrun counts it).

The total is the prompt phase plus ANSWER tokens at the decode rate (a side
that stopped early, at an end-of-text token, is counted at its rate: the
generated counts are printed). Printed per shape: the median of each figure
over the rounds with its range, and the ratios localrun / llama (speed: above
1 is localrun faster) as the median of each round's ratio, with its range;
and per round, the waiting policy localrun's threads ran with (spin or
sleep-soon: localrun.openmp) and, where it speculated, how many drafted
tokens were accepted of those proposed (a greedy answer that repeats itself
is where lookup drafting pays).

Without --native, only the localrun side runs (a dry run of the shapes and of
what the tuned settings chose for them).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from localrun.openmp import others_environ
from localrun.runtime.engine import Vocabulary
from scripts._models import HelpFormatter, model_path
from scripts._native import timings
from scripts._stats import ratio_summary

HERE = Path(__file__).resolve().parent.parent
DEFAULT_SHAPES = "1800:64,1800:512,32:512"


@dataclass(frozen=True)
class Shape:
    prompt: int
    answer: int

    @property
    def label(self) -> str:
        return f"{self.prompt}-token prompt + {self.answer} tokens"


@dataclass(frozen=True)
class Phases:
    """One run: the prompt phase (s), the decode rate (tok/s), tokens generated, and what it ran with."""

    prompt_s: float
    decode_tps: float
    generated: int
    prompt_tokens: int
    settings: str = ""
    wait: str = ""  # libgomp's waiting policy localrun chose at start (`localrun.openmp`)
    drafts: str = ""  # speculation's accepted/proposed tokens, where it drafted

    def total(self, answer: int) -> float:
        return self.prompt_s + answer / self.decode_tps


def parse_shapes(text: str) -> list[Shape]:
    shapes = []
    for part in text.split(","):
        prompt, _, answer = part.partition(":")
        shapes.append(Shape(int(prompt), int(answer)))
    return shapes


def source_text() -> str:
    """localrun's own source, file after file in a fixed order: real code, no repeats."""
    files = sorted((HERE / "localrun").rglob("*.py"))
    return "\n\n".join(f.read_text(encoding="utf-8") for f in files)


def prompt_of(vocabulary: Vocabulary, text: str, tokens: int) -> str:
    """The longest prefix of ``text`` (whole lines) of at most ``tokens`` tokens, as the model counts them."""
    lines = text.splitlines(keepends=True)
    lo, hi = 1, len(lines)
    while lo < hi:  # the most lines that fit
        mid = (lo + hi + 1) // 2
        if len(vocabulary.tokenize("".join(lines[:mid]))) <= tokens:
            lo = mid
        else:
            hi = mid - 1
    return "".join(lines[:lo])


def run_localrun(model: Path, prompt: str, answer: int, spec: str | None) -> Phases:
    cmd = [sys.executable, "-m", "localrun", "generate", "-m", str(model), "--raw", "-t", "0", "-n", str(answer)]
    cmd += ["--json", "--no-prompt-cache", "--no-log"]
    if spec is not None:
        cmd += ["--spec", spec]
    cmd.append(prompt)
    out = subprocess.run(
        cmd, capture_output=True, text=True, cwd=HERE, stdin=subprocess.DEVNULL, check=False, env=others_environ()
    )
    if out.returncode != 0:
        raise RuntimeError(f"localrun generate failed ({out.returncode}):\n{out.stderr[-2000:]}")
    done = json.loads(out.stdout.strip().splitlines()[-1])
    shown = done.get("settings") or {}
    chose = ", ".join(
        f"{name} {shown[name]['value']} ({shown[name]['source']})"
        for name in ("type_k", "type_v", "flash_attn", "threads", "n_ubatch")
        if isinstance(shown.get(name), dict)
    )
    why = shown.get("flash_attn", {}).get("why") or shown.get("type_k", {}).get("why") or ""
    draft = done.get("draft") or {}
    return Phases(
        done["ttft_s"],
        done["decode_tokens_per_s"],
        done["generated_tokens"],
        done["prompt_tokens"],
        f"{chose}; {why}",
        wait=str((shown.get("wait") or {}).get("value", "")),
        drafts=f"{draft.get('accepted', 0)}/{draft.get('proposed', 0)}" if draft else "none",
    )


def run_native(binary: str, model: Path, prompt_file: Path, answer: int) -> Phases:
    cmd = [binary, "-m", str(model), "-f", str(prompt_file), "-n", str(answer), "--temp", "0", "-no-cnv"]
    cmd.append("--no-warmup")
    out = subprocess.run(
        cmd, capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL, env=others_environ()
    )
    figures = timings(out.stderr)
    log = out.stderr
    prompt_n, prompt_ms, generated = 0, 0.0, 0
    for line in log.splitlines():  # "prompt eval time = X ms / N tokens", "eval time = X ms / N runs"
        if "prompt eval time" in line:
            prompt_ms = float(line.split("=")[1].split("ms")[0])
            prompt_n = int(line.split("/")[1].split()[0])
        elif "eval time" in line:
            generated = int(line.split("/")[1].split()[0])
    return Phases(prompt_ms / 1e3, figures.decode_per_s, generated, prompt_n)


def _spread(xs: list[float], fmt: str) -> str:
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def bench(model: Path, shapes: list[Shape], args: argparse.Namespace) -> None:
    print(f"{model.name}: {args.rounds} round(s), localrun {'--spec ' + args.spec if args.spec else 'defaults'}")
    text = source_text()
    with Vocabulary(model) as vocabulary:
        prompts = {shape: prompt_of(vocabulary, text, shape.prompt) for shape in shapes}
    with tempfile.TemporaryDirectory() as tmp:
        for shape in shapes:
            prompt_file = Path(tmp) / f"prompt-{shape.prompt}.txt"
            prompt_file.write_text(prompts[shape], encoding="utf-8")
            ours: list[Phases] = []
            theirs: list[Phases] = []
            for r in range(args.rounds):
                sides = ["localrun", "llama"] if r % 2 == 0 else ["llama", "localrun"]
                for side in sides:
                    if side == "localrun":
                        ours.append(run_localrun(model, prompts[shape], shape.answer, args.spec))
                    elif args.native:
                        theirs.append(run_native(args.native, model, prompt_file, shape.answer))
            report(shape, ours, theirs)


def report(shape: Shape, ours: list[Phases], theirs: list[Phases]) -> None:
    print(f"  {shape.label}")
    print(f"    localrun settings: {ours[-1].settings}")
    waits, drafts = ", ".join(p.wait for p in ours), ", ".join(p.drafts for p in ours)
    print(f"    localrun per round: waiting threads {waits}; drafts accepted/proposed {drafts}")
    for name, runs in (("localrun", ours), ("llama-completion", theirs)):
        if not runs:
            continue
        prompt = _spread([p.prompt_s for p in runs], "{:.2f}")
        decode = _spread([p.decode_tps for p in runs], "{:.2f}")
        total = _spread([p.total(shape.answer) for p in runs], "{:.2f}")
        made = "/".join(str(p.generated) for p in runs)
        print(
            f"    {name:<17} prompt {prompt} s ({runs[0].prompt_tokens} tokens), decode {decode} tok/s, "
            f"total {total} s; generated {made}"
        )
    if not theirs:
        return
    prompt = ratio_summary([p.prompt_s for p in theirs], [p.prompt_s for p in ours])
    decode = ratio_summary([p.decode_tps for p in ours], [p.decode_tps for p in theirs])
    total = ratio_summary([p.total(shape.answer) for p in theirs], [p.total(shape.answer) for p in ours])
    print(f"    localrun / llama-completion (speed): prompt {prompt}, decode {decode}, whole request {total}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("models", nargs="+", help="model names or GGUF paths")
    ap.add_argument("--native", help="path to llama.cpp's llama-completion (without it: localrun alone)")
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="PROMPT:ANSWER token counts, comma-separated")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per shape")
    ap.add_argument("--spec", help="localrun's --spec (default: its own default)")
    args = ap.parse_args()
    shapes = parse_shapes(args.shapes)
    if not args.native:
        print("no --native: localrun alone (a dry run)")
    for name in args.models:
        bench(model_path(name), shapes, args)


if __name__ == "__main__":
    main()
