"""A small MCP server (stdio) whose answers no model can guess: the tests' own.

Run as `python facts.py` (stdio) or `python facts.py http PORT` (streamable
HTTP on 127.0.0.1). With LOCALRUN_TEST_PIDFILE set, it writes its pid there
first, so a test can check that no server outlives its session."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

app = MCPServer("facts")

BADGES = {"alice": "Q-7731", "bob": "Z-2208", "carol": "K-4415"}


def ran(name: str, **arguments: object) -> None:
    """With LOCALRUN_TEST_CALLS set, each call is appended to that file: a test reads what really ran."""
    if log := os.environ.get("LOCALRUN_TEST_CALLS"):
        with Path(log).open("a") as f:
            f.write(f"{name} {arguments}\n")


@app.tool()
def badge_number(person: str) -> str:
    """The badge number of an employee, by first name."""
    ran("badge_number", person=person)
    return BADGES.get(person.strip().lower(), f"no employee named {person}")


@app.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    ran("add", a=a, b=b)
    return a + b


@app.tool()
def today() -> str:
    """Today's date."""
    ran("today")
    return "Tuesday 3 March"


@app.tool()
def slow(seconds: float) -> str:
    """Wait, then answer."""
    ran("slow", seconds=seconds)
    time.sleep(1.0 + abs(seconds))  # whatever a model asks (a negative wait, none), longer than the tests' timeouts
    return "done waiting"


@app.tool()
def fail(reason: str) -> str:
    """Always fails."""
    raise ToolError(f"failed on purpose: {reason}")


@app.tool()
def crash() -> str:
    """Ends the server mid-call."""
    ran("crash")
    os._exit(3)


if __name__ == "__main__":
    if only := os.environ.get("LOCALRUN_TEST_TOOLS"):
        for name in [t.name for t in asyncio.run(app.list_tools())]:
            if name not in only.split(","):
                app.remove_tool(name)
    if pidfile := os.environ.get("LOCALRUN_TEST_PIDFILE"):
        with Path(pidfile).open("a") as f:
            f.write(f"{os.getpid()}\n")
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        app.run()
