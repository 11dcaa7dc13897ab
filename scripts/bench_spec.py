#!/usr/bin/env python3
"""Speculative decoding side by side with plain decoding, in one run.

    .venv/bin/python scripts/bench_spec.py [--quick] [--rounds 2] [--threads N]
        [--target MODEL] [--draft MODEL] [--draft-n 3]
        [--workloads prose,rename,reformat,typo] [--columns plain,draft,lookup,auto,oracle]
        [--oracle-n 2,4,8,16] [--native PATH/TO/llama-speculative-simple]

Greedy, by default on the Qwen2.5-Coder 1.5B target with its 0.5B draft
(--target and --draft take any localrun model name: a registry alias,
owner/repo:QUANT, hf://owner/repo/file.gguf or a GGUF path; a registry model
is pulled on first use). Workloads:
  prose    free generation (an explanation): nothing to copy
  rename   rename a variable in a ~50-line Python file: the answer copies the input
  reformat reformat compact Python to PEP 8: the answer copies the input with
           every line's indentation and spacing changed
  typo     fix the typos in a long paragraph: the answer copies the input
Columns, run in interleaved rounds (the order rotates) on one target engine:
  plain    localrun's plain loop (decode.generate)
  draft    the draft model, a fixed draft length (--draft-n), every step
  lookup   prompt lookup (by tokens, and by text with its spacing set aside)
           under the adaptive controller: what `--spec lookup` does
  auto     what `--spec auto` does: lookup and the draft model, adaptive
  oracle   the best fixed configuration chosen in hindsight: each of
           lk-N     the two lookups (token lookup's offer first, else text
                    lookup's), a fixed draft length N whenever one offers
                    (shorter only where the match or the output ends)
           dm-N     the draft model, a fixed draft length N every step (at most
                    N: it stops early where its own top probability falls
                    under 0.4, as in auto; N may pass the 8 auto allows it)
           for each N of --oracle-n (default 2, 4, 8 and 16: 8 configurations;
           --quick: 4 and 8) runs as its own column in the same rounds; the
           oracle row is the one with the highest median decode rate on that
           workload (named), and auto/oracle is the ratio of auto to that
           configuration within each round, median over rounds
With --native PATH/TO/llama-speculative-simple, llama.cpp's own speculative
decoding on the same templated prompt, greedy, its defaults otherwise:
  ll-draft --spec-type draft-simple with the draft model (draft length 3)
  ll-ngram --spec-type ngram-simple (prompt lookup)
  ll-ngmod --spec-type ngram-mod
For each: decode tokens/sec (first token to last, as `--stats` reports it),
the ratio to plain (taken within each round, median over rounds), acceptance,
and whether the text is identical to plain's; where it is not, a line
after the table says at which token it first differs and how far apart the
two candidates' logits are there (llama.cpp computes a batch's rows with
other kernels than a single row, so a verify batch can round a near tie the
other way). `--workloads` and `--columns` run a subset. A run during which other
processes took over 10% of the CPU is redone (--attempts). The prompt is evaluated once
(KV cache reuse) and is not part of the figures; the draft model's own
catch-up (auto loads it mid-generation, if at all) is. --quick: 1 round,
shorter outputs, two workloads, the oracle at N = 4 and 8 unless --oracle-n is given.
It ends with the issue's goals per workload: auto / plain >= 0.97x and
auto / oracle >= 0.9x.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from localrun.events import DoneEvent, DraftStats, Event, Stats, TokenEvent
from localrun.openmp import others_environ
from localrun.runtime.decoder import Decoder
from localrun.runtime.engine import Engine
from localrun.runtime.generate import generate
from localrun.runtime.prompt import chat_template, prompt_tokens, render_messages
from localrun.runtime.sampling import SamplingParams
from localrun.speculative import Speculation, lookup_drafters, open_speculation
from localrun.speculative.base import Offer
from localrun.speculative.control import PLAIN, FixedController, Plan, Unobserving
from localrun.speculative.draftmodel import DraftModelDrafter
from localrun.system import default_threads
from scripts._models import HelpFormatter, model_path, tuned_engine
from scripts._stats import median_ratio

TARGET = "qwen2.5-coder:1.5b"
DRAFT = "qwen2.5-coder:0.5b"
GREEDY = SamplingParams(temperature=0.0)

CODE = """import csv
import statistics
from dataclasses import dataclass
from functools import partial


