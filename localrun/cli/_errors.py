"""The one place where errors become exit codes and one-line messages."""

from __future__ import annotations

import contextlib
import functools
import os
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import IntEnum
from typing import Any, TypeVar

import typer

from localrun.cli._env import current
from localrun.errors import (
    BadModelError,
    ConfigError,
    ContextOverflowError,
    DownloadError,
    EngineError,
    LocalrunError,
    ModelNotFoundError,
    RegistryError,
    RemoteError,
    StreamCutError,
    UsageError,
)
from localrun.paths import why_failed


class ExitCode(IntEnum):
    OK = 0
    ERROR = 1
    USAGE = 2
    MODEL_NOT_FOUND = 3
    BAD_MODEL = 4
    OUT_OF_CONTEXT = 5
    BAD_CONFIG = 6
    DOWNLOAD_FAILED = 7
    BATCH_FAILED = 8  # generate --batch: some lines failed (each has an error record)
    INVALID_OUTPUT = 9  # --schema/--grammar: the text does not follow it (cut by --max-tokens, or failed the check)
    REMOTE_FAILED = 10  # a remote server: unreachable, timed out, refused the API key, or failed
    STREAM_CUT = 11  # a remote's answer stopped mid-way (the text before it was written)
    INTERRUPTED = 130


EXIT_CODES: dict[type[LocalrunError], ExitCode] = {
    UsageError: ExitCode.USAGE,
    ModelNotFoundError: ExitCode.MODEL_NOT_FOUND,
    BadModelError: ExitCode.BAD_MODEL,
    ContextOverflowError: ExitCode.OUT_OF_CONTEXT,
    EngineError: ExitCode.ERROR,
    RegistryError: ExitCode.BAD_CONFIG,
    ConfigError: ExitCode.BAD_CONFIG,
    DownloadError: ExitCode.DOWNLOAD_FAILED,
    RemoteError: ExitCode.REMOTE_FAILED,
    StreamCutError: ExitCode.STREAM_CUT,
}


def exit_code_for(exc: LocalrunError) -> ExitCode:
    for cls in type(exc).__mro__:
        if cls in EXIT_CODES:
            return EXIT_CODES[cls]
    return ExitCode.ERROR


def as_user_error(exc: BaseException) -> LocalrunError | None:
    """The one-line form of an error the user can act on: localrun's own, or
    a failure of a file or value the user gave (a missing folder, a read-only
    file, text that is not UTF-8)."""
    if isinstance(exc, LocalrunError):
        return exc
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return LocalrunError(f"{where}{exc.strerror or exc}", hint="check the path and its permissions")
    if isinstance(exc, UnicodeDecodeError):  # a reader that did not say which file: at least say what is wrong
        return UsageError(f"a file given is {why_failed(exc)}", hint="give UTF-8 text")
    if isinstance(exc, ValueError):
        return UsageError(str(exc))
    return None


def describe(exc: LocalrunError) -> str:
    """`message (hint)` on one line, for places that keep going (the chat prompt)."""
    return exc.message + (f" ({exc.hint})" if exc.hint else "")


_debug = False


def set_debug(flag: bool) -> None:
    global _debug
    _debug = flag


def debug_enabled() -> bool:
    return _debug or os.environ.get("LOCALRUN_DEBUG", "") not in ("", "0")


@contextmanager
def error_boundary() -> Iterator[None]:
    """Turn errors into `error: ...` / `hint: ...` on stderr and an exit code;
    a traceback only with --debug or LOCALRUN_DEBUG=1."""
    env = current()
    try:
        yield
    except KeyboardInterrupt:
        env.stderr.write("interrupted\n")
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
    except BrokenPipeError:
        # the reader went away (`| head`): stop quietly, and keep Python from
        # complaining when it flushes stdout at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        with contextlib.suppress(OSError, ValueError):  # a stream with no file descriptor
            os.dup2(devnull, env.stdout.fileno())
        raise typer.Exit(int(ExitCode.OK)) from None
    except (LocalrunError, OSError, ValueError) as exc:
        error = as_user_error(exc)
        if error is None:
            raise
        if debug_enabled():
            traceback.print_exc(file=env.stderr)
        env.stderr.write(f"error: {error.message}\n")
        if error.hint:
            env.stderr.write(f"hint: {error.hint}\n")
        raise typer.Exit(int(exit_code_for(error))) from None


F = TypeVar("F", bound=Callable[..., Any])


def bounded(command: F) -> F:
    """``command`` run inside the error boundary (Typer reads the wrapped signature)."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        with error_boundary():
            code = command(*args, **kwargs)
        if code:
            raise typer.Exit(int(code))

    return run  # type: ignore[return-value]
