#!/usr/bin/env python3
"""KV cache cost per token, measured from llama.cpp's own buffer against localrun's prediction.

    .venv/bin/python scripts/bench_kv.py MODEL [...] [--ctx 4096] [--budget 2GiB]

For f16, q8_0 and q4_0 (K and V alike) it creates a context, reads the KV
buffer size llama.cpp reports, and prints bytes per token, the ratio to f16,
the prediction's error, and the longest context that fits in --budget
(weights + compute buffer + KV cache, with the measured figures).
With --ppl it also measures perplexity over a fixed text (default: the
reference text localrun ships, the one `localrun bench` uses; --text FILE for
another) with each KV type, in windows of --window tokens.

MODEL is any localrun model name (a registry alias such as qwen2.5-coder:1.5b,
owner/repo:QUANT, hf://owner/repo/file.gguf or a GGUF path); a registry model
is pulled on first use.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from localrun.gguf.info import KV_BYTES_PER_ELEMENT, describe
from localrun.gguf.reader import read_gguf
from localrun.runtime.engine import Engine
from localrun.runtime.perplexity import REFERENCE_TEXT
from localrun.runtime.perplexity import perplexity as measure_perplexity
from localrun.units import parse_size
from scripts._models import HelpFormatter, engine_config, model_path


def perplexity(model: Path, kv_type: str, text: str, window: int, max_tokens: int) -> tuple[float, int]:
    with Engine(engine_config(model, ctx=str(window), kv=kv_type)) as engine:
        result = measure_perplexity(engine, engine.tokenize(text)[:max_tokens], window)
    return result.value, result.tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("models", nargs="+", metavar="MODEL", help="model names or GGUF paths, each measured in turn")
    ap.add_argument("--ctx", type=int, default=4096, help="context size of the contexts created, in tokens")
    ap.add_argument("--budget", default="2GiB", help="memory budget for the longest context that fits")
    ap.add_argument("--ppl", action="store_true", help="also measure perplexity per KV type")
    ap.add_argument(
        "--text", type=Path, metavar="FILE", help="text file for --ppl (default: localrun's shipped reference text)"
    )
    ap.add_argument("--window", type=int, default=512, help="perplexity window in tokens")
    ap.add_argument("--ppl-tokens", type=int, default=3072, help="at most this many tokens of the text for --ppl")
    args = ap.parse_args()
    budget = parse_size(args.budget)
    if args.text is not None and not args.text.is_file():
        ap.error(f"no text file at {args.text}")
    text = args.text.read_text(encoding="utf-8") if args.text else REFERENCE_TEXT
    text_name = args.text.name if args.text else "the reference text"
    models = [model_path(name) for name in args.models]
    for model in models:
        info = describe(read_gguf(model))
        print(f"\n{model.name}: weights {info.weights_bytes / 2**20:.0f} MiB, budget {budget / 2**20:.0f} MiB")
        header = ("KV type", "measured B/tok", "predicted", "error", "vs f16", "fits", "vs f16")
        print("  {:8} {:>15} {:>10} {:>7} {:>7} {:>8} {:>7}".format(*header))
        base: tuple[float, int] | None = None
        for kv_type in KV_BYTES_PER_ELEMENT:
            engine = Engine(engine_config(model, ctx=str(args.ctx), kv=kv_type))
            kv_bytes, cells, compute = engine.kv_cache_bytes, engine.kv_cells, engine.compute_buffer_bytes
            engine.close()
            if not kv_bytes or not cells or compute is None:
                raise SystemExit("llama.cpp did not report its buffer sizes")
            per_token = kv_bytes / cells
            predicted = info.kv_bytes_per_token(kv_type)
            fits = int((budget - info.weights_bytes - compute) // per_token)
            base = base or (per_token, fits)
            print(
                f"  {kv_type:8} {per_token:15.0f} {predicted:10d} {predicted / per_token - 1:+7.1%} "
                f"{per_token / base[0]:6.3f}x {fits:8d} {fits / base[1]:6.2f}x"
            )
        if args.ppl:
            ppl = {t: perplexity(model, t, text, args.window, args.ppl_tokens) for t in KV_BYTES_PER_ELEMENT}
            f16 = ppl["f16"][0]
            for t, (value, n) in ppl.items():
                delta = value / f16 - 1
                print(f"  perplexity {t:5} {value:8.4f} ({delta:+.2%} vs f16) over {n} tokens of {text_name}")


if __name__ == "__main__":
    main()
