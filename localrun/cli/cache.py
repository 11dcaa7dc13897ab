"""`localrun cache`: what the prompt cache holds, and clearing it."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from localrun.cli._errors import error_boundary
from localrun.runtime.promptcache import default_cache
from localrun.ui.stream import human_bytes

app = typer.Typer(help="The prompt cache (KV state of long prompt prefixes, on disk).", no_args_is_help=True)


@app.command("info")
def info() -> None:
    """Where the prompt cache is, how many entries, their size and the cap."""
    with error_boundary():
        cache = default_cache()
        entries = cache.entries()
        size = sum(p.stat().st_size for p in entries)
        sys.stdout.write(
            f"{cache.directory}\n{len(entries)} entries, {human_bytes(size)} of {human_bytes(cache.cap_bytes)}\n"
        )


@app.command("clear")
def clear(
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
) -> None:
    """Remove every prompt cache entry."""
    with error_boundary():
        cache = default_cache()
        if not cache.entries():
            sys.stdout.write("the prompt cache is empty\n")
            return
        if not yes and sys.stdin.isatty() and not typer.confirm(f"clear {cache.directory}?"):
            raise typer.Exit(1)
        files, size = cache.clear()
        sys.stdout.write(f"removed {files} entries, {human_bytes(size)}\n")
