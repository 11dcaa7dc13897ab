"""What this machine offers the process: memory, CPUs, and its peak memory use."""

from __future__ import annotations

import contextlib
import os
import resource
import sys
from pathlib import Path


def _meminfo(key: str) -> int:
    """One /proc/meminfo field in bytes; 0 when unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def available_memory() -> int:
    """MemAvailable from /proc/meminfo (bytes); 0 when unknown."""
    return _meminfo("MemAvailable")


def total_memory() -> int:
    """MemTotal from /proc/meminfo (bytes); 0 when unknown."""
    return _meminfo("MemTotal")


def cpu_count() -> int:
    """The CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def physical_cores() -> int:
    """Cores this process may use, counting a core's SMT siblings once (as
    llama.cpp counts them); all its CPUs where the topology is not readable."""
    try:
        allowed = os.sched_getaffinity(0)
    except AttributeError:
        return cpu_count()
    cores = set()
    for cpu in allowed:
        try:
            cores.add(Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings").read_text().strip())
        except OSError:
            return cpu_count()
    return max(1, len(cores))


def default_threads() -> int:
    """llama.cpp's own default thread count: the physical cores (its
    `cpu_get_num_math`), within the CPUs this process may use. `localrun tune`
    measures whether another count is faster on this machine."""
    return physical_cores()


def reset_peak_rss() -> None:
    """Start a new peak-RSS window (Linux: writing 5 to clear_refs resets VmHWM)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_rss() -> int:
    """Peak resident memory since `reset_peak_rss` (bytes); where that cannot
    be reset, the process's lifetime peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
