"""Where calls are in a reply, for the families with syntax of their own:
Mistral's ``[TOOL_CALLS]NAME[ARGS]{...}``, DeepSeek's special-token
markers, gpt-oss's harmony messages to ``functions.NAME``, Gemma 4's
``<|tool_call>call:NAME{...}``. The finders answer as those of `syntax` do."""

from __future__ import annotations

import re

from localrun.structured.toolcalls.syntax import (
    Context,
    Region,
    Written,
    expect,
    find_marker,
    marker_then_json,
    not_calls,
    still_open,
)
from localrun.structured.toolcalls.values import INCOMPLETE, INVALID, gemma_value, read_object, skip_space

# -------------------------------------------------------- Mistral's [ARGS] --


_MISTRAL_NAME = re.compile(r"\s*([A-Za-z0-9_.\-]+)")
_CALL_ID = re.compile(r"[A-Za-z0-9]*")


def _mistral_head(text: str, at: int) -> tuple[str, int] | str:
    """``NAME[ARGS]`` or ``NAME[CALL_ID]id[ARGS]`` at ``at``: the name, and where the arguments begin."""
    name = _MISTRAL_NAME.match(text, at)
    if name is None:
        return INCOMPLETE if skip_space(text, at) >= len(text) else INVALID
    i = name.end()
    if text.startswith("[CALL_ID]", i):
        i = _CALL_ID.match(text, i + len("[CALL_ID]")).end()  # type: ignore[union-attr]
    elif i < len(text) and "[CALL_ID]".startswith(text[i:]):
        return INCOMPLETE
    if i >= len(text):
        return INCOMPLETE
    end = expect(text, i, "[ARGS]")
    return end if isinstance(end, str) else (name.group(1), end)


def _cut_short(text: str, start: int, ctx: Context, calls: list[Written]) -> Region | None:
    """A call whose arguments the text cuts short: more text may come
    (streaming), or None when the calls before it stand, or none are calls."""
    if not ctx.final:
        return still_open(start)
    if calls:
        return None
    return not_calls(start, len(text), "the call is cut short")


def mistral(text: str, pos: int, ctx: Context) -> Region | None:  # noqa: C901, PLR0911, PLR0912  one way out for each way the text may stand
    """``[TOOL_CALLS]`` then a JSON list of calls (Mistral Nemo), or
    ``NAME[ARGS]{...}`` with an optional ``[CALL_ID]id`` (Mistral Small 3.2,
    Devstral, Ministral 3), each call with its own marker or one for all."""
    marker = "[TOOL_CALLS]"
    start, whole = find_marker(text, pos, marker)
    if start < 0:
        return None
    if not whole:
        return still_open(start)
    i = skip_space(text, start + len(marker))
    if i >= len(text):
        return None if ctx.final else still_open(start)
    if text[i] in "[{":
        return marker_then_json(marker)(text, start, ctx)
    calls: list[Written] = []
    end = i
    while True:
        head = _mistral_head(text, i)
        if head == INCOMPLETE and not ctx.final:
            return still_open(start)
        if isinstance(head, str):
            break
        found = read_object(text, head[1])
        if found == INCOMPLETE:
            if (cut := _cut_short(text, start, ctx, calls)) is None:
                break
            return cut
        if isinstance(found, str):
            return not_calls(start, len(text), "the arguments are not JSON")
        calls.append(Written(head[0], found[0]))
        end = found[1]
        i = skip_space(text, end)
        if text.startswith(marker, i):
            i += len(marker)
        elif not ctx.final and marker.startswith(text[i:]):
            return still_open(start)  # another call may follow
        else:
            break
    if not calls:
        return not_calls(start, len(text) if ctx.final else i, "no call after [TOOL_CALLS]")
    return Region(start, end, tuple(calls))


def name_then_json(text: str, pos: int, ctx: Context) -> Region | None:
    """Declared NAMEs each followed by its JSON arguments, opening the reply:
    Mistral's ``[TOOL_CALLS]NAME[ARGS]{...}`` where ``[TOOL_CALLS]`` and
    ``[ARGS]`` render as nothing. With any text after them they are not
    calls, so they are held back to the end."""
    start = skip_space(text, pos)
    if text[:start].strip() or start >= len(text):
        return None
    calls: list[Written] = []
    i = start
    while i < len(text):
        head = _declared_name(text, i, ctx)
        if head == INCOMPLETE and not ctx.final:
            return still_open(start)
        if isinstance(head, str):
            return None
        found = read_object(text, head[1])
        if found == INCOMPLETE:
            return not_calls(start, len(text), "the call is cut short") if ctx.final else still_open(start)
        if isinstance(found, str):
            return None
        calls.append(Written(head[0], found[0]))
        i = skip_space(text, found[1])
    return Region(start, len(text), tuple(calls)) if ctx.final else still_open(start)


