#!/usr/bin/env python3
"""Write the list of chat-format families in docs/templates.md from the
registry (``localrun.chatformat``): what each supports.

    .venv/bin/python scripts/templates_doc.py [--check]

Only the part between the two ``families`` comments is written; ``--check``
exits 1 where the file differs from what the registry says."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from localrun import chatformat  # noqa: E402  after the path is set
from localrun.chatformat.thinking import TAGGED  # noqa: E402

DOC = ROOT / "docs" / "templates.md"
BEGIN = "<!-- families: written by scripts/templates_doc.py from localrun/chatformat -->"
END = "<!-- end of families -->"


def _reasoning(fmt: chatformat.ChatFormat) -> str:
    if fmt.thinks == TAGGED:
        return "`<think>` or its kin, where the template has them"
    own = (f"`{r.start}`" if not r.channels else "harmony's analysis channel" for r in fmt.thinks if r not in TAGGED)
    return ", ".join(own).replace("|", "\\|")  # a table cell's pipes, even in code


def _yes(value: bool) -> str:
    return "yes" if value else "no"


def families() -> str:
    """The table of families, in the order a template is matched against them."""
    lines = [
        "| family | models | reasoning | tool calls | parallel calls | constrained |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for fmt in (*chatformat.FORMATS, chatformat.HERMES):
        tools = f"`{fmt.tools.name}`" if fmt.own_tools else f"read as `{fmt.tools.name}`"
        cells = [fmt.name, fmt.note, _reasoning(fmt), tools, _yes(fmt.parallel), _yes(fmt.constrained)]
        lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines)


def written(doc: str) -> str:
    """``doc`` with its families part as the registry says."""
    head, found, rest = doc.partition(BEGIN)
    if not found:
        raise SystemExit(f"{DOC}: no {BEGIN!r} line")
    _, found, tail = rest.partition(END)
    if not found:
        raise SystemExit(f"{DOC}: no {END!r} line")
    return f"{head}{BEGIN}\n\n{families()}\n\n{END}{tail}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 where the file is not up to date")
    args = parser.parse_args()
    doc = DOC.read_text(encoding="utf-8")
    new = written(doc)
    if args.check:
        return 0 if new == doc else 1
    DOC.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
