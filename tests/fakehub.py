"""A fake Hugging Face Hub on 127.0.0.1 speaking what huggingface-hub's download code uses.

`HEAD|GET /{owner}/{repo}/resolve/{revision}/{file}` answers like the Hub does
for an LFS file: a 302 to a blob URL with `X-Repo-Commit`, `X-Linked-Etag` (the
sha256) and `X-Linked-Size`. The blob URL honours `Range`. `GET
/api/models/{owner}/{repo}/tree/{revision}` lists the files. Faults are injected
per test: drop the connection after N bytes (once), stall (headers, maybe some
bytes, then silence), lie about the size (in `X-Linked-Size` or in a blob's
`Content-Length`), append bytes past the file, corrupt the bytes, or 404. A
`Range` past the end is answered 416, as real servers do; a gated repo, 403
with the hub's `GatedRepo` error code.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class HubState:
    files: dict[str, dict[str, bytes]] = field(default_factory=dict)  # repo -> file -> data
    gated: set[str] = field(default_factory=set)  # repos whose files and listing need accepted terms (403)
    drop_after: int | None = None  # close the connection after this many body bytes, once
    corrupt: bool = False  # serve altered bytes (the advertised sha256 stays)
    seconds_per_mb: float = 0.0  # throttle blob bodies
    stalls: list[int] = field(
        default_factory=list
    )  # each blob GET takes the first: send that many body bytes, then nothing until the hub stops
    linked_size_lie: int = 0  # added to the X-Linked-Size the resolve answer announces
    length_lie: int = 0  # added to a blob's Content-Length (the body stays; the connection closes after it)
    extra: bytes = b""  # sent after the file's bytes, within the Content-Length
    stopping: threading.Event = field(default_factory=threading.Event)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)  # (method, path, Range)

    def add(self, repo: str, name: str, data: bytes) -> str:
        self.files.setdefault(repo, {})[name] = data
        return hashlib.sha256(data).hexdigest()

    def blobs(self) -> dict[str, bytes]:
        return {hashlib.sha256(d).hexdigest(): d for files in self.files.values() for d in files.values()}


def _entry(name: str, data: bytes) -> dict[str, object]:
    """A file as the hub's tree API lists it: a git oid and, for a model file, its LFS sha256."""
    entry: dict[str, object] = {
        "type": "file",
        "path": name,
        "size": len(data),
        "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(),
    }
    if name.endswith(".gguf"):
        entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
    return entry


