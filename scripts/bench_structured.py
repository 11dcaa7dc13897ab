#!/usr/bin/env python3
"""Measure structured output side by side with free text, in one run.

    .venv/bin/python scripts/bench_structured.py [MODEL] [--draft MODEL]
        [--native PATH/TO/llama-completion] [--rounds 2] [--seeds 20] [--tokens 256]

Five extraction workloads of different shapes (fields from a paragraph,
records from a table, a label from an enum, a nested object, a long array of
objects with repeated keys), each run greedy, with the model's chat template:

  free         the same prompt, unconstrained (localrun's plain loop)
  schema       with the workload's JSON Schema (`--schema`: llguidance's mask
               at every step, jump-forward over forced tokens)
  schema+auto  with --draft: the same with `--spec auto` (prompt lookup and
               the draft model, which drafts under the mask; forced tokens ride
               in the verify batch ahead of the draft)
  llama.cpp    with --native: llama.cpp's `llama-completion --json-schema`, the
               same rendered prompt, localrun's thread count, its other
               defaults; its decode rate counts its sampling (where its grammar
               works), as localrun's counts the mask

It prints decode tokens/sec (the median of --rounds interleaved rounds), the
ratio of each column to free text (and schema+auto to llama.cpp) within each
round, the share of tokens the grammar forced, and the mask's cost:
microseconds per masked step (filling the bitmask and applying it to the
logits of the model's vocabulary) against a plain step. Every constrained
output of the rounds is validated too. Then validity at temperature 0.8:
each workload with --seeds seeds (localrun, --schema) and --native-seeds
seeds (llama.cpp), every output parsed and validated against its schema,
with --validity-tokens tokens at most.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jsonschema

from localrun.events import DoneEvent, Stats, TokenEvent
from localrun.openmp import others_environ
from localrun.runtime.decoder import Decoder
from localrun.runtime.engine import Engine
from localrun.runtime.generate import PLAIN, Decoding
from localrun.runtime.prompt import chat_template, render_messages, tokenize_rendered
from localrun.runtime.sampling import SamplingParams
from localrun.speculative import open_speculation
from localrun.structured.constraint import Constraint
from localrun.structured.spec import OutputSpec, schema_spec
from scripts._models import HelpFormatter, model_path, tuned_engine
from scripts._native import timings
from scripts._stats import ratio_summary

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}},
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
WORKLOADS: dict[str, tuple[str, dict[str, Any]]] = {
    "fields": (
        "Extract the person's name, age and city as JSON.\n\nMaria Lopez, who turned 41 last spring, "
        "moved from Seville to Lyon in 2019 to run a bakery near the old town.",
        PERSON,
    ),
    "table": (
        "Turn this table into a JSON object with a 'rows' list.\n\n| name | age | city |\n| Ana | 31 | Porto |\n"
        "| Ben | 45 | Leeds |\n| Chloe | 28 | Ghent |\n| Dev | 52 | Pune |",
        {
            "type": "object",
            "properties": {"rows": {"type": "array", "items": PERSON}},
            "required": ["rows"],
            "additionalProperties": False,
        },
    ),
    "label": (
        "Classify the sentiment of this review as JSON with a 'label'.\n\nThe battery died after two days "
        "and support never answered my emails.",
        {
            "type": "object",
            "properties": {"label": {"enum": ["positive", "negative", "neutral", "mixed"]}},
            "required": ["label"],
            "additionalProperties": False,
        },
    ),
    "nested": (
        "Describe this order as JSON with a customer object and an items list.\n\nOrder 7781: Jane Smith "
        "(jane@example.org, 12 Elm Road, Bristol) bought 2 lamps at 19.99 and 1 desk at 149.00.",
        {
            "type": "object",
            "properties": {
                "order": {"type": "integer"},
                "customer": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "email": {"type": "string"},
                        "address": {
                            "type": "object",
                            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
                            "required": ["street", "city"],
                            "additionalProperties": False,
                        },
                    },
                    "required": ["name", "email", "address"],
                    "additionalProperties": False,
                },
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "product": {"type": "string"},
                            "quantity": {"type": "integer"},
                            "price": {"type": "number"},
                        },
                        "required": ["product", "quantity", "price"],
                        "additionalProperties": False,
                    },
                },
            },
            "required": ["order", "customer", "items"],
            "additionalProperties": False,
        },
    ),
    "array": (
        "List the first twelve chemical elements as JSON: a list of objects with number, symbol and name.",
        {
            "type": "array",
            "maxItems": 12,
            "items": {
                "type": "object",
                "properties": {
                    "number": {"type": "integer"},
                    "symbol": {"type": "string"},
                    "name": {"type": "string"},
                },
                "required": ["number", "symbol", "name"],
                "additionalProperties": False,
            },
        },
    ),
}


def valid(text: str, schema: dict[str, Any]) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def run(
    engine: Engine,
    decoder: Decoder,
    tokens: list[int],
    sampling: SamplingParams,
    n: int,
    spec: OutputSpec | None,
    draft: Path | None = None,
    curve: tuple[float, ...] | None = None,
) -> tuple[str, Stats]:
    """One output; with ``draft``, speculatively (`--spec auto` with that draft
    model, the controller starting from the verify ``curve`` tuned here)."""
    constraint = Constraint(engine, spec) if spec is not None else None
    speculation = open_speculation(engine, "auto", draft, curve) if draft is not None else None
    decoding: Decoding = speculation or PLAIN
    text, stats = "", None
    events = decoding.generate(engine, tokens, sampling, max_tokens=n, decoder=decoder, constraint=constraint)
    for ev in events:
        if isinstance(ev, TokenEvent):
            text += ev.text
        elif isinstance(ev, DoneEvent):
            stats = ev.stats
    if speculation is not None:
        speculation.close()
    assert stats is not None
    return text, stats


class Native:
    """llama-completion --json-schema on one rendered prompt per workload."""

    def __init__(self, binary: str, model: Path, threads: int, prompts: dict[str, str]) -> None:
        self.binary, self.model, self.threads = binary, model, threads
        self.dir = tempfile.TemporaryDirectory()
        self.files: dict[str, Path] = {}
        for name, text in prompts.items():
            self.files[name] = Path(self.dir.name) / f"{name}.txt"
            self.files[name].write_text(text, encoding="utf-8")

    def run(self, name: str, schema: dict[str, Any], n: int, temperature: float, seed: int = 0) -> tuple[str, float]:
        """(the text, decode tokens/sec)."""
        cmd = [self.binary, "-m", str(self.model), "-f", str(self.files[name]), "-n", str(n), "-c", "2048"]
        cmd += ["-t", str(self.threads), "--temp", str(temperature), "--seed", str(seed), "-no-cnv"]
        cmd += ["--no-display-prompt", "--no-warmup", "--json-schema", json.dumps(schema)]
        out = subprocess.run(
            cmd, capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL, env=others_environ()
        )
        text = out.stdout.rstrip("\n").removesuffix(" [end of text]")
        return text, timings(out.stderr).decode_per_s


def mask_cost_us(engine: Engine, decoder: Decoder, tokens: list[int], spec: OutputSpec, steps: int = 50) -> float:
    """Microseconds per mask (fill the bitmask, apply it) on the logits of a real step."""
    decoder.prefill(tokens)
    row = decoder.logits(-1)
    constraint = Constraint(engine, spec)
    t0 = time.perf_counter()
    for _ in range(steps):
        constraint.apply(row)
    return (time.perf_counter() - t0) / steps * 1e6


def print_speeds(
    rates: dict[tuple[str, str], list[float]], columns: tuple[str, ...], forced: dict[str, float]
) -> dict[str, list[float]]:
    """Each workload's median rate per column, the share forced, and the ratios
    to free text (and schema+auto to llama.cpp); returns the ratios by column."""
    pairs = [(c, "free") for c in columns if c != "free"]
    if "schema+auto" in columns and "llama.cpp" in columns:
        pairs.append(("schema+auto", "llama.cpp"))
    print(f"{'workload':9} " + " ".join(f"{c:>11}" for c in columns) + "  forced  ratios within a round")
    ratios: dict[str, list[float]] = {}
    for name in WORKLOADS:
        cells = [f"{statistics.median(rates[name, column]):11.2f}" for column in columns]
        notes = []
        for a, b in pairs:
            ratios.setdefault(f"{a}/{b}", []).append(
                statistics.median(x / y for x, y in zip(rates[name, a], rates[name, b], strict=True))
            )
            notes.append(f"{a}/{b} {ratio_summary(rates[name, a], rates[name, b])}")
        print(f"{name:9} {' '.join(cells)}  {forced.get(name, 0.0):5.0%}  {'; '.join(notes)}")
    for pair, values in ratios.items():
        print(f"median workload: {pair} {statistics.median(values):.3f}x")
    return ratios


def speed_rounds(
    args: argparse.Namespace,
    columns: tuple[str, ...],
    engine: Engine,
    decoder: Decoder,
    prompts: dict[str, list[int]],
    specs: dict[str, OutputSpec],
    draft: Path | None,
    native: Native | None,
    curve: tuple[float, ...] | None,
) -> tuple[dict[tuple[str, str], list[float]], dict[str, float], list[str]]:
    """Greedy rounds, every column on every workload in rotating order: the
    rates, the share of tokens forced (schema column), and the outputs not valid."""
    rates: dict[tuple[str, str], list[float]] = {}
    forced: dict[str, float] = {}
    invalid: list[str] = []
    greedy = SamplingParams(temperature=0.0)
    for r in range(args.rounds):
        for name, (_, schema) in WORKLOADS.items():
            k = (r + len(rates)) % len(columns)
            for column in columns[k:] + columns[:k]:
                if column == "llama.cpp":
                    assert native is not None
                    text, rate = native.run(name, schema, args.tokens, 0.0)
                else:
                    spec = specs[name] if column != "free" else None
                    spec_draft = draft if column == "schema+auto" else None
                    text, stats = run(engine, decoder, prompts[name], greedy, args.tokens, spec, spec_draft, curve)
                    rate = stats.decode_tokens_per_s
                    if column == "schema" and stats.generated_tokens:
                        forced[name] = (stats.forced_tokens or 0) / stats.generated_tokens
                rates.setdefault((name, column), []).append(rate)
                if column != "free" and not valid(text, schema):
                    invalid.append(f"{name} {column} round {r + 1}: {text[-80:]!r}")
    return rates, forced, invalid


def validity(check: Callable[[str, int], bool], seeds: int, label: str) -> None:
    """Every workload with each seed: how many outputs parse and validate."""
    good = total = 0
    for name in WORKLOADS:
        for seed in range(seeds):
            total += 1
            good += check(name, seed)
    print(f"validity at temperature 0.8, {label}: {good}/{total} outputs parse and validate")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("model", nargs="?", default="qwen2.5-coder:1.5b", help="model name or GGUF path")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the speed comparison (0: none)")
    ap.add_argument("--seeds", type=int, default=20, help="seeds per workload for localrun's validity (t 0.8)")
    ap.add_argument("--native-seeds", type=int, default=20, help="seeds per workload for llama.cpp's validity")
    ap.add_argument("--tokens", type=int, default=256, help="tokens at most per output of the speed rounds")
    ap.add_argument("--validity-tokens", type=int, default=512, help="tokens at most per output of the validity runs")
    ap.add_argument("--draft", help="a draft model: adds the column schema+auto (`--schema --spec auto`)")
    ap.add_argument("--native", help="llama.cpp's llama-completion binary: adds the column llama.cpp")
    args = ap.parse_args()
    draft = model_path(args.draft) if args.draft else None
    columns = ("free", "schema") + (("schema+auto",) if draft else ()) + (("llama.cpp",) if args.native else ())
    path = model_path(args.model)
    engine, curve = tuned_engine(path, None, 2048)  # as `localrun generate` runs it here
    decoder = Decoder(engine)
    specs = {name: schema_spec(schema, name) for name, (_, schema) in WORKLOADS.items()}
    template = chat_template(engine)
    rendered = {
        name: render_messages(engine, template, [{"role": "user", "content": text}])
        for name, (text, _) in WORKLOADS.items()
    }
    prompts = {name: tokenize_rendered(engine, text) for name, text in rendered.items()}
    native = Native(args.native, path, engine.threads, rendered) if args.native else None
    tuned = "the verify curve tuned here" if curve else "no tuned verify curve"
    print(f"{path.name}, {engine.n_vocab} tokens in the vocabulary, {engine.threads} threads, greedy, {tuned}")
    if args.rounds > 0:
        rates, forced, invalid = speed_rounds(args, columns, engine, decoder, prompts, specs, draft, native, curve)
        print_speeds(rates, columns, forced)
        for line in invalid:
            print(f"  not valid: {line}")
        plain_us = 1e6 / statistics.median(statistics.median(rates[name, "free"]) for name in WORKLOADS)
        mask_us = statistics.median(mask_cost_us(engine, decoder, prompts[n], specs[n]) for n in WORKLOADS)
        print(f"mask: {mask_us:.0f} us per step on {engine.n_vocab} tokens, {mask_us / plain_us:.1%} of a plain step")

    def ours(name: str, seed: int) -> bool:
        hot = SamplingParams(temperature=0.8, seed=seed)
        text, stats = run(engine, decoder, prompts[name], hot, args.validity_tokens, specs[name])
        if not (stats.valid and valid(text, WORKLOADS[name][1])):
            print(f"  {name} seed {seed}: not valid ({stats.invalid}; stop {stats.stop_reason})")
            return False
        return True

    validity(ours, args.seeds, "localrun --schema")
    if native is not None:

        def theirs(name: str, seed: int) -> bool:
            text, _ = native.run(name, WORKLOADS[name][1], args.validity_tokens, 0.8, seed)
            return valid(text, WORKLOADS[name][1])

        validity(theirs, args.native_seeds, "llama-completion --json-schema")


if __name__ == "__main__":
    main()