def _declared_name(text: str, at: int, ctx: Context) -> tuple[str, int] | str:
    """A declared name followed by ``{`` at ``at``: the name and where its ``{`` is."""
    for name in ctx.names:
        if text.startswith(name, at):
            brace = skip_space(text, at + len(name))
            if brace >= len(text):
                return INCOMPLETE
            if text[brace] == "{":
                return name, brace
    return INCOMPLETE if any(name.startswith(text[at:]) for name in ctx.names) else INVALID


# ------------------------------------------------------- DeepSeek R1 and V3 --

DS_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
DS_CALLS_END = "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN = "<｜tool▁call▁begin｜>"
DS_CALL_END = "<｜tool▁call▁end｜>"
DS_SEP = "<｜tool▁sep｜>"
_DS_FENCE = re.compile(r"\s*```(?:json)?\s*\n?")


def _deepseek_call(body: str) -> Written | str:
    """One call between DeepSeek's call markers: R1's ``function<sep>NAME``
    and a fenced JSON block, or V3.1's ``NAME<sep>`` and the JSON itself."""
    left, sep, right = body.partition(DS_SEP)
    if not sep:
        return "no <｜tool▁sep｜> in the call"
    if right.lstrip().startswith(("{", "[")):
        name, args_at = left.strip(), 0
    else:
        line, _, _ = right.partition("\n")
        name = line.strip()
        fence = _DS_FENCE.match(right, len(line))
        args_at = fence.end() if fence else len(line)
    found = read_object(right, args_at)
    if isinstance(found, str):
        return "the arguments are not JSON"
    tail = right[found[1] :].strip()
    if tail not in ("", "```"):
        return "text after the arguments"
    return Written(name, found[0])


def deepseek(text: str, pos: int, ctx: Context) -> Region | None:  # noqa: C901, PLR0911, PLR0912  one way out for each way the text may stand
    """DeepSeek R1 / V3 / V3.1: the calls' opening marker (left out at times),
    each call between its own markers, then the calls' closing marker (`DS_*`)."""
    outer, outer_whole = find_marker(text, pos, DS_CALLS_BEGIN)
    inner, inner_whole = find_marker(text, pos, DS_CALL_BEGIN)
    candidates = [(at, whole) for at, whole in ((outer, outer_whole), (inner, inner_whole)) if at >= 0]
    if not candidates:
        return None
    start, whole = min(candidates)
    if not whole:
        return still_open(start)
    i = start + len(DS_CALLS_BEGIN) if text.startswith(DS_CALLS_BEGIN, start) else start
    calls: list[Written] = []
    while True:
        i = skip_space(text, i)
        if text.startswith(DS_CALLS_END, i):
            i += len(DS_CALLS_END)
            break
        if not text.startswith(DS_CALL_BEGIN, i):
            if not ctx.final and (DS_CALL_BEGIN.startswith(text[i:]) or DS_CALLS_END.startswith(text[i:])):
                return still_open(start)
            if not ctx.final and i < len(text):
                break  # text after the calls with no closing marker: they end here
            if not ctx.final:
                return still_open(start)
            break
        close, closed = find_marker(text, i, DS_CALL_END)
        if not closed:
            if not ctx.final:
                return still_open(start)
            if calls:  # the calls before it stand
                break
            return not_calls(start, len(text), "the call is cut short")
        found = _deepseek_call(text[i + len(DS_CALL_BEGIN) : close])
        if isinstance(found, str):
            return not_calls(start, close + len(DS_CALL_END), found)
        calls.append(found)
        i = close + len(DS_CALL_END)
    if not calls:
        return not_calls(start, i, "no call between the markers")
    return Region(start, i, tuple(calls))


# ---------------------------------------------------------- gpt-oss harmony --

