"""Calls in messages addressed to a recipient: Functionary v3.2's
``>>>NAME`` lines, Muse Glimmer's ``to=NAME<|message|>`` headers."""

from __future__ import annotations

import re

from localrun.structured.toolcalls.syntax import Context, Region, Written, find_marker, not_calls, still_open
from localrun.structured.toolcalls.values import INCOMPLETE, read_object, skip_space

# ------------------------------------------------- Functionary v3.2 --


def _recipient(text: str, at: int, ctx: Context) -> tuple[str, int] | str | None:
    """``NAME\\n`` at ``at``: the recipient and where its line ends; None:
    the text stops before the line does and the name may still be one."""
    line_end = text.find("\n", at)
    if line_end < 0:
        rest = text[at:]
        if any(name.startswith(rest) for name in (*ctx.names, "all")):
            return None if not ctx.final else "the call is cut short"
        return "not a recipient"
    return text[at:line_end].strip(), line_end + 1


def _message(text: str, start: int, at: int, ctx: Context) -> Region | None:  # noqa: PLR0911  one way out for each way the text may stand
    """One Functionary message from ``at`` (its region from ``start``): a
    recipient's line and, for a function, its JSON arguments."""
    if at >= len(text):
        return None if ctx.final else still_open(start)
    head = _recipient(text, at, ctx)
    if head is None:
        return still_open(start)
    if isinstance(head, str):
        return None
    name, body = head
    if name == "all":
        return Region(start, body)  # text to the user follows: the line is no content
    if name not in ctx.names:
        return None
    found = read_object(text, body)
    if found == INCOMPLETE:
        return None if ctx.final else still_open(start)
    if isinstance(found, str):
        return not_calls(start, len(text), "the arguments are not JSON")
    if not ctx.final and skip_space(text, found[1]) >= len(text):
        return still_open(start)  # stray braces may follow
    return Region(start, found[1], (Written(name, found[0]),))


def functionary(text: str, pos: int, ctx: Context) -> Region | None:
    """Functionary v3.2: each message opens with its recipient on a line of
    its own (``all`` for text to the user, else a function and its JSON
    arguments), the next one after ``>>>``. The generation prompt writes the
    first ``>>>``; the recipient lines are no content."""
    if pos == 0 and (first := _message(text, skip_space(text, 0), skip_space(text, 0), ctx)) is not None:
        return first
    while True:
        start, whole = find_marker(text, pos, ">>>")
        if start < 0:
            return None
        if not whole:
            return still_open(start)
        if (found := _message(text, start, start + 3, ctx)) is not None:
            return found
        pos = start + 3


# ------------------------------------------------------------ Muse Glimmer --

_MUSE_HEADER = re.compile(r"(?:<\|start\|>assistant)?\s*to=[\w.\-]+<\|message\|>")


def recipient_header(text: str, pos: int, ctx: Context) -> Region | None:
    """Muse Glimmer's message header ``[<|start|>assistant] to=NAME<|message|>``:
    the layout of a call's message, no content."""
    while True:
        starts = [a for a in (find_marker(text, pos, "<|start|>")[0], find_marker(text, pos, " to=")[0]) if a >= 0]
        if not starts:
            return None
        start = min(starts)
        match = _MUSE_HEADER.match(text, start)
        if match is not None:
            return Region(start, match.end())
        rest = text[start:]
        if not ctx.final and "<|message|>" not in rest and len(rest) < 80 and "\n" not in rest:
            return still_open(start)
        pos = start + 1
