"""A TCP proxy on 127.0.0.1 that cuts connections below HTTP.

Each connection it accepts goes to ``upstream`` (host, port), with a fault
taken from ``faults`` in order (``default`` once the list is empty):

- ``pass``: bytes flow both ways until either side closes;
- ``reset:N``: forward N bytes of the server's answer, wait until the client's
  side has them all, then reset the connection (SO_LINGER 0: the client sees
  ECONNRESET once it has read them);
- ``close:N``: forward N bytes of the answer, then close cleanly (a truncated
  answer with no error);
- ``refuse``: close before any byte of an answer.

With ``only``, a fault is taken only by a connection whose first bytes from the
client contain it (``b"/blobs/"``: the file transfers); the others pass. A
connection that sends nothing (a reachability probe) takes no fault either.
``connections`` counts every accepted connection, ``faulted`` those given a
fault other than ``pass``.
"""

from __future__ import annotations

import contextlib
import fcntl
import select
import socket
import struct
import termios
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

FAULTS = ("pass", "reset", "close", "refuse")


def _parse(fault: str) -> tuple[str, int]:
    kind, _, n = fault.partition(":")
    if kind not in FAULTS or (kind in ("reset", "close")) != bool(n):
        raise ValueError(f"not a fault: {fault!r}")
    return kind, int(n or 0)


@dataclass
class TcpProxy:
    upstream: tuple[str, int]
    faults: list[str] = field(default_factory=list)
    default: str = "pass"
    only: bytes | None = None
    connections: int = 0
    faulted: int = 0
    port: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stopping: threading.Event = field(default_factory=threading.Event)
    _open: set[socket.socket] = field(default_factory=set)
    _handlers: list[threading.Thread] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _take(self, first: bytes) -> tuple[str, int]:
        with self._lock:
            if not first or (self.only is not None and self.only not in first):
                return "pass", 0
            kind, n = _parse(self.faults.pop(0) if self.faults else self.default)
            self.faulted += kind != "pass"
            return kind, n

    def _track(self, *socks: socket.socket) -> None:
        with self._lock:
            self._open.update(socks)

    def _close(self, sock: socket.socket, reset: bool = False) -> None:
        if reset:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        with self._lock:
            self._open.discard(sock)

    def _handle(self, client: socket.socket) -> None:
        self._track(client)
        try:
            first = client.recv(65536)
        except OSError:
            first = b""
        kind, limit = self._take(first)
        if not first or kind == "refuse":
            self._close(client)
            return
        try:
            server = socket.create_connection(self.upstream)
        except OSError:
            self._close(client, reset=True)
            return
        self._track(server)
        self._relay(client, server, first, kind, limit)

    def _relay(self, client: socket.socket, server: socket.socket, first: bytes, kind: str, limit: int) -> None:
        """Both ways in one thread (a socket another thread reads would not
        reset when closed); the answer is cut after ``limit`` bytes for a
        reset or a close."""
        sent = 0
        reading = [client, server]
        try:
            server.sendall(first)
            while kind == "pass" or sent < limit:
                ready, _, _ = select.select(reading, [], [], 0.05)
                if self._stopping.is_set():
                    break
                if client in ready:
                    request = client.recv(65536)
                    if request:
                        server.sendall(request)
                    else:  # the client is done asking: so is the server
                        server.shutdown(socket.SHUT_WR)
                        reading.remove(client)
                if server in ready:
                    answer = server.recv(65536 if kind == "pass" else min(65536, limit - sent))
                    if not answer:
                        break
                    client.sendall(answer)
                    sent += len(answer)
            if kind == "reset":
                self._drain(client)
        except OSError:
            pass
        self._close(server)
        self._close(client, reset=kind == "reset")

    def _drain(self, sock: socket.socket) -> None:
        """Wait until the peer has every byte sent (a reset throws away what is
        still queued here): the N bytes of ``reset:N`` all reach the client."""
        while not self._stopping.is_set():
            queued = struct.unpack("i", fcntl.ioctl(sock, termios.TIOCOUTQ, b"\0" * 4))[0]
            if queued == 0:
                return
            time.sleep(0.001)

    @contextmanager
    def serve(self) -> Iterator[TcpProxy]:
        """Listen on 127.0.0.1; on exit, stop and close every connection still open."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        listener.settimeout(0.05)
        self.port = listener.getsockname()[1]

        def accept() -> None:
            while not self._stopping.is_set():
                try:
                    client, _ = listener.accept()
                except TimeoutError:
                    continue
                except OSError:
                    break
                client.settimeout(None)
                handler = threading.Thread(target=self._handle, args=(client,), daemon=True)
                with self._lock:
                    self.connections += 1
                    self._handlers.append(handler)
                handler.start()

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stopping.set()
            thread.join()
            listener.close()
            with self._lock:
                left, handlers = list(self._open), list(self._handlers)
            for sock in left:  # wakes a handler waiting on it; the handler closes it
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            for handler in handlers:
                handler.join(timeout=5)
