"""A reply as Markdown, without mangling the code a model left unfenced.

Markdown joins the lines of a paragraph and makes a `# comment` a heading:
right for prose, wrong for code that a model wrote without its fence. So
before rendering, each run of lines outside a fence that looks like code (a
block of lines with no blank line between them, mostly indented or shaped
like code: `def f():`, `x = 1`, `}`) is put in a fence of its own, from its
first line of code on; the blank lines and `#` comment lines between two such
runs go in the same fence.
"""

from __future__ import annotations

import re

from rich.markdown import Markdown

FENCE = re.compile(r"^\s{0,3}(```|~~~)")
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d{1,3}[.)])\s")
HASH_LINE = re.compile(r"^\s*#")
# The start or end of a line of code in the common languages; prose seldom has them.
CODE_START = re.compile(
    r"^\s*(?:(?:async\s+)?def|class|import|return|elif|else\s*:|try\s*:|except|finally\s*:|raise|yield|"
    r"from\s+\S+\s+import|function|const|let|var|fn|pub|impl|struct|enum|package|public|private|static|void|"
    r"@\w+)\b|^\s*(?:if|elif|while|for)\s.+:\s*$"
)
CODE_END = re.compile(r"(?:[;{}]|\):|=>|\\)\s*$")
ASSIGNMENT = re.compile(r"^\s*[A-Za-z_][\w.\[\]'\"]*\s*(?:[-+*/%|&]?=|:=)\s*\S")
CALL = re.compile(r"^\s*[A-Za-z_][\w.]*\(.*\)\s*$")


def _is_code_line(line: str, first: bool) -> bool:
    if not first and line[:1] in (" ", "\t") and not LIST_ITEM.match(line):
        return True  # indented inside a block: a body, not a paragraph's line
    return bool(CODE_START.match(line) or CODE_END.search(line) or ASSIGNMENT.match(line) or CALL.match(line))


def _starts_code(line: str) -> bool:
    return bool(HASH_LINE.match(line)) or line[:1] in (" ", "\t") or _is_code_line(line, first=True)


def _looks_like_code(block: list[str]) -> bool:
    """Whether a block (lines with no blank one between) is code: no list
    item in it, and half or more of its lines shaped like code (`#` lines,
    a comment or a heading, are left out of the count)."""
    if any(LIST_ITEM.match(line) for line in block):
        return False
    counted = [(i, line) for i, line in enumerate(block) if not HASH_LINE.match(line)]
    if not counted:
        return False
    code = sum(_is_code_line(line, i == 0) for i, line in counted)
    return code > 0 and 2 * code >= len(counted)


def _blocks(lines: list[str]) -> list[tuple[str, list[str]]]:
    """The lines as ("fence" | "blank" | "text", lines) runs, a fence kept whole."""
    runs: list[tuple[str, list[str]]] = []
    fence: str | None = None
    for line in lines:
        opening = FENCE.match(line)
        if fence is not None:
            runs[-1][1].append(line)
            if opening and opening.group(1) == fence:
                fence = None
            continue
        kind = "fence" if opening else "blank" if not line.strip() else "text"
        if opening:
            fence = opening.group(1)
        if runs and runs[-1][0] == kind and kind != "fence":
            runs[-1][1].append(line)
        else:
            runs.append((kind, [line]))
    return runs


def fence_code(text: str) -> str:
    """``text`` with each run of unfenced code lines put in a fence."""
    runs = _blocks(text.split("\n"))
    code = [kind == "text" and _looks_like_code(block) for kind, block in runs]
    out: list[str] = []
    i = 0
    while i < len(runs):
        if not code[i]:
            out.extend(runs[i][1])
            i += 1
            continue
        # this code run, and the next ones with only blank lines or `#` lines between
        end = i
        j = i + 1
        while j < len(runs):
            kind, block = runs[j]
            if code[j]:
                end = j
            elif not (kind == "blank" or (kind == "text" and all(HASH_LINE.match(line) for line in block))):
                break
            j += 1
        lines = [line for _, block in runs[i : end + 1] for line in block]
        lead = 0  # prose that leads into the code ("Fix this code:") stays prose
        while lead < len(lines) - 1 and not _starts_code(lines[lead]):
            lead += 1
        out.extend(lines[:lead])
        out.append("```")
        out.extend(lines[lead:])
        out.append("```")
        i = end + 1
    return "\n".join(out)


def reply_markdown(text: str) -> Markdown:
    """A reply rendered as Markdown, its unfenced code kept as written."""
    return Markdown(fence_code(text), code_theme="monokai")
