"""A reply split into its content and its tool calls, whole or as far as
it has come: the text around the calls is content; each call names a
declared function and its arguments follow that function's schema; a call
that cannot be read or checked stays content, with the reason (for the
server's log). Nothing here raises on what a model wrote."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from localrun.structured.spec import json_problem
from localrun.structured.toolcalls.calls import Call, Function
from localrun.structured.toolcalls.families import Family
from localrun.structured.toolcalls.syntax import Context, Region


@dataclass
class Split:
    """``content``: the text that is no call, up to ``held``; ``calls``: those
    finished before ``held``; ``held``: where text still held back begins
    (the end of the text once the reply is finished)."""

    content: str
    calls: list[Call]
    held: int
    problems: list[str] = field(default_factory=list)


Memo = dict[tuple[str, str], "str | None"]


def _checked(region: Region, declared: dict[str, Function], memo: Memo) -> list[Call] | str:
    calls = []
    for written in region.calls:
        function = declared.get(written.name)
        if function is None:
            return f"no function is named {written.name!r}"
        args = written.arguments if written.arguments is not None else {}
        if not isinstance(args, dict):
            return f"{written.name}: the arguments are not an object"
        raw = json.dumps(args, ensure_ascii=False)
        key = (written.name, raw)
        if key not in memo:
            memo[key] = json_problem(function.parameters, raw)
        if (problem := memo[key]) is not None:
            return f"{written.name}: {problem}"
        calls.append(Call(written.name, args, raw))
    return calls


def _snippet(text: str) -> str:
    return text if len(text) <= 200 else text[:200] + "..."


def split(
    text: str, family: Family, functions: list[Function], *, final: bool = True, memo: Memo | None = None
) -> Split:
    """The content and the calls of ``text``; ``final`` False: more text may
    come, so what may still turn into a call is held back (and trailing
    spaces: the spaces next to a call are the layout's, not content).
    ``memo`` keeps the calls' checks for the next split of the same reply."""
    memo = {} if memo is None else memo
    declared = {f.name: f for f in functions}
    schemas: dict[str, Any] = {f.name: f.parameters for f in functions}
    ctx = Context(frozenset(declared), schemas, final)
    spans: list[tuple[int, int]] = []  # of the calls
    calls: list[Call] = []
    problems: list[str] = []
    pos = 0
    held = len(text)
    while pos < len(text):
        found = [r for finder in family.finders if (r := finder(text, pos, ctx)) is not None and r.start >= pos]
        if not found:
            break
        region = min(found, key=lambda r: r.start)
        if region.end < 0 and not final:
            held = region.start
            break
        if region.end < 0:  # nothing more will come: what might have begun a call did not
            pos = region.start + 1
            continue
        end = max(region.end, region.start + 1)
        checked = region.problem or _checked(region, declared, memo)
        if isinstance(checked, str):
            problems.append(
                f"{family.name}: a tool call left as text ({checked}): {_snippet(text[region.start : end])}"
            )
        else:
            calls += checked
            spans.append((region.start, end))
        pos = end
    content = []
    at = 0
    for start, end in spans:
        gap = text[at:start].rstrip()
        content.append(gap.lstrip() if at else gap)
        at = end
    tail = text[at:held]
    tail = tail.lstrip() if spans else tail
    if not final:
        stripped = tail.rstrip()
        held -= len(tail) - len(stripped)
        tail = stripped
    content.append(tail)
    return Split("".join(content), calls, held, problems)


def parse_calls(text: str, family: Family, functions: list[Function]) -> tuple[str, list[Call]]:
    """(the content, the valid calls) of a finished reply."""
    whole = split(text, family, functions)
    return whole.content, whole.calls
