"""Fuzz the GGUF check with mutants of a real tiny model (tests/gguf/mutate.py).

Property: `read_gguf` accepts a file or refuses it with `BadModelError`, in
bounded time and memory; a file it accepts, llama.cpp loads or refuses cleanly,
never crashing (loaded in a child process). A short, derandomized run here;
scripts/fuzz_gguf.py runs the long one.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gguf.loadcheck import check_file, load_all
from tests.gguf.mutate import MUTATIONS, mutate, parse

pytestmark = pytest.mark.timeout(300)


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
