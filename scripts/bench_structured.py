#!/usr/bin/env python3
"""Measure structured output side by side with free text, in one run.

    .venv/bin/python scripts/bench_structured.py [MODEL] [--draft MODEL] [--rounds 2] [--seeds 20] [--tokens 256]

Five extraction workloads of different shapes (fields from a paragraph,
records from a table, a label from an enum, a nested object, a long array of
objects with repeated keys), each run greedy:

  free     the same prompt, unconstrained (localrun's plain loop)
  schema   with the workload's JSON Schema (`--schema`: llguidance's mask at
           every step, jump-forward over forced tokens)
  schema+auto  with --draft: the same with `--spec auto` (prompt lookup and the
           draft model, drafts cut where the grammar rejects them, verify rows masked)

It prints decode tokens/sec (the median of --rounds interleaved rounds), the
ratio schema / free within each round, the share of tokens the grammar forced,
and the mask's cost: microseconds per masked step (filling the bitmask and
applying it to the logits of the model's vocabulary) against a plain step.
Then validity: each workload at temperature 0.8 with --seeds seeds, every
output parsed and validated against its schema.

Not yet here: a column for llama.cpp's `--json-schema`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from localrun.events import DoneEvent, Stats, TokenEvent
from localrun.runtime.decoder import Decoder
from localrun.runtime.engine import Engine, EngineConfig
from localrun.runtime.generate import PLAIN, Decoding
from localrun.runtime.prompt import prompt_tokens
from localrun.runtime.sampling import SamplingParams
from localrun.speculative import open_speculation
from localrun.structured.constraint import Constraint
from localrun.structured.spec import OutputSpec, schema_spec
from scripts._models import HelpFormatter, model_path
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


def run(
    engine: Engine,
    decoder: Decoder,
    tokens: list[int],
    sampling: SamplingParams,
    n: int,
    spec: OutputSpec | None,
    draft: Path | None = None,
) -> tuple[str, Stats]:
    """One output; with ``draft``, speculatively (`--spec auto` with that draft model)."""
    constraint = Constraint(engine, spec) if spec is not None else None
    speculation = open_speculation(engine, "auto", draft) if draft is not None else None
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


def mask_cost_us(engine: Engine, decoder: Decoder, tokens: list[int], spec: OutputSpec, steps: int = 50) -> float:
    """Microseconds per mask (fill the bitmask, apply it) on the logits of a real step."""
    decoder.prefill(tokens)
    row = decoder.logits(-1)
    constraint = Constraint(engine, spec)
    t0 = time.perf_counter()
    for _ in range(steps):
        constraint.apply(row)
    return (time.perf_counter() - t0) / steps * 1e6


def print_speeds(rates: dict[tuple[str, str], list[float]], columns: tuple[str, ...], forced: dict[str, float]) -> None:
    """Each workload's median rate per column, the share forced, and the ratios to free text."""
    print(f"{'workload':9} " + " ".join(f"{c:>11}" for c in columns) + "  forced  ratios to free")
    ratios: dict[str, list[float]] = {}
    for name in WORKLOADS:
        free = rates[name, "free"]
        cells, notes = [], []
        for column in columns:
            cells.append(f"{statistics.median(rates[name, column]):11.2f}")
            if column != "free":
                ratios.setdefault(column, []).append(
                    statistics.median(a / b for a, b in zip(rates[name, column], free, strict=True))
                )
                notes.append(f"{column} {ratio_summary(rates[name, column], free)}")
        print(f"{name:9} {' '.join(cells)}  {forced.get(name, 0.0):5.0%}  {'; '.join(notes)}")
    for column, values in ratios.items():
        print(f"median workload: {column}/free {statistics.median(values):.3f}x")


def validity(
    engine: Engine,
    decoder: Decoder,
    prompts: dict[str, list[int]],
    specs: dict[str, OutputSpec],
    seeds: int,
    tokens: int,
) -> tuple[int, int]:
    """(valid, in all): every workload at temperature 0.8 with each seed."""
    valid = total = 0
    for name in WORKLOADS:
        for seed in range(seeds):
            hot = SamplingParams(temperature=0.8, seed=seed)
            _text, stats = run(engine, decoder, prompts[name], hot, tokens, specs[name])
            total += 1
            valid += bool(stats.valid)
            if not stats.valid:
                print(f"  {name} seed {seed}: not valid ({stats.invalid}; stop {stats.stop_reason})")
    return valid, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("model", nargs="?", default="qwen2.5-coder:1.5b", help="model name or GGUF path")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the speed comparison")
    ap.add_argument("--seeds", type=int, default=20, help="seeds per workload for the validity check (t 0.8)")
    ap.add_argument("--tokens", type=int, default=256, help="tokens at most per output")
    ap.add_argument("--draft", help="a draft model: adds the column schema+auto (`--schema --spec auto`)")
    args = ap.parse_args()
    draft = model_path(args.draft) if args.draft else None
    columns = ("free", "schema", "schema+auto") if draft else ("free", "schema")
    engine = Engine(EngineConfig(model_path=model_path(args.model), n_ctx=2048))
    decoder = Decoder(engine)
    greedy = SamplingParams(temperature=0.0)
    specs = {name: schema_spec(schema, name) for name, (_, schema) in WORKLOADS.items()}
    prompts = {name: prompt_tokens(engine, text) for name, (text, _) in WORKLOADS.items()}
    rates: dict[tuple[str, str], list[float]] = {}
    forced: dict[str, float] = {}
    print(f"{engine.info.path.name}, {engine.n_vocab} tokens in the vocabulary, greedy, {args.rounds} round(s)")
    for r in range(args.rounds):
        for name in WORKLOADS:
            k = (r + len(rates)) % len(columns)
            for column in columns[k:] + columns[:k]:
                spec = specs[name] if column != "free" else None
                spec_draft = draft if column == "schema+auto" else None
                _text, stats = run(engine, decoder, prompts[name], greedy, args.tokens, spec, spec_draft)
                rates.setdefault((name, column), []).append(stats.decode_tokens_per_s)
                if column == "schema" and stats.generated_tokens:
                    forced[name] = (stats.forced_tokens or 0) / stats.generated_tokens
    print_speeds(rates, columns, forced)
    plain_us = 1e6 / statistics.median(rates["label", "free"])
    mask_us = statistics.median(mask_cost_us(engine, decoder, prompts[n], specs[n]) for n in WORKLOADS)
    print(f"mask: {mask_us:.0f} us per step on {engine.n_vocab} tokens, {mask_us / plain_us:.1%} of a plain step")
    valid, total = validity(engine, decoder, prompts, specs, args.seeds, args.tokens)
    print(f"validity at temperature 0.8: {valid}/{total} outputs parse and validate")


if __name__ == "__main__":
    main()
