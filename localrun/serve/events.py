"""What a running server reports to whoever shows it (localrun/ui/serve.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Listening:
    url: str
    models: tuple[str, ...]
    parallel: int  # slots, all models together
    slot_ctx: int  # each slot's context (of the first model)
    flash_attn: str  # on, off, or auto where llama.cpp decides (of the first model)
    auth: bool  # whether requests need the API key (the key itself is never reported)


@dataclass(frozen=True)
class RequestDone:
    """One request answered (or refused, or given up by its client)."""

    method: str
    path: str
    status: int
    model: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    decode_tokens_per_s: float = 0.0
    elapsed_s: float = 0.0
    outcome: str = ""  # the finish reason, "disconnected", or the error message
    prompt: str | None = None  # what the run history keeps: the request's prompt (a chat's last user message)
    response: str | None = None  # ... and the text it was answered with
    ttft_s: float | None = None  # seconds to its first token (a generation that made one)


@dataclass(frozen=True)
class ServerStatus:
    slots: int
    busy: int
    queued: int
    done: int
    cancelled: int
    tokens_per_s: float  # all slots of all models together, recently


@dataclass(frozen=True)
class Stopping:
    in_flight: int
    grace_s: float


@dataclass(frozen=True)
class Notice:
    """Something the server got over but the user should know (a damaged
    prompt cache file, a full disk), or, not a ``warning``, what it did of
    itself (a model loaded or unloaded on demand)."""

    text: str
    warning: bool = True


ServeEvent = Listening | RequestDone | ServerStatus | Stopping | Notice
OnEvent = Callable[[ServeEvent], None]
