"""A tool loop's calls and results: dimmed blocks on a terminal, event
lines with `--json`, and the table `localrun tools` prints."""

from __future__ import annotations

import json
from typing import Any

from rich.console import RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

from localrun.events import Event, ToolCallEvent, ToolEvent, ToolResultEvent, ToolStepDone
from localrun.ui.table import Column, FitTable

RESULT_LINES = 12  # of a result shown on a terminal (the model gets all of it)


def arguments_text(arguments: dict[str, Any]) -> str:
    return json.dumps(arguments, ensure_ascii=False, indent=2) if arguments else "{}"


def tool_block(event: Event | ToolEvent) -> RenderableType | None:
    """A call or a result as a dimmed block; None for any other event."""
    if isinstance(event, ToolCallEvent):
        return Panel(Text(arguments_text(event.arguments), style="dim"), title=Text(f"tool call · {event.name}"),
                     title_align="left", border_style="dim", style="dim")  # fmt: skip
    if isinstance(event, ToolResultEvent):
        lines = event.text.splitlines() or [""]
        shown = "\n".join(lines[:RESULT_LINES])
        if len(lines) > RESULT_LINES:
            shown += f"\n… {len(lines) - RESULT_LINES} more lines"
        status = "" if event.status == "ok" else f" · {event.status}"
        title = Text(f"tool result · {event.name}{status} · {event.seconds:.2f}s")  # a server's names: never markup
        style = "dim" if event.status == "ok" else "dim yellow"
        return Panel(Text(shown, style=style), title=title, title_align="left", border_style=style, style="dim")
    return None


def json_record(event: Event | ToolEvent, extra: dict[str, Any]) -> str | None:
    """A tool event's `--json` line; "" for one with no line; None for the text's own events."""
    if isinstance(event, ToolCallEvent):
        record: dict[str, Any] = {"type": "tool_call", "id": event.id, "name": event.name, "arguments": event.arguments}
    elif isinstance(event, ToolResultEvent):
        record = {"type": "tool_result", "id": event.id, "name": event.name, "status": event.status,
                  "content": event.text, "seconds": round(event.seconds, 3)}  # fmt: skip
    elif isinstance(event, ToolStepDone):
        return ""
    else:
        return None
    return json.dumps(record | extra, ensure_ascii=False)


def tools_table(tools: list[Any], allowed: set[str] | None = None) -> FitTable:
    """The tools, one a row; with ``allowed`` (a chat's), whether each runs without asking."""
    columns = [Column("TOOL"), Column("SERVER", drop=1), Column("READ-ONLY", drop=3)]
    if allowed is not None:
        columns.append(Column("RUNS", drop=2))
    table = FitTable([*columns, Column("DESCRIPTION", wrap=20)], box=None, pad_edge=False)
    for tool in tools:
        summary = tool.description.strip().splitlines()[0] if tool.description.strip() else ""
        runs = ["allowed" if "all" in allowed or tool.name in allowed else "asks"] if allowed is not None else []
        table.add_row(escape(tool.name), escape(tool.server), "yes" if tool.read_only else "", *runs, escape(summary))
    return table
