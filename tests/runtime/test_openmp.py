"""The waiting policy (OpenMP spin count) localrun chooses before llama.cpp loads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from localrun import openmp


def test_idle_at_start_spins_and_loaded_sleeps_soon() -> None:
    idle = openmp.choose({}, others=0)
    assert (idle.name, idle.spincount, idle.source) == ("spin", None, "default")
    for others in (1, 3):
        loaded = openmp.choose({}, others=others)
        assert (loaded.name, loaded.spincount) == ("sleep-soon", openmp.SLEEP_SOON)
        assert f"{others} other task" in loaded.why
    unknown = openmp.choose({}, others=None)
    assert unknown.name == "sleep-soon" and "cannot be read" in unknown.why


def test_others_on_cpus_our_threads_leave_spare_compete_with_none() -> None:
    assert openmp.choose({}, others=4, spare=6).name == "spin"
    assert openmp.choose({}, others=7, spare=6).name == "sleep-soon"
    spare_read: list[int] = []

    def spare() -> int:
        spare_read.append(1)
        return 0

    idle: dict[str, str] = {}
    assert not openmp.configure(idle, load=lambda: 0, argv=[], spare=spare) and not spare_read  # no topology read
    assert openmp.configure(idle, load=lambda: 1, argv=[], spare=spare) and spare_read


def test_a_server_sleeps_soon_even_when_idle_at_start() -> None:
    assert openmp.choose({}, others=0, command="serve").name == "sleep-soon"
    assert openmp.choose({}, others=0, command="generate").name == "spin"


@pytest.mark.parametrize("others", [0, 2, None])
@pytest.mark.parametrize("argv", [["localrun", "generate"], ["localrun", "serve"]])
def test_a_users_setting_is_never_overridden(others: int | None, argv: list[str]) -> None:
    for key, value in (("GOMP_SPINCOUNT", "infinite"), ("OMP_WAIT_POLICY", "active"), ("OMP_WAIT_POLICY", "passive")):
        mine = {key: value}
        assert not openmp.configure(mine, load=lambda: others, argv=argv)
        assert mine == {key: value}
        chosen = openmp.choose(mine, others, openmp.command(argv))
        assert (chosen.name, chosen.source) == ("user", "env") and key in chosen.why


def test_configure_sets_the_count_only_for_sleep_soon() -> None:
    idle: dict[str, str] = {}
    assert not openmp.configure(idle, load=lambda: 0, argv=["localrun", "generate"]) and idle == {}
    loaded: dict[str, str] = {}
    assert openmp.configure(loaded, load=lambda: 2, argv=["localrun", "generate"])
    assert loaded == {"GOMP_SPINCOUNT": openmp.SLEEP_SOON}
    served: dict[str, str] = {}
    assert openmp.configure(served, load=lambda: 0, argv=["/usr/bin/localrun", "--verbose", "serve"])
    assert served == {"GOMP_SPINCOUNT": openmp.SLEEP_SOON}


def test_a_passing_task_is_not_a_load() -> None:
    """The fewest of a few readings: a task seen once (a passing one) does not make the machine loaded."""
    readings = iter([2, 0, 3])
    assert openmp.choose({}, openmp._fewest(lambda: next(readings))).name == "spin"


def test_the_command_is_read_from_localrun_s_argv_only() -> None:
    assert openmp.command(["/x/bin/localrun", "-v", "serve", "m"]) == "serve"
    assert openmp.command(["-m", "serve"]) == "serve"  # `python -m localrun serve`, while the package imports
    assert openmp.command(["/x/bin/pytest", "serve"]) is None
    assert openmp.command([]) is None


def _seen(env: dict[str, str], code: str = "import localrun, localrun.openmp as o, os, llama_cpp; ") -> list[str]:
    """What a process that runs ``code`` (by default: imports localrun, then
    loads llama.cpp) has in its environment, and the policy it reports."""
    code += (
        "print(os.environ.get('GOMP_SPINCOUNT', '-'), o.policy().name, o.others_environ().get('GOMP_SPINCOUNT', '-'))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_importing_localrun_chooses_nothing() -> None:
    """Importing the package reads no load and sets no spin count, even in a
    server, where a run always sets one; the policy is chosen when llama.cpp
    first loads, with the count in the environment before its library reads it."""
    env = {k: v for k, v in os.environ.items() if k not in openmp.USER_KEYS}
    code = (
        "import sys, os, importlib.machinery as m; sys.argv = ['localrun', 'serve']; "
        "import localrun, localrun.openmp as o; "
        "assert 'llama_cpp' not in sys.modules and o._policy is None, 'chosen at import'; "
        "assert 'GOMP_SPINCOUNT' not in os.environ, 'set at import'; "
        "seen = []; "  # the environment as the finder that finds llama_cpp (loads libgomp) is reached
        "sys.meta_path.insert(sys.meta_path.index(m.PathFinder), type('F', (), {"
        "'find_spec': lambda self, n, p, t=None: seen.append(os.environ.get('GOMP_SPINCOUNT')) if n == 'llama_cpp' "
        "else None})()); "
        "import localrun.runtime.engine; "  # where a run starts
        "assert seen and seen[0] == o.SLEEP_SOON, seen; "
    )
    assert _seen(env, code)[:2] == [openmp.SLEEP_SOON, "sleep-soon"]


def test_a_run_sets_it_before_llama_cpp_loads() -> None:
    """Whichever policy the machine's load at start picks, the environment
    llama.cpp loads with says the same; llama.cpp's own tools, run by the
    benchmarks, get the user's environment (no count localrun set)."""
    env = {k: v for k, v in os.environ.items() if k not in openmp.USER_KEYS}
    own, name, others = _seen(env)
    assert (own, name) in ((openmp.SLEEP_SOON, "sleep-soon"), ("-", "spin")) and others == "-"
    assert _seen({**env, "GOMP_SPINCOUNT": "5"}) == ["5", "user", "5"]
    assert _seen({**env, "OMP_WAIT_POLICY": "passive"}) == ["-", "user", "-"]
