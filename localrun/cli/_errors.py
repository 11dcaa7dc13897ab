"""The one place where errors become exit codes and one-line messages."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from enum import IntEnum

import typer

from localrun.errors import (
    BadModelError,
    ConfigError,
    ContextOverflowError,
    DownloadError,
    EngineError,
    LocalrunError,
    ModelNotFoundError,
    RegistryError,
    UsageError,
)


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
}


def exit_code_for(exc: LocalrunError) -> ExitCode:
    for cls in type(exc).__mro__:
        if cls in EXIT_CODES:
            return EXIT_CODES[cls]
    return ExitCode.ERROR


def debug_enabled(flag: bool = False) -> bool:
    return flag or os.environ.get("LOCALRUN_DEBUG", "") not in ("", "0")


@contextmanager
def error_boundary(debug: bool = False) -> Iterator[None]:
    """Turn core errors into `error: ...` / `hint: ...` on stderr and an exit code."""
    try:
        yield
    except LocalrunError as exc:
        if debug_enabled(debug):
            traceback.print_exc()
        sys.stderr.write(f"error: {exc.message}\n")
        if exc.hint:
            sys.stderr.write(f"hint: {exc.hint}\n")
        raise typer.Exit(int(exit_code_for(exc))) from None
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
    except BrokenPipeError:
        # the reader went away (`| head`): stop quietly, and keep Python from
        # complaining when it flushes stdout at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise typer.Exit(int(ExitCode.OK)) from None