# a message header addressed to a function: `<|start|>assistant<|channel|>commentary
# to=functions.NAME <|constrain|>json<|message|>` as the model writes it, or
# `<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>` as
# the chat template renders a past call; where the special tokens render as
# nothing, `to=functions.NAME ... json`
_HARMONY_CALL = re.compile(
    r"(?:<\|start\|>assistant\s*)?(?:<\|channel\|>(?:commentary|analysis)\s*)?to=functions\.([\w.\-]+)"
    r"(?:\s*<\|channel\|>\s*(?:commentary|analysis))?\s*(?:<\|constrain\|>\s*)?(?:json\s*)?(?:<\|message\|>)?"
)
_HEADER_START = re.compile(r"<\|start\|>|<\|channel\|>")


def harmony(text: str, pos: int, ctx: Context) -> Region | None:  # noqa: PLR0911  one way out for each way the text may stand
    """gpt-oss: a commentary message to ``functions.NAME`` whose body is the
    JSON arguments (then ``<|call|>``, which ends the generation). Other
    channels (``analysis``, ``final``) are left as they are."""
    recipient = text.find("to=functions.", pos)
    # the header's beginning is at most a few markers before its recipient
    match = _HARMONY_CALL.search(text, max(pos, recipient - 64)) if recipient >= 0 else None
    if match is not None and skip_space(text, match.end()) >= len(text) and not ctx.final:
        return still_open(match.start())
    if match is None or not text.startswith("{", skip_space(text, match.end())):
        held = None if ctx.final else _harmony_held(text, pos)
        if held is not None:
            return still_open(held)
        return None if match is None else not_calls(match.start(), match.end(), "no JSON arguments after the header")
    found = read_object(text, match.end())
    if found == INCOMPLETE:
        return not_calls(match.start(), len(text), "the call is cut short") if ctx.final else still_open(match.start())
    if isinstance(found, str):
        return not_calls(match.start(), len(text), "the arguments are not JSON")
    end = found[1]
    after = skip_space(text, end)
    if text.startswith("<|call|>", after):
        end = after + len("<|call|>")
    elif not ctx.final and "<|call|>".startswith(text[after:]):
        return still_open(match.start())  # its <|call|> may follow
    return Region(match.start(), end, (Written(match.group(1), found[0]),))


def _harmony_held(text: str, pos: int) -> int | None:
    """Where a header still being written begins (one not yet at its
    ``<|message|>``, or a recipient whose JSON has not begun), or where a
    beginning of ``to=functions.`` ends the text."""
    held = []
    after = max(pos, text.rfind("<|message|>") + 1, text.rfind("<|end|>") + 1)
    header = _HEADER_START.search(text, after)
    if header is not None:
        held.append(header.start())
    for marker in ("<|start|>", "<|channel|>", "<|message|>"):
        at, whole = find_marker(text, pos, marker)
        if at >= 0 and not whole:
            held.append(at)
    recipient, whole = find_marker(text, pos, "to=functions.")
    if recipient >= 0 and (not whole or "{" not in text[recipient:]):
        held.append(recipient)
    return min(held, default=None)


# --------------------------------------------------------------- Gemma 4 --


def gemma4(text: str, pos: int, ctx: Context) -> Region | None:  # noqa: C901, PLR0911  one way out for each way the text may stand
    """Gemma 4: ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:1}<tool_call|>``
    (its own notation, not JSON)."""
    opening = "<|tool_call>call:"
    start, whole = find_marker(text, pos, opening)
    if start < 0:
        return None
    if not whole:
        return still_open(start)
    calls: list[Written] = []
    i = start
    end = start
    while text.startswith(opening, i):
        brace = text.find("{", i)
        if brace < 0:
            return None if ctx.final else still_open(start)
        name = text[i + len(opening) : brace].strip()
        found = gemma_value(text, brace)
        if found == INCOMPLETE:
            if (cut := _cut_short(text, start, ctx, calls)) is None:
                break
            return cut
        if isinstance(found, str):
            return not_calls(start, len(text), "the arguments are not in Gemma's notation")
        calls.append(Written(name, found[0]))
        end = found[1]
        close, closed = find_marker(text, end, "<tool_call|>")
        if close == end and closed:
            end += len("<tool_call|>")
        elif close == end and not ctx.final:
            return still_open(start)
        i = end
        if not ctx.final and opening.startswith(text[i:]):
            return still_open(start)  # another call may follow
    return Region(start, end, tuple(calls))
