"""How long llama.cpp's idle OpenMP threads spin before they sleep: the
waiting policy, chosen once per process from the machine's load at start.

The llama.cpp build localrun sets up uses OpenMP (GNU libgomp): each decode is
one parallel region, and ggml's barrier between graph nodes is an OpenMP
barrier. A thread that waits, at a barrier or for the next decode, spins
`GOMP_SPINCOUNT` times before it sleeps; libgomp's default is 300,000 spins,
milliseconds of a core. On an idle machine the wait is microseconds and the
spin is free, and a thread that slept instead must be woken (a system call
and a scheduler's delay) for each step: with a short spin count the workers
sleep between steps, which cost the 135M model about 7% of its decode speed
on an idle 2-core Xeon (docs/benchmarks.md). When other processes compete for
the cores the spin is not free: a thread spins on the core its partner
(preempted) needs, and a thread the governor dropped (localrun.runtime.threads)
keeps spinning on the core another process needs after every decode that used
it. A spin count of `SLEEP_SOON` (about a millisecond or less) covers a
barrier's wait and frees the core soon after.

libgomp reads its environment once, when llama.cpp's library is loaded, so a
process cannot change its mind: `configure` runs just before the first
`import llama_cpp` (`before_llama`, set up by localrun/__init__.py), which is
where a run starts (commands import the runtime inside their functions), and
chooses

- ``spin`` (libgomp's own default) when no other task competes for the CPUs
  at start (none runnable beyond the CPUs llama.cpp's threads leave): the
  machine is idle and the run is short enough that it will likely stay so
  (the thread governor still drops threads if a load comes);
- ``sleep-soon`` (`SLEEP_SOON` spins) when other tasks compete at start, or
  the machine cannot say, or the process is a server (`localrun serve`): a
  server outlives the load it started under, and what it saves on an idle
  machine (a few percent) is less than what it costs under a load that
  comes later (a collapse: docs/benchmarks.md);
- ``user``: a user's own `GOMP_SPINCOUNT` or `OMP_WAIT_POLICY` always wins.

`policy()` says which, and why (`--json`'s settings, `localrun show`).
scripts/bench_decode.py `--tree` (idle) and scripts/bench_load.py (under
load) measure both sides. ggml's own thread pool (a build without OpenMP,
a polling level per pool) was measured natively against this design; the
figures are in docs/benchmarks.md.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from pathlib import Path

SLEEP_SOON = "10000"
SPINCOUNT = SLEEP_SOON  # the count localrun sets where it sets one
USER_KEYS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")
LONG_LIVED = ("serve",)  # commands whose process outlives the load it started under
LOAD_SAMPLES = 3  # readings of the load at start (the fewest counts: a passing task is seldom in all)
LOAD_GAP_S = 0.0005


@dataclass(frozen=True)
class WaitPolicy:
    """How llama.cpp's idle threads wait in this process."""

    name: str  # "spin", "sleep-soon" or "user"
    spincount: str | None  # GOMP_SPINCOUNT as libgomp reads it (None: libgomp's default)
    source: str  # "default" (chosen here) or "env" (the user's)
    why: str

    def as_setting(self) -> dict[str, str | None]:
        """As `--json` shows a setting."""
        value = self.name if self.spincount is None else f"{self.name} ({self.spincount} spins)"
        return {"value": value, "source": self.source, "why": self.why}


_policy: WaitPolicy | None = None  # this process's, once configured
_set_here = False  # whether localrun set this process's spin count (not the user)
_pending: Callable[[], object] | None = None  # `before_llama`'s configure, until it runs
LIBRARY = "llama_cpp"  # the module whose import loads libgomp


