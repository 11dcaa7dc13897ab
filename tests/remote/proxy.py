"""A fault-injecting HTTP proxy on 127.0.0.1 in front of a real server.

Each POST takes the next fault from ``faults`` (then passes through):
- ``pass``: forwarded as is;
- ``429`` / ``503``: answered with that status and ``Retry-After: 1``;
- ``401``: answered as a server that refuses the key;
- ``reset``: the connection reset before any answer;
- ``cut:N``: the answer forwarded, the connection reset after N events;
- ``end:N``: the answer forwarded, the connection closed cleanly after N events;
- ``stall`` / ``stall:N``: nothing (or N events), then silence until the proxy closes;
- ``plain``: forwarded without its ``response_format`` (a server that ignores it).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

HOP_HEADERS = {"transfer-encoding", "content-length", "connection", "keep-alive"}


class _Reset(Exception):
    pass


class Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _reset(self) -> None:
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        raise _Reset

    def _answer(self, status: int, body: dict[str, Any], **headers: str) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _upstream(self, method: str, body: bytes | None) -> http.client.HTTPResponse:
        url = urlsplit(self.server.proxy.upstream)
        self.upstream = http.client.HTTPConnection(url.hostname or "", url.port, timeout=120)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS | {"host"}}
        self.upstream.request(method, self.path, body, headers)
        return self.upstream.getresponse()

    def do_GET(self) -> None:
        self.server.proxy.seen.append(("GET", self.path, None, dict(self.headers)))
        response = self._upstream("GET", None)
        data = response.read()
        self.upstream.close()
        self.send_response(response.status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        proxy = self.server.proxy
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        fault = proxy.next_fault()
        proxy.seen.append(("POST", self.path, json.loads(body or b"null"), dict(self.headers)))
        kind, _, count = fault.partition(":")
        try:
            if kind in ("429", "503"):
                error = {"message": "busy, come back later", "type": "server_error", "code": None}
                self._answer(int(kind), {"error": error}, **{"Retry-After": "1"})
            elif kind == "401":
                self._answer(401, {"error": {"message": "invalid api key", "type": "invalid_request_error"}})
            elif kind == "reset":
                self._reset()
            elif kind == "stall" and not count:
                proxy.released.wait(120)
            else:
                if kind == "plain":
                    request = json.loads(body)
                    request.pop("response_format", None)
                    body = json.dumps(request).encode()
                self._forward(body, kind, int(count) if count else None)
        except _Reset:
            pass

    def _forward(self, body: bytes, kind: str, events: int | None) -> None:
        response = self._upstream("POST", body)
        self.send_response(response.status)
        for name, value in response.getheaders():
            if name.lower() not in HOP_HEADERS:
                self.send_header(name, value)
        self.end_headers()
        sent = 0
        try:
            while line := response.readline():
                if events is not None and sent >= events and line.startswith(b"data:"):
                    if kind == "cut":
                        self._reset()
                    if kind == "stall":
                        self.wfile.flush()
                        self.server.proxy.released.wait(120)
                    return  # end: the connection closes cleanly, the stream unfinished
                self.wfile.write(line)
                self.wfile.flush()
                sent += line.startswith(b"data:")
        finally:
            response.close()
            self.upstream.close()

    def finish(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # the connection was reset on purpose
            super().finish()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    proxy: FaultProxy

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


class FaultProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.faults: list[str] = []
        self.seen: list[tuple[str, str, Any, dict[str, str]]] = []
        self.lock = threading.Lock()
        self.released = threading.Event()
        self.server = _Server(("127.0.0.1", 0), Handler)
        self.server.proxy = self
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def next_fault(self) -> str:
        with self.lock:
            return self.faults.pop(0) if self.faults else "pass"

    def posts(self) -> list[Any]:
        return [body for method, _, body, _ in self.seen if method == "POST"]

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()