@dataclass
class Sale:
    region: str
    product: str
    units: int
    price: float


def load_sales(path):
    items = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            items.append(Sale(row["region"], row["product"], int(row["units"]), float(row["price"])))
    return items


def total_revenue(items):
    return sum(sale.units * sale.price for sale in items)


def revenue_by_region(items):
    totals = {}
    for sale in items:
        totals[sale.region] = totals.get(sale.region, 0.0) + sale.units * sale.price
    return totals


def best_product(items):
    counts = {}
    for sale in items:
        counts[sale.product] = counts.get(sale.product, 0) + sale.units
    return max(counts, key=counts.get) if counts else None


def median_price(items):
    prices = [sale.price for sale in items]
    return statistics.median(prices) if prices else 0.0


def report(path):
    items = load_sales(path)
    print(f"sales: {len(items)}")
    print(f"revenue: {total_revenue(items):.2f}")
    for region, value in sorted(revenue_by_region(items).items()):
        print(f"  {region}: {value:.2f}")
    print(f"best product: {best_product(items)}")
    print(f"median price: {median_price(items):.2f}")
"""

TEXT = (
    "The old lighthouse stood at the edge of the cliff for more then a hundred years. Every night its "
    "lamp turned slowly, sending a long beam accross the dark water so that fishing boats could find "
    "there way home. The keeper, a quiet man named Tomas, climbed the spiral stairs twice each evening "
    "to clean the glass and trim the wick. He kept a log of every ship he saw, writting the name, the "
    "time and the weather in small careful letters. In winter the storms were so strong that the "
    "windows shook and the sea threw spray all the way up to the gallery. Tomas never missed a night. "
    "When the town finally replaced the lamp with an automatic light, he kept climbing the stairs "
    "anyway, becuase he said the sea still needed someone to watch it."
)

MESSY = """def parse_line(line,sep=','):
  fields=[f.strip() for f in line.split(sep)]
  if len(fields)<3: return None
  name,age,city=fields[0],int(fields[1]),fields[2]
  return {'name':name,'age':age,'city':city}

def load_people(lines):
  people=[]
  for line in lines:
    person=parse_line(line)
    if person is not None and person['age']>=0: people.append(person)
  return people

def group_by_city(people):
  groups={}
  for person in people:
    groups.setdefault(person['city'],[]).append(person['name'])
  return {city:sorted(names) for city,names in groups.items()}

def average_age(people):
  if not people: return 0.0
  return sum(p['age'] for p in people)/len(people)

def oldest(people,n=3):
  return sorted(people,key=lambda p:(-p['age'],p['name']))[:n]
