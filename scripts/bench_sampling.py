#!/usr/bin/env python3
"""Where several sequences decoding together should sample: on the host, as
localrun's batch scheduler (`--batch`, serve's slots) does, or in llama.cpp's
graph (its backend samplers), measured side by side in one run.

    .venv/bin/python scripts/bench_sampling.py MODEL [--sequences 1,8,32]
        [--steps 96] [--turns 4] [--rounds 3] [--threads N] [--flash-attn on]
        [--gpu-layers auto] [--json]

For each count of sequences N, each round runs N sequences through the batch
scheduler (`ContinuousBatch`, as `--batch` and serve's slots run them), one
token each per step, `--steps` steps, twice, in alternating order, on a
fresh context each (N sequences, their own cells); each sequence runs
`--turns` requests one after another, so requests start and end as a
server's do:

  host      the engine samples on the host (`--sample-on host`): each row's
            logits read by localrun's `Sampler` (top-k's candidates found on
            the row, llama.cpp's chain applied to them);
  in-graph  the engine samples on the device (`--sample-on device`): each
            request's chain attached to its sequence and run inside
            llama.cpp's decode, its token read back.

The sampling is llama.cpp's default chain (top-k 40, top-p 0.95, min-p 0.05,
temperature 0.8), seeded. Timed: a step of the scheduler (its decode, its
N samples, their text), the mean over the steps after the first 8 (the
steps where requests start included: there each new chain is attached,
and llama.cpp reserves its graphs again).
Printed per N: each side's ms a step (median over rounds) and in-graph /
host speed, the median of the ratios within a round with its range (above
1: the in-graph sampler is faster);
with --json, one JSON object per count instead (scripts/bench_gpu.py reads
them). The model is placed as `localrun generate` places it (--gpu-layers:
all on a GPU where one is found and it fits, by default).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from localrun.runtime.batch.scheduler import BatchRequest, ContinuousBatch
from localrun.runtime.engine import Engine
from localrun.runtime.llama import DecodeStatus
from localrun.runtime.sampling import SamplingParams
from scripts._models import HelpFormatter, engine_config, model_path
from scripts._stats import median_ratio, ratio_summary

WARM_STEPS = 8  # steps left out of the mean: the first graphs are built and the caches filled


def step_ms(model: Path, args: argparse.Namespace, sequences: int, in_graph: bool) -> float:
    """The mean time of one step (decode and sample) of ``sequences``
    sequences through the batch scheduler, in ms: the requests' turns
    included (where the graph samples, each request's chain is attached and
    detached, and llama.cpp reserves its graphs again)."""
    n_ctx = sequences * (args.steps + 64)
    options = {"ctx": str(n_ctx), "threads": args.threads, "flash_attn": args.flash_attn, "gpu_layers": args.gpu_layers}
    config = engine_config(model, **options)
    where = "device" if in_graph else "host"
    engine = Engine(replace(config, n_seq_max=sequences, kv_unified=True, sample_on=where))
    params = SamplingParams(seed=args.seed)
    run = ContinuousBatch(engine, sequences, args.steps + 64)
    each = args.steps // args.turns
    try:
        for turn in range(args.turns):  # one-token prompts: every step decodes a token per sequence
            for seq in range(sequences):
                run.submit(BatchRequest(turn * sequences + seq, [1 + seq], params, max_tokens=each, ignore_eos=True))
        times = []
        while run.busy:
            start = time.perf_counter()
            status, _ = run.step()
            times.append(time.perf_counter() - start)
            if status != DecodeStatus.OK:
                sys.exit(f"error: llama.cpp could not decode step {len(times)} of {sequences} sequences")
            if any(s is not None and s.sampler.on_device != in_graph for s in run.slots):
                sys.exit(f"error: llama.cpp did not attach a sampler chain to each of {sequences} sequences")
        return statistics.fmean(times[WARM_STEPS:]) * 1000
    finally:
        run.close()
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("model", help="a model name or GGUF path")
    parser.add_argument("--sequences", default="1,8,32", help="counts of sequences decoding together, comma-separated")
    parser.add_argument("--steps", type=int, default=96, help="steps each side decodes in a round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per count")
    parser.add_argument("--turns", type=int, default=4, help="requests each sequence runs, one after another")
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp's threads (default: localrun's choice)")
    parser.add_argument("--flash-attn", default="on", choices=("auto", "on", "off"), help="flash attention, both sides")
    parser.add_argument("--seed", type=int, default=1, help="the samplers' seed")
    parser.add_argument("--gpu-layers", default=None, help="layers on a GPU: auto, all, N, or 0 for the CPU")
    parser.add_argument("--json", action="store_true", help="one JSON object per count of sequences")
    args = parser.parse_args()
    if args.steps <= WARM_STEPS:
        parser.error(f"--steps must be more than {WARM_STEPS}")
    if not 1 <= args.turns <= args.steps // 2:
        parser.error("--turns must be from 1 to half of --steps")
    try:
        counts = [int(n) for n in args.sequences.split(",")]
    except ValueError:
        parser.error(f"--sequences takes counts such as 1,8,32, not {args.sequences!r}")
    if any(n < 1 for n in counts):
        parser.error("--sequences takes counts of at least 1")
    model = model_path(args.model)
    if not args.json:
        print(f"{model.name}: {args.steps} steps, flash attention {args.flash_attn}, {args.rounds} rounds", flush=True)
    for n in counts:
        host: list[float] = []
        graph: list[float] = []
        for round_ in range(args.rounds):
            order = (False, True) if round_ % 2 == 0 else (True, False)
            for in_graph in order:
                (graph if in_graph else host).append(step_ms(model, args, n, in_graph))
        if args.json:
            ms = {"host_ms": host, "in_graph_ms": graph}
            print(json.dumps({"sequences": n, **ms, "ratio": median_ratio(host, graph)}), flush=True)
            continue
        speed = ratio_summary(host, graph)  # in-graph speed / host speed: host time / in-graph time
        print(
            f"{n:>3} sequences: host {statistics.median(host):.2f} ms a step, "
            f"in-graph {statistics.median(graph):.2f} ms; in-graph / host speed {speed}",
            flush=True,
        )


if __name__ == "__main__":
    main()
