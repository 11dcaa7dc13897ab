"""Fuzz the GGUF check with mutants of a real tiny model (tests/gguf/mutate.py).

Property: `read_gguf` accepts a file or refuses it with `BadModelError`, in
bounded time and memory; a file it accepts, llama.cpp loads or refuses cleanly,
never crashing (loaded in a child process). A derandomized hypothesis run,
and a 60-second run of scripts/fuzz_gguf.py (the long-run script) on a fresh
seed each time, printed so that a failure can be replayed.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gguf.loadcheck import check_file, load_all
from tests.gguf.mutate import MUTATIONS, mutate, parse

pytestmark = pytest.mark.timeout(300)

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fuzz_gguf.py"


@pytest.mark.slow
def test_check_accepts_or_refuses(tiny_model: Path, tmp_path: Path) -> None:
    data = tiny_model.read_bytes()
    layout = parse(data)
    path = tmp_path / "mutant.gguf"
    accepted: list[Path] = []
    seen: set[str] = set()

    @settings(
        max_examples=6000,
        deadline=5000,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.randoms(use_true_random=False))
    def check(rng: random.Random) -> None:
        names, mutant = mutate(data, layout, rng)
        seen.add(names[0])
        path.write_bytes(mutant)
        if check_file(path) and len(accepted) < 40:
            keep = tmp_path / f"accepted-{len(accepted)}.gguf"
            keep.write_bytes(mutant)
            accepted.append(keep)

    check()
    assert seen == set(MUTATIONS)
    outcomes = load_all(accepted, timeout=120)
    assert [(o.path.name, o.result, o.detail) for o in outcomes if o.result not in ("ok", "refused")] == []


def test_seeded_mutants_load_or_are_refused(tiny_model: Path, tmp_path: Path) -> None:
    """The accepted mutants of 400 seeds, each loaded by llama.cpp in a child."""
    data = tiny_model.read_bytes()
    layout = parse(data)
    accepted = []
    for seed in range(400):
        _, mutant = mutate(data, layout, random.Random(seed))
        path = tmp_path / f"m{seed}.gguf"
        path.write_bytes(mutant)
        if check_file(path):
            accepted.append(path)
    assert len(accepted) > 20
    outcomes = load_all(accepted, timeout=120)
    assert len(outcomes) == len(accepted)
    assert [(o.path.name, o.result, o.detail) for o in outcomes if o.result not in ("ok", "refused")] == []


@pytest.mark.slow
def test_sixty_second_run(tmp_path: Path) -> None:
    """The long-run script for 60 seconds (LOCALRUN_FUZZ_SECONDS to change it),
    on a new seed each run (LOCALRUN_FUZZ_SEED to replay one): no violation,
    no crash, no hang."""
    seconds = os.environ.get("LOCALRUN_FUZZ_SECONDS", "60")
    seed = os.environ.get("LOCALRUN_FUZZ_SEED") or str(random.SystemRandom().randrange(1_000_000))
    out = tmp_path / "failing"
    cmd = [sys.executable, str(SCRIPT), "--seconds", seconds, "--seed", seed, "--out", str(out)]
    limit = float(seconds) + 200
    run = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=limit, stdin=subprocess.DEVNULL)
    report = f"seed {seed}\n{run.stdout}\n{run.stderr[-3000:]}"
    assert run.returncode == 0, report
    total = next(line for line in run.stdout.splitlines() if line.startswith("all ")).split()[1]
    assert int(total) >= 1000, report
    assert not out.exists() or not any(out.iterdir()), report
