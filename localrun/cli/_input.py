"""Text the user gives a command (stdin, a prompt argument) checked as UTF-8:
a byte that is not names the input and its offset, instead of failing later
in the tokenizer with a position in the templated prompt."""

from __future__ import annotations

from localrun.cli._env import current
from localrun.errors import UsageError
from localrun.paths import why_failed

HINT = "localrun reads UTF-8 text: convert it first (e.g. iconv -f latin1 -t utf-8)"


def _decoded(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{what} is {why_failed(exc)}", hint=HINT) from None


def checked(text: str, what: str) -> str:
    """``text`` when it is UTF-8; Python keeps the bytes of an argument or a
    stream that are not as lone surrogates, which are turned back into them here."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        raw = text.encode("utf-8", errors="surrogateescape")
    except UnicodeEncodeError:  # a surrogate that no byte stands for
        raise UsageError(f"{what} holds a character UTF-8 cannot encode", hint=HINT) from None
    return _decoded(raw, what)


def read_stdin() -> str:
    """All of stdin, as UTF-8 text."""
    stdin = current().stdin
    buffer = getattr(stdin, "buffer", None)
    if buffer is not None:  # the bytes as they came, whatever the locale's decoding
        return _decoded(buffer.read(), "stdin")
    return checked(stdin.read(), "stdin")