"""

WORKLOADS = {
    "prose": ("Explain how a hash table works and when to use one, in a few paragraphs.", 160, 64),
    "rename": (
        "Rename the variable `items` to `records` everywhere in this code. "
        "Reply with the complete updated code only.\n\n```python\n" + CODE + "```",
        700,
        200,
    ),
    "reformat": (
        "Reformat this Python code to PEP 8: four-space indentation, spaces around operators and after "
        "commas, double quotes, one statement per line. Reply with the complete code only.\n\n```python\n"
        + MESSY
        + "```",
        500,
        0,
    ),
    "typo": ("Fix the spelling mistakes in this text. Reply with the corrected text only.\n\n" + TEXT, 400, 0),
}
COLUMNS = ("plain", "draft", "lookup", "auto", "oracle")
ORACLE_N = (2, 4, 8, 16)
QUICK_ORACLE_N = (4, 8)


@dataclass
class FixedWay(Unobserving):
    """A fixed configuration for the oracle: the first offer from one of
    ``drafters`` (in their order), drafted at length ``n`` (no longer than the
    room left; no longer than the offer's own limit when ``capped``), else a
    plain step. Measures nothing."""

    drafters: tuple[int, ...]
    n: int
    capped: bool = True

    def choose(self, offers: Sequence[Offer], room: int, forced: int = 0) -> Plan:
        for offer in sorted(offers, key=lambda o: o.drafter):
            if offer.drafter in self.drafters and room >= 1:
                return Plan(offer, min(self.n, offer.max_len if self.capped else self.n, room))
        return PLAIN


def oracle_columns(ns: Sequence[int]) -> tuple[str, ...]:
    return tuple(f"{kind}-{n}" for n in ns for kind in ("lk", "dm"))


@dataclass
class Result:
    stats: Stats
    text: str
    others: float = 0.0  # share of the machine's CPU that other processes used during the run
    tokens: tuple[int, ...] = ()  # the generated tokens the KV cache holds after the run
    native: bool = False  # a llama.cpp binary's run: its text is not compared


# --native columns: llama-speculative-simple's --spec-type for each
NATIVE = {"ll-draft": "draft-simple", "ll-ngram": "ngram-simple", "ll-ngmod": "ngram-mod"}
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")
_DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
_ACCEPTED = re.compile(r"n_accept\s*=\s*(\d+)")


def native_run(args: argparse.Namespace, spec_type: str, prompt_file: Path, n: int) -> Result:
    """llama.cpp's llama-speculative-simple on the same templated prompt, greedy;
    its own decode figure (tokens after the prompt over their time)."""
    threads = str(args.threads or default_threads())
    cmd = [str(args.native), "-m", str(args.target), "-f", str(prompt_file), "-n", str(n), "-t", threads]
    cmd += ["-td", threads, "--temp", "0", "-c", "4096", "--spec-type", spec_type]
    if spec_type.startswith("draft"):
        cmd += ["-md", str(args.draft)]
    out = subprocess.run(
        cmd, capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL, env=others_environ()
    )
    found = _DECODED.search(out.stderr)
    if found is None:
        raise RuntimeError("could not read llama-speculative-simple's figures:\n" + out.stderr[-2000:])
    drafted, accepted = (int(m.group(1)) if (m := rx.search(out.stderr)) else 0 for rx in (_DRAFTED, _ACCEPTED))
    stats = Stats(
        prompt_tokens=0,
        generated_tokens=int(found.group(1)),
        ttft_s=0.0,
        decode_tokens_per_s=float(found.group(3)),
        elapsed_s=float(found.group(2)),
        stop_reason="length",
        draft=DraftStats(spec_type, drafted, accepted),
    )
    return Result(stats, "", native=True)


def _cpu() -> tuple[int, int, int]:
    """(all jiffies, idle jiffies, this process's and its waited-for children's jiffies) from /proc."""
    with Path("/proc/stat").open() as f:
        values = [int(v) for v in f.readline().split()[1:9]]
    own = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return sum(values), values[3] + values[4], sum(int(v) for v in own[11:15])  # with finished children (--native)


def measured(runner: Callable[[], Result], attempts: int) -> Result:
    """Run until other processes took under QUIET of the CPU during the run
    (this machine is shared), at most ``attempts`` times; the quietest run."""
    best: Result | None = None
    for _ in range(attempts):
        total0, idle0, own0 = _cpu()
        result = runner()
        total1, idle1, own1 = _cpu()
        span = max(total1 - total0, 1)
        result.others = max((span - (idle1 - idle0)) - (own1 - own0), 0) / span
        if best is None or result.others < best.others:
            best = result
        if result.others < QUIET:
            break
    assert best is not None
    return best


QUIET = 0.1


def run(events: Iterator[Event], decoder: Decoder | None = None, prompt: list[int] | None = None) -> Result:
    """Drain a generation; with ``decoder`` and ``prompt``, also keep the
    generated tokens (for `divergence`)."""
    parts: list[str] = []
    stats = None
    for ev in events:
        if isinstance(ev, TokenEvent):
            parts.append(ev.text)
        elif isinstance(ev, DoneEvent):
            stats = ev.stats
    assert stats is not None
    tokens = tuple(decoder.tokens[len(prompt) :]) if decoder is not None and prompt is not None else ()
    return Result(stats, "".join(parts), tokens=tokens)


def divergence(engine: Engine, decoder: Decoder, prompt: list[int], plain: Result, other: Result) -> str:
    """Where ``other`` first leaves plain's tokens, and how far apart the two
    candidates' logits are there (evaluated after the common prefix): a gap of
    a few hundredths is a near tie that rounding decides. llama.cpp computes a
    batch's rows with other kernels than a single row, so a verify batch can
    round differently from a plain step."""
    a, b = plain.tokens, other.tokens
    k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if k is None:
        return "texts differ past the last token compared"
    decoder.prefill([*prompt, *a[:k]])
    logits = decoder.logits(-1)
    gap = float(logits[a[k]] - logits[b[k]])
    spread = float(logits.max() - statistics.median(logits.tolist()))
    return f"first differs at token {k + 1}: logit gap {gap:+.3f} between the two tokens (top vs median {spread:.1f})"


Column = Callable[[list[int], int], Result]  # (prompt, tokens to generate) -> a run's result


def parse_args() -> argparse.Namespace:
    """The options, with ``columns`` every column to run (the oracle's
    configurations spelled out), ``oracle_n``, ``rounds`` and ``workloads``
    ({name: (prompt, tokens)}) settled."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 round, shorter outputs, two workloads")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (the column order rotates)")
    parser.add_argument("--threads", type=int, default=None, help="threads (default: localrun's default)")
    parser.add_argument("--target", default=TARGET, help="target model name or GGUF path")
    parser.add_argument("--draft", default=DRAFT, help="draft model name or GGUF path")
    parser.add_argument("--draft-n", type=int, default=3, help="draft length of the fixed draft column")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated: " + ", ".join(WORKLOADS))
    parser.add_argument("--columns", default=",".join(COLUMNS), help="comma-separated (plain always runs)")
    parser.add_argument(
        "--oracle-n",
        help=f"draft lengths of the oracle's fixed configurations (default: {','.join(map(str, ORACLE_N))}; "
        f"with --quick {','.join(map(str, QUICK_ORACLE_N))})",
    )
    parser.add_argument(
        "--native", type=Path, help="path to llama.cpp's llama-speculative-simple: adds " + ", ".join(NATIVE)
    )
    parser.add_argument(
        "--attempts", type=int, default=3, help="runs disturbed by other processes (over 10%% of the CPU) are redone"
    )
    args = parser.parse_args()
    args.rounds = 1 if args.quick else args.rounds
    chosen = pick(parser, "workload", args.workloads, tuple(WORKLOADS))
    args.columns = ("plain", *(c for c in pick(parser, "column", args.columns, COLUMNS) if c != "plain"))
    if args.oracle_n is None:
        args.oracle_n = QUICK_ORACLE_N if args.quick else ORACLE_N
    else:
        args.oracle_n = tuple(sorted({int(n) for n in args.oracle_n.split(",") if n.strip()}))
        if not args.oracle_n or min(args.oracle_n) < 1:
            parser.error("--oracle-n takes draft lengths of 1 or more, e.g. 2,4,8,16")
    if "oracle" in args.columns:
        at = args.columns.index("oracle")
        args.columns = (*args.columns[:at], *oracle_columns(args.oracle_n), *args.columns[at + 1 :])
    if args.native:
        args.columns += tuple(NATIVE)
    args.target, args.draft = model_path(args.target), model_path(args.draft)
    args.workloads = {
        name: (prompt, quick if args.quick else full)
        for name, (prompt, full, quick) in WORKLOADS.items()
        if name in chosen and (not args.quick or quick)
    }
    return args


