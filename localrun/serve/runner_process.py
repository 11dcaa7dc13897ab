"""A runner: one served model in a process of its own (`python -m
localrun.serve.runner_process FD`), speaking to the server over the Unix
socket it was given as FD (`localrun.serve.runner` starts it; the messages
are `localrun.serve.runner_wire`'s).

It reads its plan, loads the model as `localrun.serve.served.load_model`
does (saying every second that it still loads), says what the load
measured, and then takes the server's requests: ``submit`` a prepared
request, ``cancel`` one, ``call`` a handler on the model (embeddings and
rerank run where the model is), ``ask`` its vocabulary (the server
tokenizes through it), ``stop``. Its requests' text goes back as it
decodes, a step's events together; every `HEARTBEAT_S` it says how far its
engine has got, so the server can tell a runner that hangs from one that
works. A message that fails fails only its own request. It ends when told
to, or when the server's end of the socket closes (the server is gone:
nothing is left behind)."""

from __future__ import annotations

import os
import sys
import threading
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from localrun.serve.runner_wire import ASKS, HEARTBEAT_S, Outbox

if TYPE_CHECKING:
    from localrun.serve.served import ServedModel


def _gone() -> None:
    """The server is gone: end now, whatever runs (nothing may outlive it)."""
    os._exit(0)


class _Pieces:
    """The text of the tokens that events' log-probabilities name, each sent
    once, ahead of the events (the server renders them without asking)."""

    def __init__(self) -> None:
        self.model: ServedModel | None = None
        self._sent: set[int] = set()

    def __call__(self, events: list[Any]) -> tuple[Any, ...] | None:
        if self.model is None:
            return None
        tokens = {
            t
            for event in events
            for choice in getattr(event, "logprobs", ())
            for t in (choice.token, *(token for token, _ in choice.top))
        } - self._sent
        if not tokens:
            return None
        self._sent |= tokens
        return ("pieces", {t: self.model.engine.piece(t) for t in tokens})


def _loading(outbox: Outbox, loaded: threading.Event) -> None:
    """Say every `HEARTBEAT_S` that the load goes on, until it has ended."""
    while not loaded.wait(HEARTBEAT_S):
        outbox.send("loading", None)


def _beat(outbox: Outbox, model: ServedModel, stopped: threading.Event) -> None:
    from localrun.runtime.llama import decodes

    worker = model.local_worker()
    while not stopped.wait(HEARTBEAT_S):
        outbox.send("beat", worker.status(), worker.notices(), decodes())


def _answer(outbox: Outbox, ident: int, work: Any, *args: Any, **kwargs: Any) -> None:
    from localrun.errors import engine_failure

    try:
        result = work(*args, **kwargs)
    except Exception as exc:
        outbox.send("answered", ident, None, engine_failure(exc))
    else:
        outbox.send("answered", ident, result, None)


def _submit(outbox: Outbox, model: ServedModel, request: Any) -> None:
    from localrun.errors import engine_failure
    from localrun.serve.worker import Failed

    try:
        model.local_worker().submit(request, outbox.event)
    except Exception as exc:
        outbox.event(Failed(request.index, engine_failure(exc)))


def _take(message: tuple[Any, ...], model: ServedModel, outbox: Outbox) -> bool:
    """Do what the server asks; False when it asks the runner to stop."""
    kind: str = message[0]
    if kind == "submit":
        _submit(outbox, model, message[1])
    elif kind == "cancel":
        model.local_worker().cancel(message[1])
    elif kind == "ask":
        _, ident, what, args, kwargs = message
        if what in ASKS:
            _answer(outbox, ident, getattr(model.engine, what), *args, **kwargs)
        else:
            _answer(outbox, ident, _refuse, what)
    elif kind == "call":
        _, ident, handler, body = message
        threading.Thread(
            target=_answer, args=(outbox, ident, handler, model, body), name="localrun-runner-call", daemon=True
        ).start()
    return kind != "stop"


def _refuse(what: str) -> None:
    raise ValueError(f"not a question of the vocabulary: {what}")


def _load(conn: Connection, outbox: Outbox) -> ServedModel | None:
    """The model the server's plan names, loaded; None when the load failed
    (the server is told why) or the server is gone."""
    from localrun.errors import engine_failure
    from localrun.serve.served import load_model

    try:
        plan, run = conn.recv()
    except (EOFError, OSError):
        return None
    loading = threading.Event()
    threading.Thread(target=_loading, args=(outbox, loading), name="localrun-runner-loading", daemon=True).start()
    try:
        model = load_model(plan, run)
    except BaseException as exc:
        loading.set()
        outbox.send("failed", engine_failure(exc))
        return None
    loading.set()
    return model


def serve(conn: Connection) -> None:
    """Load the model the server sends, then take its requests until told to stop or it is gone."""
    from localrun.serve.heap import one_arena

    one_arena()
    pieces = _Pieces()
    outbox = Outbox(conn, on_gone=_gone, before_events=pieces)
    model = _load(conn, outbox)
    if model is None:
        outbox.close()
        return
    pieces.model = model
    outbox.send("loaded", model.loaded)
    stopped = threading.Event()
    threading.Thread(target=_beat, args=(outbox, model, stopped), name="localrun-runner-beat", daemon=True).start()
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                _gone()
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
