#!/usr/bin/env python3
"""Fuzz the GGUF model-file check: the long run of tests/gguf/test_fuzz.py.

    .venv/bin/python scripts/fuzz_gguf.py [--inputs 100000] [--seconds S] [--workers N] [--seed 0] [--out fuzz-crashes]

Each input is a mutant of a real tiny GGUF (tests/gguf/mutate.py: truncations
at structure boundaries, flipped bytes, huge counts and lengths, odd tensor
offsets and shapes, unknown types, alignment values, duplicate keys, deep
arrays). The property: `read_gguf` accepts it or refuses it with
`BadModelError`, within 2 s and 16 MiB of Python allocations; an accepted one,
llama.cpp (in a child process) loads or refuses cleanly: a child killed by a
signal is a crash, one that does not answer is a hang. Every violation, crash
and hang is saved under --out as INPUT.gguf with INPUT.txt (what was done, what
happened); input I is reproducible alone with --seed and --first I --inputs 1.
Exits 1 when there was any.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.gguf.loadcheck import PropertyViolation, check_file, load_all
from tests.gguf.mutate import Layout, mutate, parse
from tests.tinymodel import write_tiny_model

CHUNK = 100  # inputs per task; the accepted ones of a chunk load in one llama.cpp child
CHECK_TIMEOUT = 10  # seconds for one in-process check before it counts as a hang
LOAD_TIMEOUT = 120  # seconds for a chunk's loads

_SEEDS: list[tuple[bytes, Layout]] = []
_OUT = Path()


class _Hang(BaseException):  # not caught by the check's `except Exception`
    pass


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise _Hang


def _init(seed_files: list[Path], out: Path) -> None:
    global _OUT
    _OUT = out
    for path in seed_files:
        data = path.read_bytes()
        _SEEDS.append((data, parse(data)))
    signal.signal(signal.SIGALRM, _alarm)


def _save(index: int, kind: str, mutant: bytes, names: list[str], detail: str) -> None:
    _OUT.mkdir(parents=True, exist_ok=True)
    (_OUT / f"{index}.gguf").write_bytes(mutant)
    (_OUT / f"{index}.txt").write_text(f"input {index}: {kind}\nmutations: {' '.join(names)}\n{detail}\n")


def _inputs(base_seed: int, index: int) -> tuple[list[str], bytes]:
    rng = random.Random(base_seed * 1_000_003 + index)
    data, layout = _SEEDS[rng.randrange(len(_SEEDS))]
    return mutate(data, layout, rng)


def _run_chunk(base_seed: int, first: int, count: int) -> Counter[str]:
    """Counts for inputs ``first`` .. ``first + count``: keys are OUTCOME and MUTATION:OUTCOME."""
    counts: Counter[str] = Counter()
    work = Path(tempfile.mkdtemp(prefix="fuzz-gguf-"))
    accepted: dict[Path, tuple[int, list[str], bytes]] = {}
    try:
        for index in range(first, first + count):
            names, mutant = _inputs(base_seed, index)
            path = work / f"{index}.gguf"
            path.write_bytes(mutant)
            signal.alarm(CHECK_TIMEOUT)
            try:
                ok = check_file(path)
                outcome = "accepted" if ok else "refused"
            except PropertyViolation as exc:
                outcome = "violation"
                _save(index, outcome, mutant, names, str(exc))
            except _Hang:
                outcome = "check hang"
                _save(index, outcome, mutant, names, f"no answer in {CHECK_TIMEOUT} s")
            finally:
                signal.alarm(0)
            counts[outcome] += 1
            counts[f"{names[0]}:{outcome}"] += 1
            if outcome == "accepted":
                accepted[path] = (index, names, mutant)
            else:
                path.unlink()
        for result in load_all(list(accepted), timeout=LOAD_TIMEOUT):
            index, names, mutant = accepted[result.path]
            outcome = {"ok": "loaded", "refused": "llama.cpp refused"}.get(result.result, result.result)
            counts[outcome] += 1
            counts[f"{names[0]}:{outcome}"] += 1
            if result.result in ("crash", "hang"):
                _save(index, result.result, mutant, names, result.detail)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return counts


COLUMNS = ["inputs", "refused", "accepted", "loaded", "llama.cpp refused", "violation", "check hang", "crash", "hang"]


def _table(counts: Counter[str], mutations: list[str], elapsed: float) -> str:
    def row(label: str, prefix: str) -> str:
        values = {c: counts[prefix + c] for c in COLUMNS[1:]}
        total = values["refused"] + values["accepted"] + values["violation"] + values["check hang"]
        return f"{label:<22}" + "".join(
            f"{v:>{max(len(c), 7) + 2}}" for c, v in zip(COLUMNS, [total, *values.values()], strict=True)
        )

    header = f"{'first mutation':<22}" + "".join(f"{c:>{max(len(c), 7) + 2}}" for c in COLUMNS)
    lines = [header, "-" * len(header)]
    lines += [row(name, f"{name}:") for name in mutations]
    lines += ["-" * len(header), row("all", ""), f"{elapsed:.0f} s"]
    return "\n".join(lines)


def main() -> int:
    from tests.gguf.mutate import MUTATIONS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--inputs", type=int, default=None, help="how many inputs (default 100000, or no limit with --seconds)"
    )
    parser.add_argument("--seconds", type=float, default=None, help="stop starting new inputs after this long")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=0, help="input I is the same for the same seed")
    parser.add_argument("--first", type=int, default=0, help="the first input's number (to rerun one)")
    parser.add_argument("--out", type=Path, default=Path("fuzz-crashes"), help="where failing inputs are saved")
    args = parser.parse_args()
    limit = args.inputs if args.inputs is not None else (None if args.seconds else 100_000)

    seeds_dir = Path(tempfile.mkdtemp(prefix="fuzz-gguf-seeds-"))
    seed_files = [
        write_tiny_model(seeds_dir / "tiny.gguf"),
        write_tiny_model(seeds_dir / "plain.gguf", chat_template=None, n_layer=1, n_ctx_train=32768),
        write_tiny_model(seeds_dir / "wide.gguf", n_embd=128, n_head=8, n_head_kv=8, n_ff=64, seed=1),
    ]
    counts: Counter[str] = Counter()
    start = time.monotonic()
    next_input = args.first
    end = None if limit is None else args.first + limit
    try:
        with ProcessPoolExecutor(args.workers, initializer=_init, initargs=(seed_files, args.out.resolve())) as pool:
            running: set[Future[Counter[str]]] = set()
            last_report = start
            while True:
                out_of_time = args.seconds is not None and time.monotonic() - start > args.seconds
                while not out_of_time and len(running) < 2 * args.workers and (end is None or next_input < end):
                    count = CHUNK if end is None else min(CHUNK, end - next_input)
                    running.add(pool.submit(_run_chunk, args.seed, next_input, count))
                    next_input += count
                if not running:
                    break
                done, running = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    counts += future.result()
                if time.monotonic() - last_report > 30:
                    last_report = time.monotonic()
                    n = counts["refused"] + counts["accepted"] + counts["violation"] + counts["check hang"]
                    bad = counts["violation"] + counts["check hang"] + counts["crash"] + counts["hang"]
                    print(f"{n} inputs, {bad} failing, {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(seeds_dir, ignore_errors=True)
    print(_table(counts, list(MUTATIONS), time.monotonic() - start))
    failing = counts["violation"] + counts["check hang"] + counts["crash"] + counts["hang"]
    if failing:
        print(f"{failing} failing inputs saved in {args.out}/")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
