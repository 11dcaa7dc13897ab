"""llama.cpp's RPC backend: another process's devices over TCP.

An RPC server (`localrun rpc-server`, or llama.cpp's own `rpc-server`)
offers its machine's devices; a client that `register`s it sees each as a
GPU-type device named `RPC0`, `RPC1`, ... (its description: the server's
HOST:PORT) with the memory the server reports, and places layers on it like
on any GPU. That is how one model is spread over several machines' memory.
Every step's activations cross the socket, so on one machine it is slower
than the CPU alone.

The protocol has no authentication: a server listens on loopback unless
told otherwise (`check_bind`). A server serves one client at a time.

llama.cpp stops the process (GGML_ABORT) when a server cannot be reached or
goes away, so `register` first greets each server here, with a timeout, and
raises `RpcError`; a server lost mid-run reaches the ``on_lost`` callback
given to `register` before the process ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import ipaddress
import os
import socket
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from localrun.errors import RpcError, UsageError
from localrun.runtime import devices

CONNECT_TIMEOUT_S = 5.0  # to connect to a server and for its answer to the greeting
PROTOCOL_MAJOR = 7  # RPC_PROTO_MAJOR_VERSION in the pinned llama.cpp's ggml-rpc.h
PROTOCOL_MINOR = 0
DEFAULT_PORT = 50052  # llama.cpp's rpc-server's
_HELLO = 14  # RPC_CMD_HELLO: the first command of every connection, fixed across protocol versions
_CAPS = 24  # RPC_CONN_CAPS_SIZE: transport capabilities (RDMA), all zero for plain TCP
_TYPE_CPU, _TYPE_ACCEL = 0, 3  # enum ggml_backend_dev_type


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_servers(text: str) -> tuple[Endpoint, ...]:
    """`--rpc HOST:PORT[,HOST:PORT...]` (as llama.cpp's `--rpc` takes it)."""
    found: list[Endpoint] = []
    for part in (p.strip() for p in text.split(",")):
        host, colon, port = part.rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536 or ":" in host:
            raise UsageError(
                f"--rpc {part!r} is not HOST:PORT", hint="e.g. --rpc 192.168.1.20:50052 (comma-separated for more)"
            )
        found.append(Endpoint(host, int(port)))
    return tuple(dict.fromkeys(found))


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError("the server closed the connection")
        data += chunk
    return data


def greet(endpoint: Endpoint, timeout: float = CONNECT_TIMEOUT_S) -> tuple[int, int, int]:
    """The protocol version an RPC server at ``endpoint`` answers the
    greeting with (one connection, closed after); `RpcError` when it cannot
    be reached or does not answer within ``timeout`` seconds."""
    try:
        address = socket.gethostbyname(endpoint.host)  # IPv4, as llama.cpp resolves it
    except OSError as exc:
        raise RpcError(f"RPC server {endpoint}: cannot resolve {endpoint.host!r} ({exc})") from None
    try:
        sock = socket.create_connection((address, endpoint.port), timeout=timeout)
    except OSError as exc:  # refused, no route, or no answer to the connection within the timeout
        raise RpcError(
            f"cannot reach the RPC server at {endpoint}: {exc.strerror or exc}",
            hint=f"start one there with `localrun rpc-server --port {endpoint.port}`",
        ) from None
    try:
        with sock:
            sock.sendall(struct.pack("=BQ", _HELLO, _CAPS) + bytes(_CAPS))
            (size,) = struct.unpack("=Q", _recv(sock, 8))
            reply = _recv(sock, size) if size == 4 + _CAPS else b""
    except TimeoutError:
        raise RpcError(
            f"RPC server {endpoint} did not answer within {timeout:.0f} s",
            hint="a server serves one client at a time: is another run using it?",
        ) from None
    except OSError as exc:
        raise RpcError(f"RPC server {endpoint} broke off the greeting: {exc.strerror or exc}") from None
    if not reply:
        raise RpcError(
            f"{endpoint} does not answer as a llama.cpp RPC server of this version",
            hint="run `localrun rpc-server` there, of the same version",
        )
    return reply[0], reply[1], reply[2]


def check(endpoint: Endpoint, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """`greet` the server, and refuse a protocol version this build cannot speak."""
    major, minor, patch = greet(endpoint, timeout)
    if major != PROTOCOL_MAJOR or minor > PROTOCOL_MINOR:
        raise RpcError(
            f"the RPC server at {endpoint} speaks protocol {major}.{minor}.{patch}, "
            f"this build {PROTOCOL_MAJOR}.{PROTOCOL_MINOR}",
            hint="run the same llama.cpp version on both machines",
        )


@dataclass(frozen=True)
class _Api:
    registry: ctypes.CDLL  # libggml: the backend registry
    base: ctypes.CDLL  # libggml-base: devices, registries' procedures, the abort callback
    rpc: ctypes.c_void_p  # the RPC backend's registry


_ADD_SERVER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)
_START_SERVER = ctypes.CFUNCTYPE(
    None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)
)
_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)