def _tree(files: dict[str, bytes], folder: str, recursive: bool) -> list[dict[str, object]]:
    """The entries under ``folder``: every file below it (recursive), or its files and subfolders."""
    prefix = f"{folder.strip('/')}/" if folder.strip("/") else ""
    inside = {name: data for name, data in files.items() if name.startswith(prefix)}
    if recursive:
        return [_entry(name, data) for name, data in inside.items()]
    listing: list[dict[str, object]] = []
    folders: set[str] = set()
    for name, data in inside.items():
        rest = name[len(prefix) :]
        if "/" in rest:
            folders.add(prefix + rest.split("/")[0])
        else:
            listing.append(_entry(name, data))
    return listing + [{"type": "directory", "path": f, "oid": "0" * 40} for f in sorted(folders)]


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    def _send(self, status: int, headers: dict[str, str], body: bytes = b"", head: bool = False) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", headers.get("Content-Length", str(len(body))))
        self.end_headers()
        if not head and body:
            self.wfile.write(body)

    def _route(self, head: bool) -> None:
        state = self.server.state
        path = unquote(self.path.split("?")[0])
        state.requests.append((self.command, path, self.headers.get("Range")))
        parts = path.strip("/").split("/")
        if {"/".join(parts[:2]), "/".join(parts[2:4])} & state.gated:
            self._send(403, {"X-Error-Code": "GatedRepo", "X-Repo-Commit": COMMIT}, b"gated", head)
            return
        if len(parts) >= 5 and parts[2] == "resolve":
            repo, name = "/".join(parts[:2]), "/".join(parts[4:])
            data = state.files.get(repo, {}).get(name)
            if data is None:
                self._send(404, {"X-Repo-Commit": COMMIT, "X-Error-Code": "EntryNotFound"}, b"not found", head)
                return
            sha = hashlib.sha256(data).hexdigest()
            # the port the client reached (a proxy's, in front of this server)
            port = self.headers.get("Host", "").rpartition(":")[2] or str(self.server.server_address[1])
            self._send(
                302,
                {
                    # another host name for the same server, as the Hub redirects to its CDN
                    "Location": f"http://localhost:{port}/blobs/{sha}",
                    "X-Repo-Commit": COMMIT,
                    "X-Linked-Etag": f'"{sha}"',
                    "ETag": '"0000"',
                    "X-Linked-Size": str(len(data) + state.linked_size_lie),
                },
                head=head,
            )
            return
        if len(parts) == 2 and parts[0] == "blobs":
            self._blob(parts[1], head)
            return
        if len(parts) >= 6 and parts[:2] == ["api", "models"] and parts[4] == "tree":
            repo = "/".join(parts[2:4])
            if repo not in state.files:
                self._send(404, {"X-Error-Code": "RepoNotFound"}, b"repository not found", head)
                return
            query = parse_qs(urlsplit(self.path).query)
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            listing = _tree(state.files[repo], "/".join(parts[6:]), recursive)
            self._send(200, {"Content-Type": "application/json"}, json.dumps(listing).encode(), head)
            return
        self._send(404, {}, b"no route", head)

    def do_POST(self) -> None:
        """`POST /api/models/{owner}/{repo}/paths-info/{revision}`: what the tree says of the paths asked."""
        state = self.server.state
        path = unquote(self.path.split("?")[0])
        body = self.rfile.read(int(self.headers.get("Content-Length", "0") or 0)).decode()
        state.requests.append(("POST", path, None))
        parts = path.strip("/").split("/")
        repo = "/".join(parts[2:4])
        if len(parts) < 6 or parts[:2] != ["api", "models"] or parts[4] != "paths-info" or repo not in state.files:
            self._send(404, {}, b"no route")
            return
        asked = parse_qs(body).get("paths", [])
        listing = [e for e in _tree(state.files[repo], "", True) if e["path"] in asked]
        self._send(200, {"Content-Type": "application/json"}, json.dumps(listing).encode())

    def _blob(self, sha: str, head: bool) -> None:
        state = self.server.state
        data = state.blobs().get(sha)
        if data is None:
            self._send(404, {}, b"", head)
            return
        if state.corrupt:
            data = bytes(b ^ 0xFF for b in data[:64]) + data[64:]
        start = 0
        rng = self.headers.get("Range")
        status = 200
        if rng and rng.startswith("bytes="):
            start = int(rng[6:].split("-")[0] or 0)
            status = 206
            if start >= len(data):
                self._send(416, {"Content-Range": f"bytes */{len(data)}"}, head=head)
                return
        body = data[start:] + state.extra
        headers = {"Content-Length": str(max(0, len(body) + state.length_lie)), "Accept-Ranges": "bytes"}
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        if head:
            self._send(status, headers, head=True)
            return
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self._body(body)

    def _body(self, body: bytes) -> None:
        """Send a blob's body, with the faults the state asks for."""
        state = self.server.state
        cut: int | None = None
        if state.stalls:
            self.wfile.write(body[: state.stalls.pop(0)])
            self.wfile.flush()
            state.stopping.wait(60)
            self.close_connection = True
            return
        if state.drop_after is not None:
            cut, state.drop_after = state.drop_after, None
        if cut is not None or state.length_lie:
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        if not state.seconds_per_mb:
            self.wfile.write(body)
            return
        for start in range(0, len(body), 1 << 20):
            self.wfile.write(body[start : start + (1 << 20)])
            time.sleep(state.seconds_per_mb)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, state: HubState) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = state

    def handle_error(self, request: object, client_address: object) -> None:
        """Quiet: a client that hangs up mid-body is what the fault tests do (and
        an in-process test captures sys.stderr, where the default prints)."""


@contextmanager
def serve(state: HubState) -> Iterator[str]:
    """Run the hub; yields its endpoint URL."""
    server = _Server(state)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        state.stopping.set()  # ends the stalls
        server.shutdown()
        server.server_close()
