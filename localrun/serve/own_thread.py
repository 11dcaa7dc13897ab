"""Work on a thread started for it, awaited from the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T")


async def in_own_thread(work: Callable[..., _T], *args: Any) -> _T:
    """``work(*args)`` on a thread started for it, which ends with it. A
    model's load or unload runs llama.cpp (its warm-up decodes on an OpenMP
    team of threads that lives as long as the calling thread): on a pool's
    thread, those threads and their stacks would stay after the model is
    gone; here they end with the thread."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[_T] = loop.create_future()

    def settle(result: _T | None, error: BaseException | None) -> None:
        if done.cancelled():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            outcome: tuple[_T | None, BaseException | None] = (work(*args), None)
        except BaseException as exc:
            outcome = (None, exc)
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits for it
            loop.call_soon_threadsafe(settle, *outcome)

    # not a daemon: the interpreter waits for it at exit, never stopping a free halfway
    thread = threading.Thread(target=run, name=f"localrun-{getattr(work, '__name__', 'work')}")
    thread.start()
    return await done
