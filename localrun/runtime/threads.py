"""How many CPU threads decode: fewer while other processes compete for the cores.

llama.cpp's compute threads meet at a barrier after each graph node and spin
while they wait. On an idle machine all the threads are best; when other
CPU-bound processes compete, the kernel preempts one thread or another, the
rest spin at the barrier until it runs again, and fewer threads decode faster
(how much depends on the machine and the load: docs/benchmarks.md has one
machine's figures, which decide nothing here; the governor measures).

`ThreadGovernor` decides from the figures it is fed, and reads no clock (the
tests feed it fixed ones): per single-token decode step, the wall seconds and
the CPU seconds the whole process used over it (llama.cpp's workers are
threads of their own, so `time.process_time`, the whole process's, not `time.thread_time`).
It takes the steps in windows of `WINDOW` and, at each window's end:

- Contention: ``lost = threads - cpu / wall``, the cores' worth of time our
  threads wanted and did not get (spinning, they use all they are given).
  Other processes compete when ``lost`` is at least `CONTENDED_CORES` and
  `CONTENDED_SHARE` of the threads, and the machine's reading of its load
  (`free_cpus`, below) leaves fewer CPUs free than our threads, or cannot
  say: a step of a millisecond or two outlasts the spin count between its
  barriers, and our own threads then sleep, losing as much time as under
  load, with nothing else running. The competition has stopped when ``lost``
  falls to `CLEAR_CORES` and `CLEAR_SHARE` (in between, the last verdict holds).
  At the full count without contention it does nothing at all: an idle
  machine never pays for a probe.
- Down: while contended (`CONFIRM` windows in a row: one reading of the
  load can catch a task passing by, a kernel thread, a pipeline's next
  process starting), the next window is a probe with one thread fewer. A
  probe is kept when its median step beats the median of the window just
  before it (at the settled count) by `MARGIN`, and then, while the count it
  reached is still contended, the next window probes one fewer again. A probe
  that loses goes back, and the next probe down waits a gap of windows that
  doubles with each loss (`MIN_GAP` to `MAX_GAP`).
- Up: below the full count a probe with one thread more runs after a gap that
  doubles each time a probe up loses (while the contention signal stays on,
  after `MAX_GAP` windows at the least: the others are still there); one that wins is kept and the next
  window probes up again. Both gaps go back to `MIN_GAP` (and a probe up runs
  at once) when the contention signal disappears: a clear window after a
  contended one at the same count, which is what happens when the load that
  made it go down stops. Where the fewer threads already had their cores to
  themselves, the load's end cannot be seen from this process, and the probe
  up on its doubling schedule (at most `MAX_GAP` windows away) finds it.
- The load, read: below the full count, where the machine says how many
  other tasks are runnable (`free_cpus`, from /proc on Linux), a probe up
  runs before its doubling gap (soon after a clear window, or after probes
  that lost while the read left no CPU) only when the CPUs they leave free
  hold one thread more, read at the end of two windows in a row (one
  reading can fall between a busy task's time slices). While they do not,
  the others are still there, and the probe waits its gap: a thread more
  can still win under load (a batch of many sequences spreads each
  barrier's wait over more work), and only a probe can tell; one sequence
  decoding (a step of one row), which a thread more under load seldom
  helps, waits at least `BLIND_GAP` windows for it: each probe that loses
  costs a run of a few hundred tokens some percent. On a machine that
  cannot say, the schedule above decides alone.
- A probe step slower than `ABORT` times the settled median ends the probe
  at once, as a loss: under load a thread more can make a step many times
  slower, and a whole window of them would cost more than the probe can win.
  So do a probe's first `EARLY` steps with a median `EARLY_LOSS` above the
  settled one: the rest of its window could not bring it to a win.
- Step times grow with the context's depth, so a probe is only ever compared
  with the window right before it, never with older figures; medians, so that
  one preempted step does not decide.

`ThreadMeter` is the thin part: it reads the clock and the CPU time around
each decode step of one token per sequence (a single-sequence loop's, or a
batch's without prompt tokens in it) and applies the governor's count to
the engine; every decode loop (plain, speculative, the batch scheduler)
times its steps through `ThreadMeter.timed`. A governor lives as long as
its engine, so a chat's turns go on from where the last one left off.
``EngineConfig.adapt_threads=False`` (a count the user gave) or a single
thread: nothing is measured or changed.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from localrun.runtime.llama import DecodeStatus
from localrun.runtime.load import runnable_others
from localrun.system import cpu_count

if TYPE_CHECKING:
    from localrun.runtime.engine import Engine

WINDOW = 8  # single-token steps per window
CONTENDED_CORES = 0.25  # contended: our threads waited for at least this many cores' worth of time ...
CONTENDED_SHARE = 0.05  # ... and at least this share of their time
CLEAR_CORES = 0.1  # the competition has stopped: at most this many cores' worth ...
CLEAR_SHARE = 0.02  # ... or at most this share
MARGIN = 0.05  # a probe is kept when its median step is this much shorter than the window's before it
MIN_GAP = 4  # windows before a probe up, or a probe down again after one that lost; doubles per loss
MAX_GAP = 64
ABORT = 2.0  # a probe step this many times slower than the settled median ends the probe
EARLY = 3  # ... and so do this many first steps of a probe ...
EARLY_LOSS = 0.25  # ... whose median is slower than the settled median by this share
BLIND_GAP = 16  # windows at the least before a probe up the load read does not call for, one sequence decoding
CONFIRM = 2  # windows in a row judged contended before a probe down


class ThreadGovernor:
    """The thread count for the next step, from each step's wall and CPU
    seconds (see the module's note). `threads` is the settled count; while a
    probe runs, `running` is the probe's."""

    def __init__(
        self,
        max_threads: int,
        *,
        threads: int | None = None,
        adapt: bool = True,
        window: int = WINDOW,
        free_cpus: Callable[[], int | None] | None = None,
    ) -> None:
        self.max_threads = max(1, max_threads)
        self.free_cpus = free_cpus  # the CPUs other runnable tasks leave free now (None: cannot tell)
        self.threads = self.max_threads
        self.active = adapt and self.max_threads > 1
        self.window = window
        self._steps = [0.0] * window
        self._n = 0
        self._wall = self._cpu = 0.0
        self._probe: int | None = None
        self._base: float | None = None  # the median step of the last window at the settled count
        self._contended: bool | None = None  # None: not yet judged at this count
        self._contended_run = 0  # windows in a row judged contended
        self._windows = 0
        self._up_gap = self._down_gap = MIN_GAP
        self._next_up = self._next_down = 0  # the window from which a probe that way may run
        self._last_up = 0  # the window the last probe up started
        self._up_blind = False  # the last probe up started while the load read left no CPU for it
        self._lost_blind = False  # ... and lost
        self._room_at = -1  # the window at whose end the load read last left a CPU for a thread more
        self._rows = 1  # the rows of the steps in the window
        self.resume(self.max_threads if threads is None else threads)

    @property
    def running(self) -> int:
        return self._probe if self._probe is not None else self.threads

    def start_below(self, threads: int) -> int:
        """Start a generation at ``threads``, fewer than settled because other
        processes were seen running: counted as contended, so that a first
        window without contention probes up at once. Returns the count to run."""
        self.resume(threads)
        if self.threads < self.max_threads:
            self._contended = True
            self._last_up = self._windows  # a probe up waits until a clear window says the others have gone
        return self.threads

    def resume(self, threads: int) -> int:
        """Start afresh at ``threads`` (a new generation, or after one ended):
        a window begun and a probe running are dropped, what was learnt kept.
        Returns the count to run."""
        threads = min(max(1, threads), self.max_threads)
        if threads != self.threads:
            self.threads, self._contended = threads, None
        self._probe = self._base = None
        self._n = 0
        self._wall = self._cpu = 0.0
        return self.threads

    def observe(self, wall_s: float, cpu_s: float, rows: int = 1) -> int:
        """One decode step of ``rows`` tokens (one per sequence) took ``wall_s``
        seconds, over which the process used ``cpu_s`` CPU seconds. Returns the
        count for the next step. Only steps of the same rows are compared: a
        change of rows (a batch's sequence ended or joined) starts the window,
        and any probe, afresh."""
        if not self.active:
            return self.threads
        if rows != self._rows:
            self._rows = rows
            self.resume(self.threads)
        if self._probe is not None and self._base is not None and wall_s > ABORT * self._base:
            return self._lost_early()
        self._steps[self._n] = wall_s
        self._wall += wall_s
        self._cpu += cpu_s
        self._n += 1
        if (
            self._n == EARLY < self.window
            and self._probe is not None
            and self._base is not None
            and sorted(self._steps[:EARLY])[EARLY // 2] > (1 + EARLY_LOSS) * self._base
        ):
            return self._lost_early()
        if self._n < self.window:
            return self.running
        lost = self.running - self._cpu / self._wall if self._wall > 0 else 0.0
        median = sorted(self._steps)[self.window // 2]
        self._n = 0
        self._wall = self._cpu = 0.0
        return self.decide(median, lost)

    def _lost_early(self) -> int:
        """The running probe lost before its window's end: its steps are dropped. Returns the settled count."""
        assert self._probe is not None
        self._n = 0
        self._wall = self._cpu = 0.0
        self._windows += 1
        up, self._probe = self._probe > self.threads, None
        self._lose(up, self._windows)
        return self.threads

    def decide(self, median_s: float, lost: float) -> int:
        """A window ended: its median step and the cores' worth of time its
        threads lost to other processes. Returns the count for the next window."""
        self._windows += 1
        now = self._windows
        probe, self._probe = self._probe, None
        if probe is not None:
            up = probe > self.threads
            if self._base is None or median_s >= self._base * (1 - MARGIN):  # lost: back, and wait longer
                self._lose(up, now)
                return self.threads
            self.threads, self._contended = probe, None  # won: this window is the new count's first
            if up:
                self._up_gap, self._next_up, self._next_down = MIN_GAP, now, now + self._down_gap
                self._lost_blind = False
            else:
                self._next_down, self._next_up = now, now + self._up_gap
        self._base = median_s
        self._judge(lost, now)
        if self._up_due(now):
            self._probe = self.threads + 1
            self._last_up = now
            self._up_blind = not self._room_for(self.threads + 1)  # the read leaves no CPU for it
        elif self._contended and self._contended_run >= CONFIRM and self.threads > 1 and now >= self._next_down:
            self._probe = self.threads - 1
        return self.running

    def _up_due(self, now: int) -> bool:
        """Whether the next window probes one thread more (see the module's note)."""
        if self.threads >= self.max_threads:
            return False
        if self._contended:  # the others still take our threads' time: they have not gone
            return now >= max(self._next_up, self._last_up + MAX_GAP)
        blind_gap = self._up_gap if self._rows > 1 else max(self._up_gap, BLIND_GAP)
        if now >= self._next_up and now >= self._last_up + blind_gap:
            return True
        # before its gap only where the load read leaves a CPU for it: soon after the load's end (a
        # clear window after a contended one), or after probes that lost while the read left none
        return (now >= self._next_up or self._lost_blind) and self._room_confirmed(self.threads + 1, now)

    def _room_confirmed(self, threads: int, now: int) -> bool:
        """Whether the load read leaves CPUs for ``threads`` at the end of
        this window and of the one before: one reading can fall between a
        busy task's time slices (where the machine cannot say: yes, at once)."""
        free = self._free()
        if free is None:
            return True
        room = free >= threads
        confirmed = room and self._room_at == now - 1
        self._room_at = now if room else -1
        return confirmed

    def _lose(self, up: bool, now: int) -> None:
        """A probe lost: back to the settled count, and the next probe that way waits longer."""
        if up:
            self._up_gap = min(2 * self._up_gap, MAX_GAP)
            self._next_up = now + self._up_gap
            self._lost_blind = self._up_blind  # lost while the others were there: their going may change it
        else:
            self._down_gap = min(2 * self._down_gap, MAX_GAP)
            self._next_down = now + self._down_gap
        self._base = None  # the settled count is measured afresh before the next probe

    def _room_for(self, threads: int, unknown: bool = True) -> bool:
        """Whether the CPUs the other runnable tasks leave free hold ``threads``
        (``unknown`` where the machine cannot say)."""
        free = self._free()
        return unknown if free is None else free >= threads

    def _free(self) -> int | None:
        """The CPUs other runnable tasks leave free now; None where the machine cannot say."""
        return self.free_cpus() if self.free_cpus is not None else None

    def _judge(self, lost: float, now: int) -> None:
        n = self.threads
        if lost >= max(CONTENDED_CORES, CONTENDED_SHARE * n):
            # time our threads did not run: taken by others, or slept by our own (a step of a millisecond
            # or two outlasts the spin count between its barriers); where the machine says that nothing
            # else is runnable, it was ours
            contended: bool | None = not self._room_for(n, unknown=False)
        elif lost <= max(CLEAR_CORES, CLEAR_SHARE * n):
            contended = False
        else:
            contended = self._contended  # in between: the last verdict holds
        if contended is False and self._contended:  # the competition stopped: probe up at once, and down soon
            self._up_gap = self._down_gap = MIN_GAP
            self._next_up = self._next_down = now
        self._contended = bool(contended)
        self._contended_run = self._contended_run + 1 if self._contended else 0


_governors: weakref.WeakKeyDictionary[Engine, ThreadGovernor] = weakref.WeakKeyDictionary()


def governor(engine: Engine) -> ThreadGovernor:
    """The engine's governor, made on first use (pinned when its config says so)."""
    gov = _governors.get(engine)
    if gov is None:
        gov = ThreadGovernor(
            engine.max_threads, threads=engine.threads, adapt=engine.config.adapt_threads, free_cpus=free_cpus
        )
        _governors[engine] = gov
    return gov


def others_running(samples: int = 5, gap_s: float = 0.001) -> int:
    """How many other tasks keep the CPUs busy now: the fewest runnable tasks
    not of this process over a few samples (a passing task is seldom in all
    of them); 0 where it cannot be read."""
    seen = []
    for i in range(samples):
        now = runnable_others()
        if now is None:
            return 0
        seen.append(now)
        if i + 1 < samples:
            time.sleep(gap_s)
    return min(seen)


def free_cpus() -> int | None:
    """The CPUs this process may use that other runnable tasks leave free now
    (one reading); None where the machine cannot say."""
    others = runnable_others()
    return None if others is None else max(0, cpu_count() - others)


_cpu_seconds = time.process_time  # every thread's CPU seconds (a quarter of getrusage's cost, and finer)


class ThreadMeter:
    """A decode loop's steps of one token per sequence, timed for the
    engine's governor: each runs through `timed`, and `finish` when the loop
    ends. Costs two clock reads on each side of a step (about a microsecond);
    nothing when the count is pinned."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.governor = governor(engine)
        self.active = self.governor.active
        self.steps: dict[int, int] = {}  # timed steps run at each thread count
        if self.active:
            others = others_running()
            free = max(1, self.governor.max_threads - others)
            if others and free < self.governor.threads:
                self._apply(self.governor.start_below(free))
            else:
                self._apply(self.governor.resume(engine.threads))

    @property
    def threads(self) -> int:
        """The settled count (a probe of one window is not reported)."""
        return self.governor.threads if self.active else self.engine.threads

    @property
    def shares(self) -> dict[int, float]:
        """The share of the timed steps run at each thread count (empty: none timed)."""
        total = sum(self.steps.values())
        return {n: round(k / total, 3) for n, k in sorted(self.steps.items(), reverse=True)} if total else {}

    def timed(self, decode: Callable[[], DecodeStatus], rows: int = 1) -> DecodeStatus:
        """Run ``decode``, a step of ``rows`` tokens, one per sequence, timed
        for the governor when it adapts (a step that fails is not counted)."""
        if not self.active:
            return decode()
        self.steps[self.engine.threads] = self.steps.get(self.engine.threads, 0) + 1
        wall, cpu = time.perf_counter(), _cpu_seconds()
        status = decode()
        if status == DecodeStatus.OK:
            self._apply(self.governor.observe(time.perf_counter() - wall, _cpu_seconds() - cpu, rows))
        return status

    def finish(self) -> None:
        """Leave the engine at the settled count (a probe may be running)."""
        if self.active:
            self._apply(self.governor.resume(self.governor.threads))

    def _apply(self, n: int) -> None:
        if n != self.engine.threads:
            self.engine.set_threads(n)