@functools.cache
def _api() -> _Api:
    """The calls the RPC backend needs, with their C types; `RpcError` on a build without it."""
    devices.load_dynamic_backends()  # before anything registers: it loads them only onto a bare registry
    try:
        registry = devices.library("libggml.so")
        base = devices.library("libggml-base.so")
        void_p, text = ctypes.c_void_p, ctypes.c_char_p
        signatures: list[tuple[Any, tuple[Any, list[Any]]]] = [
            (registry.ggml_backend_reg_by_name, (void_p, [text])),
            (registry.ggml_backend_register, (None, [void_p])),
            (registry.ggml_backend_dev_by_name, (void_p, [text])),
            (registry.ggml_backend_dev_count, (ctypes.c_size_t, [])),
            (registry.ggml_backend_dev_get, (void_p, [ctypes.c_size_t])),
            (base.ggml_backend_reg_get_proc_address, (void_p, [void_p, text])),
            (base.ggml_backend_reg_dev_count, (ctypes.c_size_t, [void_p])),
            (base.ggml_backend_reg_dev_get, (void_p, [void_p, ctypes.c_size_t])),
            (base.ggml_backend_dev_name, (text, [void_p])),
            (base.ggml_backend_dev_type, (ctypes.c_int, [void_p])),
            (base.ggml_set_abort_callback, (void_p, [_ABORT_CALLBACK])),
        ]
        for function, (restype, argtypes) in signatures:
            function.restype, function.argtypes = restype, argtypes
    except (OSError, AttributeError):  # another platform's library names, or an older ggml
        raise RpcError("this build of llama.cpp has no RPC backend", hint="scripts/setup builds it") from None
    reg = registry.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise RpcError("this build of llama.cpp has no RPC backend", hint="scripts/setup builds it (GGML_RPC=ON)")
    return _Api(registry, base, ctypes.c_void_p(reg))


def _procedure(api: _Api, name: str, kind: Any) -> Any:
    address = api.base.ggml_backend_reg_get_proc_address(api.rpc, name.encode())
    if not address:
        raise RpcError(f"this build's RPC backend lacks {name}", hint="scripts/setup builds it")
    return kind(address)


_lock = threading.Lock()
_servers: dict[Endpoint, tuple[str, ...]] = {}  # each registered server's devices, as this process names them
_buffers: dict[str, str] = {}  # llama.cpp's buffer type name ("RPC0[HOST:PORT]") -> the device's ("RPC0")
_on_lost: list[Callable[[str], None]] = []
_abort_callback: list[Any] = []  # kept alive while ggml may call it


_LOST = ("RPC server", "Failed to connect to", "RPC handshake failed")  # what ggml-rpc aborts with


def _on_abort(message: bytes | None) -> None:
    """ggml is about to abort the process, from whichever thread failed (one
    that may hold anything, so nothing here waits for a lock): an RPC server
    lost goes to the ``on_lost`` callbacks (which may end the process their
    way); anything else is written as ggml would have written it."""
    text = (message or b"").decode("utf-8", errors="replace")
    if any(mark in text for mark in _LOST):
        servers = ", ".join(str(e) for e in list(_servers))
        for callback in list(_on_lost):
            with contextlib.suppress(Exception):  # the message below is written all the same
                callback(servers)
    with contextlib.suppress(OSError):
        os.write(2, f"{text}\n".encode())


