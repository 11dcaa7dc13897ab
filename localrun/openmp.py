"""How long llama.cpp's idle OpenMP threads spin before they sleep.

The llama.cpp build localrun sets up uses OpenMP (GNU libgomp): each decode is
one parallel region, and ggml's barrier between graph nodes is an OpenMP
barrier. A thread that waits, at a barrier or for the next decode, spins
`GOMP_SPINCOUNT` times before it sleeps; libgomp's default is 300,000 spins,
milliseconds of a core. On an idle machine the wait is microseconds and the
spin is free. When other processes compete for the cores it is not: a thread
spins on the core its partner (preempted) needs, and a thread the governor
dropped (localrun.runtime.threads) keeps spinning on the core another process
needs after every decode that used it. A spin count of `SPINCOUNT` (about a
millisecond or less) covers a barrier's wait on an idle machine and frees the
core soon after under load. 1,000 spins cost an idle 2-core Xeon a tenth of
the 135M model's decode speed (docs/benchmarks.md); scripts/bench_decode.py
`--tree` (idle) and scripts/bench_load.py (under load) measure both sides.

libgomp reads its environment once, when llama.cpp's library is loaded, so
`configure` runs when localrun is imported (localrun/__init__.py), before any
module loads llama_cpp. A user's own `GOMP_SPINCOUNT` or `OMP_WAIT_POLICY` is
left alone.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

SPINCOUNT = "10000"
USER_KEYS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")
_set_here = False  # whether localrun set this process's spin count (not the user)


def configure(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Set localrun's spin count in ``environ`` unless the user set a wait
    policy or spin count; returns whether it was set."""
    global _set_here
    if any(key in environ for key in USER_KEYS):
        return False
    environ["GOMP_SPINCOUNT"] = SPINCOUNT
    if environ is os.environ:
        _set_here = True
    return True


def others_environ() -> dict[str, str]:
    """This process's environment as another program (llama.cpp's own tools,
    in the benchmarks) would have it from the user: without the spin count
    localrun set for itself."""
    env = dict(os.environ)
    if _set_here:
        env.pop("GOMP_SPINCOUNT", None)
    return env
