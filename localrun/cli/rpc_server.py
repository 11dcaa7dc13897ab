"""`localrun rpc-server`: offer this machine's devices to other localrun (or
llama.cpp) processes over llama.cpp's RPC protocol, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Annotated

import typer

from localrun.cli import _options as opt
from localrun.cli._env import current
from localrun.cli._output import out
from localrun.errors import RpcError
from localrun.runtime.rpc import DEFAULT_PORT, PROTOCOL_MAJOR


def rpc_server_command(
    host: Annotated[
        str,
        typer.Option("--host", help="IPv4 address to listen on; other than loopback needs --unauthenticated."),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = DEFAULT_PORT,
    threads: Annotated[
        int | None,
        typer.Option("--threads", help="Threads of the CPU device (default: the physical cores).", show_default=False),
    ] = None,
    device: Annotated[
        list[str] | None,
        typer.Option(
            "--device",
            help="Offer this device (repeatable, or comma-separated; names as `localrun doctor` lists them). "
            "Default: every GPU, else the CPU.",
            show_default=False,
        ),
    ] = None,
    unauthenticated: Annotated[
        bool,
        typer.Option(
            "--unauthenticated",
            help="Listen on a non-loopback --host although the RPC protocol has no authentication: any "
            "machine that reaches the port can use this one's devices and memory.",
        ),
    ] = False,
    verbose: opt.Verbose = False,
) -> None:
    """Serve this machine's devices to `--rpc` clients (llama.cpp's RPC
    backend), so one model can be spread over several machines."""
    from localrun.runtime import devices, rpc
    from localrun.system import default_threads
    from localrun.units import human_bytes

    opt.check_positive(threads=threads)
    host = rpc.check_bind(host, port, unauthenticated=unauthenticated)
    names = [n.strip() for given in device or () for n in given.split(",") if n.strip()]
    offered = rpc.server_devices(names)
    memory = {d.name: d for d in devices.backend_devices()}
    listed = ", ".join(
        f"{d.name} ({human_bytes(memory[d.name].total)})" if d.name in memory else d.name for d in offered
    )
    _quiet_native_stdout(verbose)
    out().note(f"rpc-server: {listed} on {host}:{port} (protocol {PROTOCOL_MAJOR}, no authentication); Ctrl-C stops it")
    if not rpc.is_loopback(host):
        out().warn(f"any machine that reaches {host}:{port} can use this one's devices: keep it on a network you trust")
    _run_until_stopped(lambda: rpc.serve(host, port, threads or default_threads(), offered))
    raise RpcError(f"the RPC server could not listen on {host}:{port}")


def _quiet_native_stdout(verbose: bool) -> None:
    """llama.cpp's server writes its status to the process's stdout, which
    carries nothing a user asked for here: to stderr with --verbose, else nowhere."""
    env = current()
    env.stdout.flush()
    target = os.open(os.devnull, os.O_WRONLY) if not verbose else os.dup(2)
    os.dup2(target, 1)
    os.close(target)


def _run_until_stopped(server: Callable[[], None]) -> None:
    """Run ``server`` (llama.cpp's loop, which never returns while it serves)
    in a thread that never sees a signal, while this one waits for Ctrl-C or
    SIGTERM; then end the process at once (the loop cannot be stopped from
    outside), saying so. Returns when the loop returned by itself."""

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # a background job of a shell ignores it: left so
        signal.signal(signal.SIGINT, stop)
    blocked = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)  # the thread inherits the mask
    try:
        thread = threading.Thread(target=server, name="rpc-server", daemon=True)
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    try:
        while thread.is_alive():
            thread.join(0.5)
    except KeyboardInterrupt:
        out().note("rpc-server stopped")
        env = current()
        env.stderr.flush()
        os._exit(0)
