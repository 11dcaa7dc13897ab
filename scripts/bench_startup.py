#!/usr/bin/env python3
"""How long localrun takes to start: `--help`, `list` and `generate --help`,
each as a fresh process, median wall time over interleaved rounds.

    .venv/bin/python scripts/bench_startup.py [--reps 15] [--tree OTHER_CHECKOUT]

With --tree, the same commands from another checkout (with its own .venv) run
in the same rounds, alternating which goes first, and the ratio this/other is
printed: a change's before and after in one run. No model is loaded; the
commands run with a throwaway LOCALRUN_HOME and HF_HOME.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts._models import HelpFormatter

COMMANDS = (("--help",), ("list",), ("generate", "--help"))


def timed(python: Path, cwd: Path, args: tuple[str, ...], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run([str(python), "-m", "localrun", *args], cwd=cwd, env=env, capture_output=True, check=False)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"error: {cwd}: localrun {' '.join(args)} exited {done.returncode}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--reps", type=int, default=15, help="rounds; each figure is the median")
    ap.add_argument("--tree", type=Path, help="another checkout with its .venv, measured beside this one")
    args = ap.parse_args()
    here = Path(__file__).resolve().parent.parent
    trees = {"this": (Path(sys.executable), here)}
    if args.tree is not None:
        trees["other"] = (args.tree / ".venv" / "bin" / "python", args.tree)
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "LOCALRUN_HOME": home, "HF_HOME": str(Path(home) / "hf")}
        times: dict[tuple[str, str], list[float]] = {}
        for rep in range(args.reps):
            for command in COMMANDS:
                order = list(trees.items()) if rep % 2 == 0 else list(reversed(trees.items()))
                for name, (python, cwd) in order:
                    times.setdefault((name, " ".join(command)), []).append(timed(python, cwd, command, env))
    print(f"{args.reps} rounds, median wall time of a fresh process")
    for command in COMMANDS:
        label = " ".join(command)
        this = statistics.median(times[("this", label)])
        line = f"  localrun {label:15} this {this * 1000:5.0f} ms"
        if "other" in trees:
            other = statistics.median(times[("other", label)])
            line += f"  other {other * 1000:5.0f} ms  this/other {this / other:.2f}"
        print(line)


if __name__ == "__main__":
    main()
