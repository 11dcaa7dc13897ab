"""Running the API: bind, serve with uvicorn until Ctrl-C or SIGTERM, then
stop accepting, let in-flight requests finish within a grace period (the
rest are cancelled), stop the engine threads and free the models. A second
Ctrl-C ends what is in flight at once; a third quits without waiting."""

from __future__ import annotations

import contextlib
import ipaddress
import signal
import socket
import threading
from collections.abc import Iterator
from types import FrameType

import uvicorn

from localrun.errors import UsageError
from localrun.serve.app import AppSettings, create_app
from localrun.serve.events import Listening, OnEvent, Stopping
from localrun.serve.router import ModelTable

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
GRACE_S = 10.0  # how long in-flight requests may run on after Ctrl-C or SIGTERM
BACKSTOP_S = 5  # uvicorn cancels what still runs this long after the grace period
STATUS_TICKS = 5  # uvicorn ticks every 0.1 s: a status every half second


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, api_key: str | None, no_auth: bool) -> None:
    """A server reachable from other machines needs a key, or an explicit --no-auth."""
    if api_key is not None and no_auth:
        raise UsageError("--api-key and --no-auth contradict each other", hint="give one of them")
    if api_key is not None and not api_key.strip():
        raise UsageError("--api-key is empty")
    if not is_loopback(host) and api_key is None and not no_auth:
        raise UsageError(
            f"--host {host} lets other machines call the server: it needs --api-key KEY",
            hint="or --no-auth to serve without a key on purpose",
        )


def bind(host: str, port: int) -> socket.socket:
    """The listening socket (port 0: one the system picks), or a usage error saying why not."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        raise UsageError(f"--host {host}: {exc.strerror}") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UsageError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}", hint="choose another --port"
        ) from None
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server, reporting when it listens, how it stands, and when it stops."""

    def __init__(
        self, config: uvicorn.Config, table: ModelTable, listening: Listening, on_event: OnEvent, grace_s: float
    ) -> None:
        super().__init__(config)
        self.grace_s = grace_s
        self.table = table
        self.listening = listening
        self.on_event = on_event
        self.signals = 0  # Ctrl-C or SIGTERM received
        self.cut_short = False  # a second Ctrl-C ended the requests in flight before the grace period did
        self._now = threading.Event()  # set by that second Ctrl-C
        self._stop = threading.Event()  # set by the first
        # started here, not from the signal handler: starting a thread takes a
        # lock that the code the signal interrupted may hold
        self._stopper = threading.Thread(target=self._stop_requests, name="serve-stop", daemon=True)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self._stopper.start()
            self.on_event(self.listening)

    async def on_tick(self, counter: int) -> bool:
        if counter % STATUS_TICKS == 0:
            self.on_event(self.table.status())
            for notice in self.table.notices():
                self.on_event(notice)
        self.table.tick()
        return await super().on_tick(counter)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Stop accepting; what is in flight has the grace period, then ends
        with an error saying why (uvicorn's own timeout, later, is a backstop).
        A second Ctrl-C ends it now, with the same error: uvicorn's own
        answer, a forced exit, would cancel each request mid-answer and log a
        traceback for it. A third one is uvicorn's forced exit."""
        # A second signal can arrive while this one is handled, and its handler
        # then runs inside this one: count first, and leave the rest to a thread.
        self.signals += 1
        if self.signals == 1:
            self.should_exit = True
            self._stop.set()
        elif sig == signal.SIGINT and not self.cut_short:
            self.cut_short = True
            self._now.set()
        elif sig == signal.SIGINT:
            self.force_exit = True

    def _stop_requests(self) -> None:
        """Say it stops, and end what is in flight after the grace period (or
        at a second Ctrl-C). On a thread of its own: `ModelTable.stop` waits for
        the engine threads, and showing an event takes a lock that the code
        the signal interrupted may hold."""
        self._stop.wait()
        status = self.table.status()
        self.on_event(Stopping(status.busy + status.queued, self.grace_s))
        if self._now.wait(self.grace_s):
            status = self.table.status()
            self.on_event(Stopping(status.busy + status.queued, 0.0))
        self.table.stop()


@contextlib.contextmanager
def _signals_handled() -> Iterator[None]:
    """While uvicorn runs, its handlers (`_Server.handle_exit`) take SIGINT
    and SIGTERM; once it has stopped, while the models are freed, a signal
    finds a handler that does nothing, so they are freed and the process
    exits normally."""
    previous = {sig: signal.signal(sig, lambda s, f: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def serve(
    table: ModelTable,
    settings: AppSettings,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    grace_s: float = GRACE_S,
    on_event: OnEvent,
) -> bool:
    """Serve ``table``'s models until a signal stops the server; the models
    are closed on return. True when a second Ctrl-C cut the requests short."""
    try:
        sock = bind(host, port)
        bound = sock.getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        first = table.models[0] if table.models else None  # none: each loads on demand
        listening = Listening(
            url=f"http://{shown}:{bound}",
            models=tuple(m.id for m in table.models) or tuple(e["id"] for e in table.describe()),
            parallel=sum(m.worker.parallel for m in table.models),
            slot_ctx=first.capacity if first else 0,
            flash_attn=first.loaded.flash_attn if first else "auto",
            auth=settings.api_key is not None,
        )
        config = uvicorn.Config(
            create_app(table, settings, on_event),
            log_level="warning",
            access_log=False,
            lifespan="off",
            server_header=False,
            timeout_graceful_shutdown=int(grace_s) + BACKSTOP_S,
        )
        server = _Server(config, table, listening, on_event, grace_s)
        with sock, _signals_handled():
            server.run(sockets=[sock])
        return server.cut_short
    finally:
        table.close()