def make_columns(
    args: argparse.Namespace, engine: Engine, decoder: Decoder, curve: tuple[float, ...] | None = None
) -> tuple[dict[str, Column], DraftModelDrafter | None]:
    """Each localrun column's runner, and the draft model the fixed
    draft-model columns share (loaded now, if one of them runs; the caller closes it)."""
    needs_model = any(c == "draft" or c.startswith("dm-") for c in args.columns)
    model = DraftModelDrafter(args.draft, engine, eager=True) if needs_model else None

    def with_model(controller: FixedController | FixedWay) -> Column:
        assert model is not None
        speculation = Speculation([model], controller)  # not closed: the model is closed once, at the end
        return lambda p, n: run(speculation.generate(engine, p, GREEDY, max_tokens=n, decoder=decoder), decoder, p)

    def lookup_at(n_fixed: int) -> Column:
        return lambda p, n: fresh(
            Speculation(lookup_drafters(engine), FixedWay((0, 1), n_fixed)), engine, decoder, p, n
        )

    def opened(choice: str, draft: Path | None) -> Column:
        def column(p: list[int], n: int) -> Result:
            speculation = open_speculation(engine, choice, draft, verify_curve=curve)
            assert speculation is not None
            return fresh(speculation, engine, decoder, p, n)

        return column

    # adaptive columns start fresh each time, as a new `localrun generate` does: nothing measured yet
    columns: dict[str, Column] = {
        "plain": lambda p, n: run(generate(engine, p, GREEDY, max_tokens=n, decoder=decoder), decoder, p),
        "lookup": opened("lookup", None),
        "auto": opened("auto", args.draft),
    }
    if model is not None:
        columns["draft"] = with_model(FixedController(0, args.draft_n))
        for n_fixed in args.oracle_n:
            columns[f"dm-{n_fixed}"] = with_model(FixedWay((0,), n_fixed, capped=False))
    for n_fixed in args.oracle_n:
        columns[f"lk-{n_fixed}"] = lookup_at(n_fixed)
    return columns, model


