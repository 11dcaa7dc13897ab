"""Typed errors raised by the core. The CLI maps each type to an exit code."""

from __future__ import annotations


class LocalrunError(Exception):
    """An error the user can act on: a one-line message and an optional hint."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(LocalrunError):
    """Bad arguments or input: an empty prompt, an impossible option."""


class ModelNotFoundError(LocalrunError):
    """The model named does not exist where it was looked for."""


class BadModelError(LocalrunError):
    """The file exists but is not a model llama.cpp can load."""


class ChatTemplateError(BadModelError):
    """A chat template raised for the conversation it was given (Mistral's
    "tool call ids must be 9 characters"): the request's fault where a server
    answers (400, as llama-server does), not the server's."""


class TemplateFileError(UsageError):
    """``--template FILE``: a file that cannot be read, or not a Jinja template that compiles."""


class InvalidRequestError(UsageError):
    """A request to the server that cannot be served as sent: ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.param = param


class ContextOverflowError(LocalrunError):
    """The prompt does not fit in the context window (``n_prompt`` tokens, ``n_ctx`` the window, when known)."""

    def __init__(
        self, message: str, hint: str | None = None, *, n_prompt: int | None = None, n_ctx: int | None = None
    ) -> None:
        super().__init__(message, hint)
        self.n_prompt = n_prompt
        self.n_ctx = n_ctx


class ServerBusyError(LocalrunError):
    """Every slot is busy and the queue is full: try again later."""


class AuthenticationError(LocalrunError):
    """A request without the server's API key."""


class EngineError(LocalrunError):
    """llama.cpp failed to do what was asked (context creation, decode)."""


def engine_failure(exc: BaseException) -> LocalrunError:
    """``exc`` as what a failed request is told: a typed error as it is,
    anything else as an EngineError saying what the engine raised."""
    return exc if isinstance(exc, LocalrunError) else EngineError(f"the engine failed: {exc}")


class RegistryError(LocalrunError):
    """A models.toml file is broken: which file, which entry, why."""


class ConfigError(LocalrunError):
    """The user's config.toml is broken: which file, which key, why."""


class DownloadError(LocalrunError):
    """A model could not be fetched or failed verification."""


class SourceUnreachableError(DownloadError):
    """A source could not be reached at all (DNS, connection refused): try the next one."""


class IncompatibleDraftError(UsageError):
    """A draft model whose vocabulary differs from the target's: it cannot draft for it."""


class MTPUnavailableError(UsageError):
    """``--spec mtp`` where the model cannot draft for itself: it has no MTP
    ("nextn") layers, was loaded without them, or this llama.cpp build lacks a
    call MTP drafting needs."""


class RemoteError(LocalrunError):
    """A remote server could not answer: unreachable, timed out, failed, or refused the key."""


class RemoteUnavailableError(RemoteError):
    """The remote cannot serve at all: unreachable, or it refused the API key."""


class StreamCutError(RemoteError):
    """A remote's answer stopped mid-way, after some of it came."""


class RpcError(LocalrunError):
    """An RPC server (llama.cpp's RPC backend) could not be reached, answered wrongly, or went away."""


class AgentNotInstalledError(LocalrunError):
    """`localrun launch`: the agent's program is not on PATH."""


class LaunchError(LocalrunError):
    """`localrun launch`: the server it started did not come up, or the agent could not be run."""
