#!/usr/bin/env python3
"""Measure `localrun embed` on N lines against llama-server's /v1/embeddings,
on the same model and the same inputs, in one run.

    .venv/bin/python scripts/bench_embed.py MODEL --llama-server PATH/TO/llama-server
        [--lines 1000] [--rounds 3] [--threads N] [--pooling mean]

Each round runs both, alternating which goes first:
  localrun      `localrun embed -m MODEL --pooling P` as a process, the lines
                piped in, timed from start to exit (the model's load included)
  llama-server  one POST /v1/embeddings with every line as `input`, to a
                llama-server started once before the rounds with --embeddings
                --pooling P, 8 slots, -b/-ub 2048 (timed: the request alone)
A llama-server built with -march=native on another CPU dies with SIGILL;
LD_LIBRARY_PATH pointing at a directory with llama-cpp-python's
libggml-cpu.so (as libggml-cpu.so.0) runs it on the same kernels as localrun.
Printed: each side's lines/s (median and range over rounds) and
localrun/llama-server, the median of the ratios within a round; and how
alike the two sides' vectors are (cosine of each line's pair: the same
pooling and normalization give ~1.0). A decoder model (no embedding model
here) needs --pooling on both sides: mean by default.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from scripts._models import HelpFormatter, model_path
from scripts._stats import ratio_summary
from scripts.bench_serve import Server, _raw, llama_server

HERE = Path(__file__).resolve().parent.parent
WORDS = [
    "the",
    "a",
    "river",
    "light",
    "stone",
    "quiet",
    "engine",
    "market",
    "winter",
    "garden",
    "letter",
    "system",
    "north",
    "bread",
    "window",
    "music",
    "road",
    "paper",
    "early",
    "green",
    "signal",
    "harbour",
    "clock",
    "under",
    "over",
    "slowly",
    "bright",
    "memory",
    "table",
    "number",
    "open",
    "small",
    "field",
]


def lines(n: int, seed: int = 7) -> list[str]:
    """``n`` sentences of 6 to 30 words, the same on every run."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 30))) for _ in range(n)]


def run_localrun(model: Path, texts: list[str], args: argparse.Namespace) -> tuple[float, list[list[float]]]:
    cmd = [str(HERE / ".venv" / "bin" / "localrun"), "embed", "-m", str(model), "--pooling", args.pooling]
    if args.threads is not None:
        cmd += ["--threads", str(args.threads)]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, input="\n".join(texts) + "\n", capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"localrun embed failed:\n{done.stderr[-2000:]}")
    return elapsed, [json.loads(line) for line in done.stdout.splitlines()]


def run_native(server: Server, texts: list[str]) -> tuple[float, list[list[float]]]:
    body = json.dumps({"input": texts, "encoding_format": "float"}).encode()
    t0 = time.perf_counter()
    status, reply = _raw(server, "POST", "/v1/embeddings", body)
    elapsed = time.perf_counter() - t0
    if status != 200:
        raise RuntimeError(f"llama-server answered {status}: {str(reply)[:500]}")
    data = sorted(reply["data"], key=lambda d: d["index"])
    return elapsed, [d["embedding"] for d in data]


def alike(ours: list[list[float]], theirs: list[list[float]]) -> tuple[float, float]:
    """(the lowest, the median) cosine between each line's two vectors."""
    cosines = []
    for a, b in zip(ours, theirs, strict=True):
        x, y = np.asarray(a), np.asarray(b)
        cosines.append(float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y))))
    return min(cosines), statistics.median(cosines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--llama-server", type=Path, required=True, help="llama.cpp's llama-server binary")
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, help="fixed CPU threads on both sides (default: each one's own)")
    parser.add_argument("--pooling", default="mean", help="mean, cls or last, on both sides")
    args = parser.parse_args()
    model = model_path(args.model)
    texts = lines(args.lines)
    os.environ.pop("LOCALRUN_API_KEY", None)
    options = argparse.Namespace(ctx=512, threads=args.threads)
    extra = ("--embeddings", "--pooling", args.pooling, "-b", "2048", "-ub", "2048")
    ours: list[float] = []
    theirs: list[float] = []
    with llama_server(args.llama_server, model, 8, options, "auto", *extra) as server:
        for r in range(args.rounds):
            sides = [("localrun", True), ("llama-server", False)]
            for name, is_ours in sides if r % 2 == 0 else sides[::-1]:
                if is_ours:
                    elapsed, our_vectors = run_localrun(model, texts, args)
                    ours.append(len(texts) / elapsed)
                else:
                    elapsed, their_vectors = run_native(server, texts)
                    theirs.append(len(texts) / elapsed)
                print(f"round {r + 1} {name}: {len(texts) / elapsed:.1f} lines/s ({elapsed:.2f} s)", flush=True)
    low, median = alike(our_vectors, their_vectors)
    for name, rates in (("localrun embed", ours), ("llama-server", theirs)):
        print(f"{name}: {statistics.median(rates):.1f} lines/s (range {min(rates):.1f}-{max(rates):.1f})")
    print(f"localrun/llama-server: {ratio_summary(ours, theirs)}")
    print(f"cosine of the two sides' vectors per line: median {median:.5f}, lowest {low:.5f}")


if __name__ == "__main__":
    main()
