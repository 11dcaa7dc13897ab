"""A runner: one served model in a process of its own (`python -m
localrun.serve.runner_process FD`), speaking to the server over the Unix
socket it was given as FD (`localrun.serve.runner` starts it).

It reads its plan, loads the model as `localrun.serve.served.load_model`
does, says what the load measured, and then takes the server's requests:
``submit`` a prepared request, ``cancel`` one, ``call`` a handler on the
model (embeddings and rerank run where the model is), ``ask`` its
vocabulary (the server tokenizes through it), ``stop``. Its
requests' text goes back as it decodes, a step's events together; every
`HEARTBEAT_S` it says how its engine is doing, so the server can tell a
runner that hangs from one that works. It ends when told to, or when the
server's end of the socket closes (the server is gone: nothing is left
behind)."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

HEARTBEAT_S = 1.0  # how often a runner says it is alive, and how far its engine has got
ASKS = frozenset({"tokenize", "piece", "detokenize", "is_eog", "token_text", "is_special"})  # of its vocabulary


def _error(exc: BaseException) -> BaseException:
    """``exc`` as the server can read it: a typed error as it is, anything else as an EngineError."""
    from localrun.errors import EngineError, LocalrunError

    return exc if isinstance(exc, LocalrunError) else EngineError(f"the engine failed: {exc}")


class Outbox:
    """What the runner sends, from any thread: a request's events queue up and
    go together (a step's tokens for every slot in one message), off the
    engine thread, so a slow reader never holds a decode."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._cond = threading.Condition()
        self._events: list[Any] = []
        self._messages: list[tuple[Any, ...]] = []
        self._closed = False
        self._thread = threading.Thread(target=self._send, name="localrun-runner-out", daemon=True)
        self._thread.start()

    def event(self, event: Any) -> None:
        with self._cond:
            self._events.append(event)
            self._cond.notify()

    def send(self, *message: Any) -> None:
        with self._cond:
            self._messages.append(message)
            self._cond.notify()

    def close(self) -> None:
        """Send what is queued, then nothing more."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(30)

    def _send(self) -> None:
        while True:
            with self._cond:
                while not (self._events or self._messages or self._closed):
                    self._cond.wait()
                events, self._events = self._events, []
                messages, self._messages = self._messages, []
                closed = self._closed
            try:
                if events:
                    self.conn.send(("events", events))
                for message in messages:
                    self.conn.send(message)
            except OSError:  # the server is gone
                os._exit(0)
            if closed:
                return


def _loading(outbox: Outbox, loaded: threading.Event) -> None:
    """Say every `HEARTBEAT_S` that the load goes on, until it has ended."""
    while not loaded.wait(HEARTBEAT_S):
        outbox.send("loading", None)


def _beat(outbox: Outbox, model: Any, stopped: threading.Event) -> None:
    while not stopped.wait(HEARTBEAT_S):
        worker = model.local_worker()
        outbox.send("beat", worker.status(), worker.notices(), worker.progress)


def _call(outbox: Outbox, model: Any, ident: int, handler: Callable[..., Any], body: dict[str, Any]) -> None:
    try:
        result = handler(model, body)
    except Exception as exc:
        outbox.send("answered", ident, None, _error(exc))
    else:
        outbox.send("answered", ident, result, None)


def _take(message: tuple[Any, ...], model: Any, outbox: Outbox) -> bool:
    """Do what the server asks; False when it asks the runner to stop."""
    from localrun.errors import LocalrunError
    from localrun.serve.worker import Failed
    from localrun.structured.constraint import tokenizer_for

    kind: str = message[0]
    if kind == "submit":
        request = message[1]
        if request.output is not None:  # built once, here rather than on the engine thread
            tokenizer_for(model.engine)
        try:
            model.local_worker().submit(request, outbox.event)
        except LocalrunError as exc:
            outbox.event(Failed(request.index, exc))
    elif kind == "ask":
        _, ident, what, args, kwargs = message
        try:
            if what not in ASKS:
                raise ValueError(f"not a question of the vocabulary: {what}")
            outbox.send("answered", ident, getattr(model.engine, what)(*args, **kwargs), None)
        except Exception as exc:
            outbox.send("answered", ident, None, _error(exc))
    elif kind == "cancel":
        model.local_worker().cancel(message[1])
    elif kind == "call":
        _, ident, handler, body = message
        threading.Thread(
            target=_call, args=(outbox, model, ident, handler, body), name="localrun-runner-call", daemon=True
        ).start()
    return kind != "stop"


def serve(conn: Connection) -> None:
    """Load the model the server sends, then take its requests until told to stop or it is gone."""
    from localrun.serve.heap import one_arena
    from localrun.serve.served import load_model

    one_arena()
    outbox = Outbox(conn)
    loading = threading.Event()
    threading.Thread(target=_loading, args=(outbox, loading), name="localrun-runner-loading", daemon=True).start()
    try:
        plan, run = conn.recv()
        model = load_model(plan, run)
    except (EOFError, OSError):
        return
    except BaseException as exc:
        loading.set()
        outbox.send("failed", _error(exc))
        outbox.close()
        return
    loading.set()
    outbox.send("loaded", model.loaded)
    stopped = threading.Event()
    threading.Thread(target=_beat, args=(outbox, model, stopped), name="localrun-runner-beat", daemon=True).start()
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):  # the server is gone: end now, whatever runs
                os._exit(0)
            if not _take(message, model, outbox):
                break
    finally:
        stopped.set()
        model.local_worker().stop()  # every request still admitted ends, with its error, before the socket closes
        outbox.close()
        model.close()


def main() -> None:
    conn = Connection(int(sys.argv[1]))
    try:
        serve(conn)
    finally:
        conn.close()


if __name__ == "__main__":
    main()
