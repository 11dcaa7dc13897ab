"""The one place where errors become exit codes and one-line messages."""

from __future__ import annotations

import contextlib
import difflib
import functools
import os
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from enum import IntEnum
from typing import Any, TypeVar

import typer

from localrun.cli import _aliases
from localrun.cli._env import current
from localrun.errors import (
    AgentNotInstalledError,
    BadModelError,
    ChatTemplateError,
    ConfigError,
    ContextOverflowError,
    DownloadError,
    EngineError,
    LocalrunError,
    ModelNotFoundError,
    RegistryError,
    RemoteError,
    RpcError,
    StreamCutError,
    TemplateFileError,
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
    RPC_FAILED = 12  # --rpc: an RPC server unreachable, of another version, or lost mid-run
    AGENT_NOT_INSTALLED = 127  # launch: the agent's program is not on PATH (a shell's "command not found")
    INTERRUPTED = 130


EXIT_CODES: dict[type[LocalrunError], ExitCode] = {
    UsageError: ExitCode.USAGE,
    ModelNotFoundError: ExitCode.MODEL_NOT_FOUND,
    BadModelError: ExitCode.BAD_MODEL,
    ChatTemplateError: ExitCode.BAD_MODEL,  # the template raised for this conversation
    TemplateFileError: ExitCode.USAGE,  # --template FILE: unreadable, or not a Jinja template
    ContextOverflowError: ExitCode.OUT_OF_CONTEXT,
    EngineError: ExitCode.ERROR,
    RegistryError: ExitCode.BAD_CONFIG,
    ConfigError: ExitCode.BAD_CONFIG,
    DownloadError: ExitCode.DOWNLOAD_FAILED,
    RemoteError: ExitCode.REMOTE_FAILED,
    StreamCutError: ExitCode.STREAM_CUT,
    RpcError: ExitCode.RPC_FAILED,
    AgentNotInstalledError: ExitCode.AGENT_NOT_INSTALLED,
}


# the hint an error of these types gets where the core gave none (the core does not know the command line)
HINTS: dict[type[LocalrunError], str] = {
    ChatTemplateError: "--template NAME|FILE renders with another template; generate --raw sends the prompt as is",
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


def report(error: LocalrunError) -> ExitCode:
    """`error: ...` and `hint: ...` on stderr; the exit code the error stands for."""
    env = current()
    env.stderr.write(f"error: {error.message}\n")
    hint = error.hint or next((HINTS[cls] for cls in type(error).__mro__ if cls in HINTS), None)
    if hint:
        env.stderr.write(f"hint: {hint}\n")
    return exit_code_for(error)


# what a typed option or argument takes, by pydantic's error type (Typer checks the values with it)
_TAKES = {
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "int_type": "a whole number",
    "float_parsing": "a number",
    "float_type": "a number",
    "bool_parsing": "true or false",
}


def _param_name(param: Any) -> str:
    if param is None:
        return "a value"
    if getattr(param, "param_type_name", "") == "option":
        return "/".join(param.opts)
    return str(param.name or "argument").upper()


def _sentence(text: str) -> str:
    """A message of Click's as a part of one of ours: no capital, no full stop."""
    text = text.strip().rstrip(".")
    return text[:1].lower() + text[1:]


def _bad_value(exc: Any) -> str:
    name = _param_name(exc.param)
    cause = exc.__cause__
    if not hasattr(cause, "errors"):  # a check of Click's own (a choice, a range)
        return f"{name}: {_sentence(exc.message)}"
    first = cause.errors()[0]
    value = first.get("input")
    takes = _TAKES.get(first["type"])
    if first["type"] in ("enum", "literal_error"):
        takes = f"one of {first.get('ctx', {}).get('expected', '')}"
    return f"{name} takes {takes}, not {value!r}" if takes else f"{name}: {value!r} is not a valid value"


_EXTRA = "Got unexpected extra argument(s) ("
_NO_COMMAND = "No such command "
CLOSE = 0.6  # difflib's own cutoff, on the names without their dashes


def _close_options(typed: str, possibilities: Iterable[str]) -> list[str]:
    """Click's near options, compared without their leading dashes: with them,
    any two long options share two characters, and `--bogus` is near `--verbose`."""
    bare = typed.lstrip("-")
    return sorted(p for p in possibilities if difflib.SequenceMatcher(None, bare, p.lstrip("-")).ratio() >= CLOSE)


def _no_command(ctx: Any, message: str, hint: str) -> tuple[str, str]:
    """Click's "No such command 'stats'." (and Typer's "Did you mean 'x'?"
    after it) as our error and hint: a command of a group of commands
    (`localrun logs stats`) is what was meant, before a near name."""
    text, _, maybe = message.partition(". Did you mean ")
    text = text.rstrip(".")
    name = text.removeprefix(_NO_COMMAND).strip("'\"")
    commands = getattr(getattr(ctx, "command", None), "commands", {})
    found = [
        f"{ctx.command_path} {group} {name}"
        for group, command in sorted(commands.items())
        if name in getattr(command, "commands", {})
    ]
    meant = " or ".join(found) or maybe.rstrip("?")
    return _sentence(text), f"did you mean {meant}? {hint}" if meant else hint


def parsing_error(exc: Exception) -> LocalrunError:
    """A command line Click could not parse, as one line and a hint, in place of
    Click's usage block and the checker's wording."""
    from typer._click.exceptions import BadParameter, MissingParameter, NoSuchOption

    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "localrun"
    hint = f"{command} --help shows the usage"
    message = getattr(exc, "message", str(exc))
    if isinstance(exc, MissingParameter):
        text = f"missing {_param_name(exc.param)}"
    elif isinstance(exc, BadParameter):
        text = _bad_value(exc)
    elif isinstance(exc, NoSuchOption):
        text = f"no such option {exc.option_name}"
        close = _close_options(exc.option_name, exc.possibilities or ())
        if close:
            hint = f"did you mean {' or '.join(close)}? {hint}"
        hint = _aliases.hint_for(ctx.info_name if ctx is not None else "", exc.option_name) or hint
    elif message.startswith(_EXTRA):
        extra = message[len(_EXTRA) : -1]
        text = f"unexpected extra argument{'s' if ' ' in extra else ''}: {extra}"
        prompt = ctx.params.get("prompt") if ctx is not None else None
        meant_ctx = _aliases.continue_hint(extra) if ctx is not None and ctx.params.get("continue_last") else None
        if meant_ctx:
            hint = meant_ctx
        elif prompt:
            import shlex

            hint = f"quote the prompt as one argument: {command} {shlex.quote(f'{prompt} {extra}')}"
    elif message.startswith(_NO_COMMAND):
        text, hint = _no_command(ctx, message, hint)
    elif "requires an argument" in message:
        text = f"{getattr(exc, 'option_name', 'the option')} needs a value"
    else:
        text = _sentence(message)
    return UsageError(text, hint=hint)


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
        raise typer.Exit(int(report(error))) from None


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
