"""KV reuse figures, side by side in one run (issue goals in brackets):

- prompt cache: time to first token with a long cached prefix against the
  same prompt evaluated from scratch [<= 0.2x];
- chat: time to first token of turn 20 against turn 2, same message length [<= 1.2x].

    .venv/bin/python scripts/bench_cache.py [--model NAME] [--prefix 2000] [--reps 3] [--turns 20]

--model is any localrun model name (a registry alias, owner/repo:QUANT,
hf://owner/repo/file.gguf or a GGUF path); a registry model is pulled on
first use.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from localrun.events import DoneEvent, Stats
from localrun.runtime.chat import ChatSession
from localrun.runtime.decoder import Decoder
from localrun.runtime.engine import Engine
from localrun.runtime.generate import generate
from localrun.runtime.prompt import build_prompt, chat_template
from localrun.runtime.promptcache import PromptCache
from localrun.runtime.sampling import SamplingParams
from scripts._models import HelpFormatter, engine_config, model_path
from scripts._stats import median_ratio

GREEDY = SamplingParams(temperature=0.0)
DEFAULT_MODEL = "qwen2.5-coder:1.5b"


def material(engine: Engine, n_tokens: int) -> str:
    """Python-like source text of about ``n_tokens`` tokens."""
    lines: list[str] = []
    i = 0
    while len(engine.tokenize("\n".join(lines), add_special=False)) < n_tokens:
        lines.append(f"def handler_{i}(request, limit={i % 7}):\n    return [item for item in request.items[:limit]]\n")
        i += 1
    return "\n".join(lines)


def done(events: object) -> Stats:
    for ev in events:  # type: ignore[attr-defined]
        if isinstance(ev, DoneEvent):
            return ev.stats
    raise RuntimeError("no done event")


def bench_prompt_cache(engine: Engine, n_prefix: int, reps: int) -> None:
    text = material(engine, n_prefix)
    with tempfile.TemporaryDirectory() as tmp:
        cache = PromptCache(Path(tmp))
        warm = build_prompt(engine, "Which handler has the largest limit?", text)
        done(
            generate(
                engine,
                warm.tokens,
                GREEDY,
                max_tokens=1,
                checkpoint=cache.checkpoint(engine, warm.tokens[: warm.shared]),
            )
        )
        cold_t, hot_t = [], []
        for r in range(reps):
            prompt = build_prompt(engine, f"Question {r}: what does handler_{r} return?", text)
            cold = done(generate(engine, prompt.tokens, GREEDY, max_tokens=4, decoder=Decoder(engine)))
            checkpoint = cache.checkpoint(engine, prompt.tokens[: prompt.shared])
            hot = done(
                generate(engine, prompt.tokens, GREEDY, max_tokens=4, decoder=Decoder(engine), checkpoint=checkpoint)
            )
            assert checkpoint.outcome == "hit", checkpoint.warnings
            cold_t.append(cold.ttft_s)
            hot_t.append(hot.ttft_s)
            print(
                f"  round {r + 1}: prompt {len(prompt.tokens)} tokens, cached prefix {prompt.shared}: "
                f"ttft {cold.ttft_s:.2f}s uncached, {hot.ttft_s:.2f}s from the cache ({hot.ttft_s / cold.ttft_s:.3f}x)"
            )
        size = sum(p.stat().st_size for p in cache.entries())
    print(
        f"prompt cache: median ttft {statistics.median(hot_t):.2f}s vs {statistics.median(cold_t):.2f}s uncached = "
        f"{median_ratio(hot_t, cold_t):.3f}x (goal <= 0.2x); file {size / 2**20:.1f} MiB for {warm.shared} tokens"
    )


def bench_chat(engine: Engine, turns: int) -> None:
    session = ChatSession(
        engine, chat_template(engine), GREEDY, system="You answer in one short sentence.", max_tokens=24
    )
    ttft: list[float] = []
    evaluated: list[int] = []
    for t in range(1, turns + 1):
        plan = session.plan(f"Name one fact about the number {t + 10}.")
        stats = done(session.reply(plan))
        ttft.append(stats.ttft_s)
        evaluated.append(stats.prompt_tokens - stats.cached_tokens)
        print(
            f"  turn {t:2d}: prompt {stats.prompt_tokens:4d} tokens, "
            f"evaluated {evaluated[-1]:3d}, ttft {stats.ttft_s:.3f}s"
        )
    later = statistics.median(ttft[-3:])
    print(
        f"chat: ttft turn {turns} {ttft[-1]:.3f}s vs turn 2 {ttft[1]:.3f}s = {ttft[-1] / ttft[1]:.2f}x "
        f"(median of the last 3 turns {later / ttft[1]:.2f}x; goal <= 1.2x); "
        f"tokens evaluated per turn after the first: {min(evaluated[1:])}-{max(evaluated[1:])}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL, help="model name or GGUF path")
    ap.add_argument("--prefix", type=int, default=2000, help="cached prefix length in tokens")
    ap.add_argument("--reps", type=int, default=3, help="prompt cache rounds (uncached, then from the cache)")
    ap.add_argument("--turns", type=int, default=20, help="chat turns")
    ap.add_argument("--ctx", type=int, default=4096, help="context size in tokens")
    args = ap.parse_args()
    model = model_path(args.model)
    with Engine(engine_config(model, ctx=str(args.ctx), kv="f16")) as engine:
        print(f"{engine.info.name}, context {engine.n_ctx}, KV f16")
        bench_prompt_cache(engine, args.prefix, args.reps)
        bench_chat(engine, args.turns)


if __name__ == "__main__":
    main()