def main() -> None:
    args = parse_args()
    rounds, workloads = args.rounds, args.workloads
    engine, curve = tuned_engine(args.target, args.threads)
    decoder = Decoder(engine)
    columns, model = make_columns(args, engine, decoder, curve)
    prompts = {name: prompt_tokens(engine, text) for name, (text, _) in workloads.items()}
    folder = Path(tempfile.mkdtemp(prefix="bench_spec-"))
    files = {name: folder / f"{name}.txt" for name in workloads}  # the same templated prompts, for --native
    for name, (text, _) in workloads.items():
        files[name].write_text(render_messages(engine, chat_template(engine), [{"role": "user", "content": text}]))
    results: dict[tuple[str, str], list[Result]] = {}
    for r in range(rounds):
        for w, (name, (_, n)) in enumerate(workloads.items()):
            run(generate(engine, prompts[name], GREEDY, max_tokens=1, decoder=decoder))  # the prompt, once
            shift = (r + w) % len(args.columns)
            for column in args.columns[shift:] + args.columns[:shift]:
                job = (
                    partial(native_run, args, NATIVE[column], files[name], n)
                    if column in NATIVE
                    else partial(columns[column], prompts[name], n)
                )
                result = measured(job, args.attempts)
                results.setdefault((name, column), []).append(result)
                print(
                    f"round {r + 1} {name:7s} {column:7s} {result.stats.decode_tokens_per_s:6.2f} tok/s "
                    f"{result.stats.generated_tokens} tokens, other processes {result.others:.0%} of the CPU",
                    file=sys.stderr,
                    flush=True,
                )
    if model is not None:
        model.close()
    shutil.rmtree(folder, ignore_errors=True)
    report(workloads, results, rounds, args)
    fixed = set(oracle_columns(args.oracle_n))
    for (name, column), runs in results.items():
        for r, (result, base) in enumerate(zip(runs, results[(name, "plain")], strict=True)):
            if not result.native and result.text != base.text:
                where = divergence(engine, decoder, prompts[name], base, result)
                print(f"{name} {column} round {r + 1}: {where}")
                if column in fixed:  # the oracle's configurations: the first round that differs only
                    break


def pick(parser: argparse.ArgumentParser, what: str, given: str, known: tuple[str, ...]) -> tuple[str, ...]:
    names = tuple(n.strip() for n in given.split(",") if n.strip())
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        parser.error(f"unknown {what} {', '.join(unknown) or '(none given)'}; choose from {', '.join(known)}")
    return names


