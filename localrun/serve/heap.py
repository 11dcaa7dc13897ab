"""Giving freed memory back to the system, where the C library allows it."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

_M_ARENA_MAX = -8  # glibc's mallopt parameter


@functools.cache
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim, libc.mallopt  # noqa: B018  (both glibc's)
    except (OSError, AttributeError):  # not glibc
        return None
    return libc


def one_arena() -> bool:
    """Every thread allocates from glibc's main arena from now on (``mallopt(M_ARENA_MAX, 1)``).
    A thread that loads or runs a model otherwise gets an arena of its own,
    and what it freed there stays resident after a trim (measured: about 13
    MiB a model on the server that loads on demand, docs/benchmarks.md); the
    main arena gives it back. Called before a server starts its threads."""
    libc = _libc()
    return libc is not None and bool(libc.mallopt(_M_ARENA_MAX, 1))


def trim_heap() -> bool:
    """glibc's ``malloc_trim(0)``: free pages anywhere in the heap go back to
    the system (what a closed model's buffers leave); False where there is none."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
