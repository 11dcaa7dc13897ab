"""The OpenMP spin count localrun sets before llama.cpp loads."""

from __future__ import annotations

import os
import subprocess
import sys

from localrun import openmp


def test_set_unless_the_user_chose() -> None:
    env: dict[str, str] = {}
    assert openmp.configure(env) and env == {"GOMP_SPINCOUNT": openmp.SPINCOUNT}
    for key, value in (("GOMP_SPINCOUNT", "infinite"), ("OMP_WAIT_POLICY", "active")):
        mine = {key: value}
        assert not openmp.configure(mine) and mine == {key: value}


def _spincount_seen(env: dict[str, str]) -> str:
    """What a process that imports localrun and then loads llama.cpp has in its environment."""
    code = "import localrun, os, llama_cpp; print(os.environ.get('GOMP_SPINCOUNT', '-'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_importing_localrun_sets_it_before_llama_cpp_loads() -> None:
    env = {k: v for k, v in os.environ.items() if k not in openmp.USER_KEYS}
    assert _spincount_seen(env) == openmp.SPINCOUNT
    assert _spincount_seen({**env, "GOMP_SPINCOUNT": "5"}) == "5"


def test_other_programs_get_the_users_environment() -> None:
    """llama.cpp's own tools, run by the benchmarks, are measured as the user
    would run them: without the spin count localrun set for itself."""
    code = (
        "import localrun, localrun.openmp as o, os; "
        "print(o.others_environ().get('GOMP_SPINCOUNT', '-'), os.environ['GOMP_SPINCOUNT'])"
    )
    env = {k: v for k, v in os.environ.items() if k not in openmp.USER_KEYS}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["-", openmp.SPINCOUNT]
    out = subprocess.run(
        [sys.executable, "-c", code], env={**env, "GOMP_SPINCOUNT": "7"}, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["7", "7"]
