"""Recurrent and hybrid models (Qwen3.5, LFM2, Nemotron-H...): two figures
side by side in one run, rounds alternating (issue goals in brackets):

- speculation's default (`--spec auto`) against `--spec none` on prose,
  decode tokens/s [>= 0.97x];
- a chat's second turn after a long first one: its prompt time (time to
  first token) with the checkpoint the first turn left, against a fresh
  context evaluating the whole history [<= 0.2x, i.e. at least 5x faster].

    .venv/bin/python scripts/bench_hybrid.py --model PATH [--rounds 3] [--history 2000]
    .venv/bin/python scripts/bench_hybrid.py --synthetic qwen35     # a tiny random-weight model
    .venv/bin/python scripts/bench_hybrid.py --synthetic qwen35-mtp --spec mtp   # with an MTP head

`--spec` (default auto) is the speculation compared with `--spec none`; the
synthetic `qwen35-mtp` carries an MTP head that often drafts right,
`qwen35-mtp-random` one that seldom does (`tests.mtpmodel`).

No real hybrid GGUF is reachable from every machine: ``--synthetic NAME``
writes one of the test suite's tiny models (`tests.hybridmodels`: the real
layer mix and tensor layout, random weights), whose figures speak of
localrun's own work around llama.cpp more than of a real model's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from localrun.events import DoneEvent, Event, Stats
from localrun.gguf.reader import read_gguf
from localrun.runtime.chat import ChatSession
from localrun.runtime.engine import Engine, Weights
from localrun.runtime.generate import generate
from localrun.runtime.prompt import chat_template
from localrun.runtime.sampling import SamplingParams
from localrun.speculative import open_speculation
from scripts._models import HelpFormatter, engine_config, model_path
from scripts._stats import ratio_summary

GREEDY = SamplingParams(temperature=0.0)
PROSE = (
    "Write a short essay on why lighthouses were built where they were, how their keepers lived, "
    "and what replaced them when the lamps became automatic."
)


def done(events: Iterable[Event]) -> Stats:
    stats = [ev.stats for ev in events if isinstance(ev, DoneEvent)]
    if not stats:
        raise RuntimeError("no done event")
    return stats[-1]


def bench_speculation(engine: Engine, rounds: int, tokens: int, spec: str = "auto") -> None:
    prompt = engine.tokenize(PROSE)
    plain_rate, auto_rate = [], []
    speculation = open_speculation(engine, spec)
    if speculation is None:
        print("speculation: off on this model (llama.cpp keeps no recurrent snapshots for it); nothing to compare")
        return
    with speculation:
        for r in range(rounds):
            plain = done(generate(engine, prompt, GREEDY, max_tokens=tokens))
            auto = done(speculation.generate(engine, prompt, GREEDY, max_tokens=tokens))
            plain_rate.append(plain.decode_tokens_per_s)
            auto_rate.append(auto.decode_tokens_per_s)
            kept = f"{auto.draft.accepted}/{auto.draft.proposed}" if auto.draft is not None else "0/0"
            print(
                f"  round {r + 1}: --spec none {plain.decode_tokens_per_s:.1f} tok/s, "
                f"{spec} {auto.decode_tokens_per_s:.1f} tok/s (drafts kept {kept})"
            )
    print(f"speculation on prose: {spec} / none = {ratio_summary(auto_rate, plain_rate)} (goal for auto >= 0.97x)")


def history_text(engine: Engine, n_tokens: int) -> str:
    words: list[str] = []
    while len(engine.tokenize(" ".join(words), add_special=False)) < n_tokens:
        words += [f"note{len(words) % 89}", "says", "the", "tide", f"rose{len(words) % 13}", "feet,"]
    return " ".join(words)


def bench_second_turn(model: Path, config_engine: Engine, rounds: int, history: int) -> None:
    template = chat_template(config_engine)
    first = history_text(config_engine, history)
    config = config_engine.config
    kept_t, fresh_t = [], []
    with Weights(model, config.placement, mtp=config.mtp) as weights:
        for r in range(rounds):
            with Engine(config, weights=weights) as engine, Engine(config, weights=weights) as other:
                session = ChatSession(engine, template, GREEDY, max_tokens=16)
                done(session.reply(session.plan(f"Read this log, then answer briefly. {first}")))
                second = done(session.reply(session.plan("What did the last note say?")))
                fresh = ChatSession(other, template, GREEDY, max_tokens=16)
                fresh.turns = list(session.turns[:-1])
                again = done(fresh.reply(fresh.plan("What did the last note say?")))
            kept_t.append(second.ttft_s)
            fresh_t.append(again.ttft_s)
            print(
                f"  round {r + 1}: turn 2's prompt {second.prompt_tokens} tokens, "
                f"{second.prompt_tokens - second.cached_tokens} evaluated: ttft {second.ttft_s * 1000:.1f} ms; "
                f"the history re-evaluated: {again.ttft_s * 1000:.1f} ms"
            )
    print(
        f"chat turn 2 with checkpoints / re-evaluated: {ratio_summary(kept_t, fresh_t)} "
        f"(goal <= 0.2x); median {statistics.median(kept_t) * 1000:.1f} vs {statistics.median(fresh_t) * 1000:.1f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="a hybrid model: a name or GGUF path")
    which.add_argument("--synthetic", help="a tiny random-weight model of this family (tests.hybridmodels)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of each comparison")
    ap.add_argument("--tokens", type=int, default=128, help="tokens generated per speculation round")
    ap.add_argument("--history", type=int, default=2000, help="the first chat turn's length in tokens")
    ap.add_argument("--spec", default="auto", choices=("auto", "lookup", "mtp"), help="the speculation compared")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.synthetic in ("qwen35-mtp", "qwen35-mtp-random"):
            from tests.mtpmodel import write_mtp_model

            model = write_mtp_model(Path(tmp) / f"{args.synthetic}.gguf", wired=args.synthetic == "qwen35-mtp")
        elif args.synthetic:
            from tests.hybridmodels import BY_NAME, write_hybrid_model

            model = write_hybrid_model(BY_NAME[args.synthetic], Path(tmp) / f"{args.synthetic}.gguf")
        else:
            model = model_path(args.model)
        info = read_gguf(model)
        with Engine(engine_config(model, ctx=str(args.history + 1024), kv="f16", draft=args.spec), info) as engine:
            print(
                f"{info.name} ({info.architecture}): memory {engine.cuts.kind}, "
                f"{engine.cuts.depth} rollback snapshots, {engine.threads} threads"
            )
            bench_speculation(engine, args.rounds, args.tokens, args.spec)
            bench_second_turn(model, engine, args.rounds, args.history)


if __name__ == "__main__":
    main()
