"""Giving freed memory back to the system, where the C library allows it."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    return trim


def trim_heap() -> bool:
    """glibc's ``malloc_trim(0)``: free pages anywhere in the heap go back to
    the system (what a closed model's buffers leave); False where there is none."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
