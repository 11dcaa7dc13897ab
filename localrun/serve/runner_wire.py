"""The wire between the server and a runner (`localrun.serve.runner`,
`localrun.serve.runner_process`): a Unix socket pair carrying pickled
tuples, each a kind and its fields.

Server to runner: ``(plan, run)`` first, then ``submit``
(a prepared request), ``cancel`` (its index), ``call`` (a number, a
handler and its body: run on the loaded model), ``ask`` (a number, a
vocabulary method, its arguments), ``stop``.

Runner to server: ``loading`` every `HEARTBEAT_S` while it loads, then
``loaded`` (what the load measured) or ``failed`` (the error); then
``events`` (a step's events, every request's), ``pieces`` (the text of the
tokens those events' log-probabilities name, sent before them), ``beat``
(its engine's status, its notices and its decodes so far, every
`HEARTBEAT_S`) and ``answered`` (a number, the result or the error).
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

HEARTBEAT_S = 1.0  # how often a runner says it is alive, and how far its engine has got
ASKS = frozenset({"tokenize", "piece", "detokenize", "is_eog", "token_text", "is_special"})  # of a vocabulary


class Outbox:
    """Messages to the other end, sent by a thread of their own: whoever
    sends never blocks on the socket (a peer that stopped reading cannot hold
    a lock its sender holds), and a message that cannot be pickled fails
    where it is sent (`pack`). Events queue up and go together, a step's
    tokens for every slot in one message; ``before_events`` may add a
    message to send ahead of them."""

    def __init__(
        self,
        conn: Connection,
        *,
        on_gone: Callable[[], None] = lambda: None,
        before_events: Callable[[list[Any]], tuple[Any, ...] | None] = lambda events: None,
    ) -> None:
        self.conn = conn
        self._on_gone = on_gone  # the other end closed: called once, on the sending thread
        self._before_events = before_events
        self._cond = threading.Condition()
        self._events: list[Any] = []
        self._queued: list[bytes] = []
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="localrun-runner-out", daemon=True)
        self._thread.start()

    @staticmethod
    def pack(*message: Any) -> bytes:
        return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)

    def put(self, packed: bytes) -> None:
        """Queue a message `pack` made."""
        with self._cond:
            self._queued.append(packed)
            self._cond.notify()

    def send(self, *message: Any) -> None:
        self.put(self.pack(*message))

    def event(self, event: Any) -> None:
        with self._cond:
            self._events.append(event)
            self._cond.notify()

    def close(self, timeout: float = 30.0) -> None:
        """Send what is queued, then nothing more."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._events or self._queued or self._closed):
                    self._cond.wait()
                events, self._events = self._events, []
                queued, self._queued = self._queued, []
                closed = self._closed
            try:
                for packed in queued:
                    self.conn.send_bytes(packed)
                if events:
                    ahead = self._before_events(events)
                    if ahead is not None:
                        self.conn.send_bytes(self.pack(*ahead))
                    self.conn.send_bytes(self.pack("events", events))
            except OSError:
                self._on_gone()
                return
            if closed:
                return