def register(servers: Sequence[Endpoint], *, on_lost: Callable[[str], None] | None = None) -> tuple[str, ...]:
    """Add each server's devices to this process's (once per server), after
    greeting it; returns the names of their devices, in order. ``on_lost``
    (called with the servers' HOST:PORT list) hears of a server lost later,
    in whatever thread llama.cpp noticed it, before the process ends. Call it
    before the devices are probed."""
    for endpoint in servers:  # every one answers before any is added
        if endpoint not in _servers:
            check(endpoint)
    api = _api()
    add_server = _procedure(api, "ggml_backend_rpc_add_server", _ADD_SERVER)
    with _lock:
        if on_lost is not None and on_lost not in _on_lost:
            _on_lost.append(on_lost)
        if not _abort_callback:
            _abort_callback.append(_ABORT_CALLBACK(_on_abort))
            api.base.ggml_set_abort_callback(_abort_callback[0])
        new = [e for e in dict.fromkeys(servers) if e not in _servers]
        for endpoint in new:
            _servers[endpoint] = ()  # named in a message should llama.cpp lose it while adding it
    for endpoint in new:  # not under the lock: a server lost here aborts through _on_abort
        reg = add_server(str(endpoint).encode())
        if not reg:
            with _lock:
                del _servers[endpoint]
            raise RpcError(f"the RPC server at {endpoint} offers no devices")
        api.registry.ggml_backend_register(reg)
        handles = [api.base.ggml_backend_reg_dev_get(reg, i) for i in range(api.base.ggml_backend_reg_dev_count(reg))]
        names = tuple(_text(api.base.ggml_backend_dev_name(h)) for h in handles)
        with _lock:
            _buffers.update({f"RPC{i}[{endpoint}]": name for i, name in enumerate(names)})
            _servers[endpoint] = names
    return tuple(name for endpoint in servers for name in _servers[endpoint])


def buffer_device(name: str) -> str | None:
    """The device a buffer type of an RPC server's allocates on (llama.cpp
    names them by the server's device index and endpoint, `RPC0[HOST:PORT]`;
    this process names the devices in the order it registered them); None
    for another buffer type."""
    with _lock:
        return _buffers.get(name)


def _text(raw: bytes | None) -> str:
    return raw.decode("utf-8", errors="replace") if raw else ""


def is_loopback(host: str) -> bool:
    return ipaddress.ip_address(host).is_loopback


def check_bind(host: str, port: int, *, unauthenticated: bool) -> str:
    """The address a server is to listen on (llama.cpp's server takes an
    IPv4 address; "localhost" is 127.0.0.1), refused before anything starts
    when it cannot be listened on, or when other machines reach it and
    ``unauthenticated`` was not said: the protocol has no authentication."""
    host = "127.0.0.1" if host == "localhost" else host
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        raise UsageError(f"--host {host!r} is not an IPv4 address", hint="e.g. 127.0.0.1 or 192.168.1.20") from None
    if not 0 < port < 65536:
        raise UsageError("--port must be from 1 to 65535")
    if not is_loopback(host) and not unauthenticated:
        raise UsageError(
            f"--host {host} lets other machines use this one's devices and memory, and the RPC protocol has "
            "no authentication",
            hint="on a network you trust, add --unauthenticated to say you mean it",
        )
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as llama.cpp's server binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return host


@dataclass(frozen=True)
class ServerDevice:
    """A device a server offers: its name here, and its handle."""

    name: str
    handle: int


def server_devices(names: Sequence[str] = ()) -> tuple[ServerDevice, ...]:
    """The devices a server offers: those named (llama.cpp's names, as
    `localrun doctor` lists them), else every GPU, else the CPU, as
    llama.cpp's rpc-server chooses them."""
    api = _api()
    if names:
        found = []
        for name in names:
            handle = api.registry.ggml_backend_dev_by_name(name.encode())
            if not handle:
                listed = ", ".join(d.name for d in devices.backend_devices()) or "none"
                raise UsageError(f"no device {name!r} in this build or machine", hint=f"devices: {listed}")
            found.append(ServerDevice(_text(api.base.ggml_backend_dev_name(handle)), handle))
        return tuple(found)
    every = [api.registry.ggml_backend_dev_get(i) for i in range(api.registry.ggml_backend_dev_count())]
    gpus = [h for h in every if api.base.ggml_backend_dev_type(h) not in (_TYPE_CPU, _TYPE_ACCEL)]
    chosen = gpus or [h for h in every if api.base.ggml_backend_dev_type(h) == _TYPE_CPU][:1]
    return tuple(ServerDevice(_text(api.base.ggml_backend_dev_name(h)), h) for h in chosen)


def serve(host: str, port: int, threads: int, offered: Sequence[ServerDevice]) -> None:
    """Serve ``offered`` on ``host``:``port`` with ``threads`` CPU threads,
    until the process ends: llama.cpp's server loop never returns but when
    it cannot listen (then this returns)."""
    api = _api()
    start_server = _procedure(api, "ggml_backend_rpc_start_server", _START_SERVER)
    handles = (ctypes.c_void_p * len(offered))(*(d.handle for d in offered))
    start_server(f"{host}:{port}".encode(), None, threads, len(offered), handles)