def choose(
    environ: MutableMapping[str, str], others: int | None, command: str | None = None, spare: int = 0
) -> WaitPolicy:
    """The waiting policy for a process with ``environ``, where ``others``
    tasks are runnable at start (None: the machine cannot say), running
    ``command`` (the CLI's command, where known), on a machine with ``spare``
    CPUs beyond those its threads use (others that fit there compete with
    none of them)."""
    for key in USER_KEYS:
        if key in environ:
            return WaitPolicy("user", environ.get("GOMP_SPINCOUNT"), "env", f"{key}={environ[key]} set by the user")
    if command in LONG_LIVED:
        return WaitPolicy("sleep-soon", SLEEP_SOON, "default", f"`{command}` outlives the load it starts under")
    if others is None:
        return WaitPolicy("sleep-soon", SLEEP_SOON, "default", "the machine's load cannot be read")
    if others > spare:
        tasks = f"{others} other task{'s' if others > 1 else ''}"
        return WaitPolicy("sleep-soon", SLEEP_SOON, "default", f"{tasks} competed for the CPUs at start")
    return WaitPolicy("spin", None, "default", "the machine was idle at start")


def configure(
    environ: MutableMapping[str, str] = os.environ,
    load: Callable[[], int | None] | None = None,
    argv: Sequence[str] | None = None,
    spare: Callable[[], int] = lambda: 0,
) -> bool:
    """Choose the waiting policy (`choose`) and set its spin count in
    ``environ``; ``load`` reads how many other tasks are runnable (None:
    cannot say), ``spare`` the CPUs beyond those llama.cpp's threads use
    (read only when other tasks run). Returns whether a spin count was set."""
    global _policy, _set_here
    others = _fewest(load) if load is not None and not any(key in environ for key in USER_KEYS) else None
    chosen = choose(environ, others, command(sys.argv if argv is None else argv), spare() if others else 0)
    if environ is os.environ:
        _policy = chosen
    if chosen.source != "default" or chosen.spincount is None:
        return False
    environ["GOMP_SPINCOUNT"] = chosen.spincount
    if environ is os.environ:
        _set_here = True
    return True


def before_llama(load: Callable[[], int | None], spare: Callable[[], int] = lambda: 0) -> None:
    """Run `configure` (with ``load`` and ``spare``) just before llama_cpp is
    first imported, rather than now: importing localrun reads no /proc and
    leaves the environment as it was, and `localrun --help` or `list`, which
    never load llama.cpp, choose nothing. Where llama_cpp is already loaded
    it is too late to choose, and nothing is done."""
    global _pending
    if LIBRARY in sys.modules or _pending is not None:
        return
    _pending = functools.partial(configure, load=load, spare=spare)
    sys.meta_path.insert(0, _BeforeLlama())


def ensure() -> None:
    """Configure now, if `before_llama` is still waiting: what llama.cpp,
    loaded later in this process, will read."""
    global _pending
    pending, _pending = _pending, None
    if pending is not None:
        pending()


class _BeforeLlama(MetaPathFinder):
    """Configures at the first import of llama_cpp, then leaves the import to the other finders."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: object = None) -> ModuleSpec | None:
        if fullname == LIBRARY:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            ensure()
        return None


def policy() -> WaitPolicy:
    """This process's waiting policy (as `configure` chose it, or chooses it
    now where llama.cpp is yet to load)."""
    ensure()
    return _policy if _policy is not None else choose(dict(os.environ), None)


def command(argv: Sequence[str]) -> str | None:
    """The CLI command in ``argv`` (its first word that is not an option), where the program is localrun's."""
    program = argv[0] if argv else ""
    path = Path(program)
    ours = path.name == "localrun" or path.parts[-2:] == ("localrun", "__main__.py")
    if not (ours or program == "-m"):  # "-m": `python -m localrun`, while the package is imported
        return None
    return next((arg for arg in argv[1:] if not arg.startswith("-")), None)


def _fewest(load: Callable[[], int | None]) -> int | None:
    seen = []
    for i in range(LOAD_SAMPLES):
        now = load()
        if now is None:
            return None
        seen.append(now)
        if now == 0:
            break
        if i + 1 < LOAD_SAMPLES:
            time.sleep(LOAD_GAP_S)
    return min(seen)


def others_environ() -> dict[str, str]:
    """This process's environment as another program (llama.cpp's own tools,
    in the benchmarks) would have it from the user: without the spin count
    localrun set for itself."""
    env = dict(os.environ)
    if _set_here:
        env.pop("GOMP_SPINCOUNT", None)
    return env
