"""`localrun cache`: what the prompt cache holds, and clearing it."""

from __future__ import annotations

from typing import Annotated

import typer

from localrun.cli._env import current
from localrun.cli._errors import bounded
from localrun.cli._output import out
from localrun.errors import UsageError
from localrun.units import count, human_bytes

app = typer.Typer(
    help="The prompt cache (KV state of long prompt prefixes, on disk).",
    invoke_without_command=True,
    rich_markup_mode=None,
)


@app.callback()
@bounded
def cache(ctx: typer.Context) -> None:
    """The prompt cache (subcommands: info, clear); alone, what `cache info` says."""
    if ctx.invoked_subcommand is None:
        info()


@app.command("info")
@bounded
def info() -> None:
    """Where the prompt cache is, how many entries, their size and the cap."""
    from localrun.runtime.promptcache import default_cache

    cache = default_cache()
    entries = cache.entries()
    out().result(
        f"{cache.directory}\n{count(len(entries), 'entry', 'entries')}, "
        f"{human_bytes(cache.size())} of {human_bytes(cache.cap_bytes)}"
    )


@app.command("clear")
@bounded
def clear(
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
) -> None:
    """Remove every prompt cache entry (asks first on a terminal; --yes otherwise)."""
    from localrun.runtime.promptcache import default_cache

    cache = default_cache()
    if not cache.entries():
        out().result("the prompt cache is empty")
        return
    if not yes:
        if not current().stdin_isatty:
            raise UsageError("refusing to clear the prompt cache without --yes (stdin is not a terminal)")
        if not typer.confirm(f"clear {cache.directory}?", err=True):
            out().note("kept the prompt cache")
            return
    files, size = cache.clear()
    out().result(f"removed {count(files, 'entry', 'entries')}, {human_bytes(size)}")
