"""The machine's load, read: how many other tasks compete for the CPUs now,
and whether a measurement ran while they did.

The thread governor (localrun.runtime.threads) reads it to know whether a
thread more has a CPU; `localrun tune` and `localrun bench` read it before
each sample, so that nothing measured under load becomes a default.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

BUSY_READINGS = 0.25  # a measurement that saw other runnable tasks at this share of its readings ran under load


def runnable_others() -> int | None:
    """Runnable tasks on the machine now, less this process's own: the
    others that compete for the CPUs (one spinning thread of ours would
    otherwise count as a competitor). None where /proc cannot say."""
    try:
        with Path("/proc/stat").open(encoding="ascii") as f:
            running = next((int(line.split()[1]) for line in f if line.startswith("procs_running")), None)
        ours = 0
        for task in Path("/proc/self/task").iterdir():
            with contextlib.suppress(OSError):  # a thread that just ended
                stat = (task / "stat").read_text(encoding="ascii", errors="replace")
                ours += stat[stat.rindex(")") + 2] == "R"  # the state follows the command's name
    except (OSError, ValueError):
        return None
    return None if running is None else max(0, running - max(ours, 1))


class LoadWatch:
    """Load readings taken over one measurement (a phase of tune, a bench run):
    `read` before each sample, `busy` at the end. ``load``: the reading (tests
    give a fake one)."""

    def __init__(self, load: Callable[[], int | None] | None = None) -> None:
        self.load = load or runnable_others
        self.readings: list[int] = []

    def reset(self) -> None:
        self.readings = []

    def read(self) -> None:
        others = self.load()
        if others is not None:
            self.readings.append(others)

    def busy(self) -> str | None:
        """Why the measurement decides nothing ("machine busy: ..."), or None:
        it ran on a quiet machine (or the machine cannot say)."""
        seen = sum(1 for others in self.readings if others > 0)
        if not self.readings or seen < BUSY_READINGS * len(self.readings):
            return None
        return f"machine busy: other processes ran during {seen} of its {len(self.readings)} samples"
