"""Text the user gives a command (stdin, a prompt argument) checked as UTF-8:
a byte that is not names the input and its offset, instead of failing later
in the tokenizer with a position in the templated prompt. And chat turns read
from piped lines, for local and remote chats alike."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from typing import NamedTuple

from localrun.cli._env import current
from localrun.errors import UsageError
from localrun.mcp.loop import CHOICES, asks_for_a_call
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


def stdin_is_piped() -> bool:
    """Whether stdin is a pipe or a file another command or a redirection gave
    (`cat notes.txt |`, `< notes.txt`), as opposed to a terminal or
    /dev/null: an empty one there means that command failed or the file is empty."""
    try:
        mode = os.fstat(current().stdin.fileno()).st_mode
    except (AttributeError, OSError, ValueError):  # no file descriptor (a StringIO): nothing piped in
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISREG(mode) or stat.S_ISSOCK(mode)


class Turn(NamedTuple):
    """A chat turn read from stdin."""

    number: int  # its line
    text: str
    tool_choice: str | None = None  # a JSONL turn's own: auto, required, none or a tool's name

    def without_tools(self) -> Turn:
        """The turn, in a chat with no tools: one that asks for a call is a UsageError."""
        if asks_for_a_call(self.tool_choice):
            raise UsageError(
                f"stdin line {self.number}: tool_choice {self.tool_choice!r} needs tools",
                hint="no MCP server offers one: give --mcp FILE, or add [mcp.servers.NAME] to config.toml",
            )
        return self


def read_turns(lines: Iterator[str]) -> Iterator[Turn]:
    """The user's messages from plain lines or JSONL. A line that starts
    with `{` is a JSON user message (``{"role": "user", "content": "..."}``,
    with its own ``tool_choice`` where it has one); once the first non-blank
    line was one, every line must be. A line that breaks this raises a
    UsageError naming it, after the turns before it were taken."""
    jsonl: bool | None = None
    for number, line in enumerate(lines, 1):
        text = line.rstrip("\n")
        if not text.strip():
            continue
        if jsonl is None:
            jsonl = text.lstrip().startswith("{")
        if jsonl or text.lstrip().startswith("{"):
            yield _user_message(number, text)
        else:
            yield Turn(number, text)


def _user_message(number: int, text: str) -> Turn:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"stdin line {number} is not valid JSON: {exc.msg}", hint="the input is JSONL") from None
    content = record.get("content") if isinstance(record, dict) else None
    if not isinstance(record, dict) or record.get("role", "user") != "user" or not isinstance(content, str):
        raise UsageError(f'stdin line {number} is not a user message: expected {{"role": "user", "content": "..."}}')
    return Turn(number, content, _tool_choice(number, record.get("tool_choice")))


def _tool_choice(number: int, given: object) -> str | None:
    """A JSONL turn's ``tool_choice``, as OpenAI's: a word, or ``{"type":
    "function", "function": {"name": ...}}`` (that tool's name)."""
    if given is None or isinstance(given, str):
        return given
    function = given.get("function") if isinstance(given, dict) and given.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or name in CHOICES:
        raise UsageError(
            f"stdin line {number}: tool_choice is auto, required, none, a tool's name, "
            'or {"type": "function", "function": {"name": ...}}'
        )
    return name
