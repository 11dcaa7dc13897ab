"""Ctrl-C while a model generates: the first stops the loop, the second raises."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Protocol


class Abortable(Protocol):
    """What a loop checks between steps: a local engine, or a remote model."""

    abort_requested: bool


@contextmanager
def ctrl_c_stops(engine: Abortable) -> Iterator[None]:
    """The first Ctrl-C asks the loop to stop (it ends with stop_reason
    'interrupted'); a second one raises KeyboardInterrupt."""

    def handler(signum: int, frame: FrameType | None) -> None:
        if engine.abort_requested:
            raise KeyboardInterrupt
        engine.abort_requested = True

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
