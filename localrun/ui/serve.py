"""Show a running server on stderr: on a terminal, a live status line (slots
busy, queue, aggregate tokens/sec, requests done) with a line per request
above it; otherwise plain log lines, with no status ticks."""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import TextIO

from rich.console import Console
from rich.live import Live
from rich.text import Text

from localrun.serve.events import Listening, Notice, RequestDone, ServeEvent, ServerStatus, Stopping
from localrun.units import count


def listening_line(ev: Listening) -> str:
    auth = "API key required" if ev.auth else "no API key"
    attention = (
        "flash attention as llama.cpp decides" if ev.flash_attn == "auto" else f"flash attention {ev.flash_attn}"
    )
    slots = f"{count(ev.parallel, 'slot')} of {ev.slot_ctx} tokens" if ev.parallel else "loaded on demand"
    models = ", ".join(ev.models) or "each model once it is pulled"
    return f"serving {models} on {ev.url}/v1 ({slots}, {attention}, {auth}); Ctrl-C stops"


def request_line(ev: RequestDone) -> str:
    head = f"{ev.method} {ev.path} {ev.status}"
    if ev.model is None:
        return f"{head} {ev.outcome}".rstrip()
    cached = f" ({ev.cached_tokens} cached)" if ev.cached_tokens else ""
    rate = f" at {ev.decode_tokens_per_s:.1f} tok/s" if ev.decode_tokens_per_s else ""  # none for one cut short
    return (
        f"{head} {ev.model}: prompt {ev.prompt_tokens}{cached}, {count(ev.generated_tokens, 'token')}{rate}, "
        f"{ev.elapsed_s:.2f}s, {ev.outcome}"
    )


def status_line(ev: ServerStatus) -> str:
    return (
        f"slots {ev.busy}/{ev.slots} busy, {ev.queued} queued, {ev.tokens_per_s:.1f} tok/s, "
        f"{ev.done} done, {ev.cancelled} cancelled"
    )


def stopping_line(ev: Stopping) -> str:
    if not ev.in_flight:
        return "stopping"
    return f"stopping: {ev.in_flight} request(s) in flight get up to {ev.grace_s:g}s to finish"


class ServeView:
    """Takes the server's events (from any thread) and shows them."""

    def __init__(self, stream: TextIO, *, terminal: bool) -> None:
        self.stream = stream
        self.terminal = terminal
        self.lock = threading.Lock()
        self.live: Live | None = None
        if terminal:
            console = Console(file=stream, highlight=False)
            self.live = Live(Text(""), console=console, transient=True, auto_refresh=False)

    def __enter__(self) -> ServeView:
        if self.live is not None:
            self.live.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.live is not None:
            self.live.stop()

    def _line(self, text: str) -> None:
        if self.live is not None:
            self.live.console.print(text, markup=False, highlight=False)
        else:
            self.stream.write(f"{time.strftime('%H:%M:%S')} {text}\n")
            self.stream.flush()

    def handle(self, ev: ServeEvent) -> None:
        with self.lock:
            if isinstance(ev, ServerStatus):
                if self.live is not None:
                    self.live.update(Text(status_line(ev), style="dim"), refresh=True)
            elif isinstance(ev, Listening):
                self._line(listening_line(ev))
            elif isinstance(ev, RequestDone):
                self._line(request_line(ev))
            elif isinstance(ev, Notice):
                self._line(f"{'warning' if ev.warning else 'note'}: {ev.text}")
            else:
                self._line(stopping_line(ev))
