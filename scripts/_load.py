"""Competing CPU-bound processes, for a measurement under load.

`cpu_load(n)` starts ``n`` processes that each keep one CPU busy (a loop of
pure computation, as `yes > /dev/null` would) for as long as the ``with``
block runs, and always stops them: at the block's end, on an exception, on
Ctrl-C, on SIGTERM (turned into SystemExit for the block's duration, so the
cleanup runs), and, should this process die without cleaning up (SIGKILL),
each of them notices within milliseconds that its parent has gone and exits.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

# computes, and checks between chunks of work whether its parent is still the one that started it
BUSY = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    for _ in range(20000):\n        pass\n"


def _terminate(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def cpu_load(n: int) -> Iterator[list[int]]:
    """``n`` busy processes while the block runs; yields their process ids."""
    procs: list[subprocess.Popen[bytes]] = []
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        for _ in range(n):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", BUSY],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()  # each by its own process id
        for p in procs:
            p.wait()
        signal.signal(signal.SIGTERM, previous)