def fresh(speculation: Speculation, engine: Engine, decoder: Decoder, prompt: list[int], n: int) -> Result:
    with speculation:
        return run(speculation.generate(engine, prompt, GREEDY, max_tokens=n, decoder=decoder), decoder, prompt)


def report(
    workloads: dict[str, tuple[str, int]],
    results: dict[tuple[str, str], list[Result]],
    rounds: int,
    args: argparse.Namespace,
) -> None:
    print(
        f"\n{args.target.name} + draft {args.draft.name}, greedy, {rounds} round(s), "
        f"decode tok/s median over rounds; ratio to plain within each round, median"
    )
    header = f"{'workload':8s} {'column':7s} {'tok/s':>7s} {'ratio':>7s} {'accepted':>14s} {'per step':>8s}  identical"
    print(header)
    print("-" * len(header))
    for name in workloads:
        base = results[(name, "plain")]
        for column in args.columns:
            runs = results[(name, column)]
            rate = statistics.median(r.stats.decode_tokens_per_s for r in runs)
            ratio = median_ratio(
                (r.stats.decode_tokens_per_s for r in runs), (b.stats.decode_tokens_per_s for b in base)
            )
            draft = runs[-1].stats.draft
            accepted = f"{draft.accepted}/{draft.proposed} {draft.acceptance:4.0%}" if draft and draft.proposed else "-"
            per_step = f"{draft.mean_accepted:.2f}" if draft and draft.rounds else "-"
            same = all(r.text == b.text for r, b in zip(runs, base, strict=True))
            identical = "-" if runs[0].native else "yes" if same else "NO"
            drafter = f"  ({draft.drafter})" if draft and column == "auto" else ""
            print(
                f"{name:8s} {column:7s} {rate:7.2f} {ratio:6.2f}x {accepted:>14s} {per_step:>8s}  {identical}{drafter}"
            )
        if best := oracle(name, results, args):
            rate = statistics.median(rates(results[(name, best)]))
            ratio = median_ratio(rates(results[(name, best)]), rates(base))
            print(f"{name:8s} {'oracle':7s} {rate:7.2f} {ratio:6.2f}x  (the best fixed configuration: {best})")
        print(f"{'':8s} {runs[-1].stats.generated_tokens} tokens")
    worst = max(r.others for runs in results.values() for r in runs)
    print(f"other processes took up to {worst:.0%} of the CPU during a run kept (runs over {QUIET:.0%} are redone)")
    if "auto" in args.columns:
        goals(workloads, results, args)


def rates(runs: list[Result]) -> list[float]:
    return [r.stats.decode_tokens_per_s for r in runs]


def oracle(workload: str, results: dict[tuple[str, str], list[Result]], args: argparse.Namespace) -> str | None:
    """The fixed configuration (lk-N or dm-N) with the highest median decode
    rate on ``workload``: the best chosen in hindsight; None if none ran."""
    ran = [c for c in oracle_columns(args.oracle_n) if (workload, c) in results]
    return max(ran, key=lambda c: statistics.median(rates(results[(workload, c)]))) if ran else None


def goals(
    workloads: dict[str, tuple[str, int]], results: dict[tuple[str, str], list[Result]], args: argparse.Namespace
) -> None:
    """The issue's goals per workload: auto / plain >= 0.97x, auto / oracle >= 0.9x."""
    print("\ngoals: auto / plain >= 0.97x on every workload; auto / oracle >= 0.9x (ratios within rounds, median)")
    for name in workloads:
        auto = rates(results[(name, "auto")])
        line = f"  {name:8s} auto/plain {met(auto, rates(results[(name, 'plain')]), 0.97)}"
        if best := oracle(name, results, args):
            line += f"   auto/oracle ({best}) {met(auto, rates(results[(name, best)]), 0.9)}"
        print(line)


def met(a: list[float], b: list[float], target: float) -> str:
    ratio = median_ratio(a, b)
    return f"{ratio:.3f}x {'met' if ratio >= target else 'NOT met'}"


if __name__ == "__main__":
    main()
