"""What users write and read: sizes in bytes, counts of things, where a
JSON text goes wrong."""

from __future__ import annotations

import json

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}


def parse_size(text: str) -> int:
    """'4GiB', '512MB', '2.5G', '1000000' -> bytes."""
    s = text.strip().lower().replace(" ", "")
    number = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(number) :]
    if unit not in _UNITS or not number:
        raise ValueError(f"not a size: {text!r} (use e.g. 4GiB, 512MB)")
    return int(float(number) * _UNITS[unit])


def human_bytes(n: float) -> str:
    """A size in binary units, the way every localrun message says sizes: '1.1 GiB'."""
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def count(n: int, noun: str, plural: str | None = None) -> str:
    """'1 token', '2 tokens', '0 entries' (``plural``: when it is not the noun and an s)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def json_error(exc: json.JSONDecodeError, *, line: bool = True) -> str:
    """Where json gave up and why: 'Expecting value at line 1, column 5', and
    'Unterminated string starting at line 1, column 5' (not "at at")."""
    where = f"line {exc.lineno}, column {exc.colno}" if line else f"column {exc.colno}"
    return f"{exc.msg} {where}" if exc.msg.endswith(" at") else f"{exc.msg} at {where}"
