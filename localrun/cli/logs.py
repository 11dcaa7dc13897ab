"""`localrun logs`: the run history, listed, searched, shown, summed up and compared."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from localrun import paths
from localrun.cli import _options as opt
from localrun.cli._env import current
from localrun.cli._errors import bounded
from localrun.cli._output import out
from localrun.errors import LocalrunError, UsageError
from localrun.units import count

if TYPE_CHECKING:
    import sqlite3

    from localrun.history import query

# what --by takes (localrun.history.query.GROUP_KEYS; spelled out so --help loads no database code)
GROUP_KEYS = (
    "model, command, kv, flash_attn, draft, drafter, ctx, threads, parallel, schema, cpu, remote, stop, day, week"
)

app = typer.Typer(
    help="The run history: every generate, chat turn, batch line and server request, with its speed.",
    invoke_without_command=True,
    rich_markup_mode=None,
)

Json = Annotated[bool, typer.Option("--json", help="JSON on stdout.")]
ModelFilter = Annotated[
    str | None, typer.Option("--model", "-m", help="Only this model (as logged; % matches any text).")
]
Since = Annotated[
    str | None,
    typer.Option("--since", help="Only runs since then: 7d, 12h, 30m, 2w, or a date (2026-12-01).", show_default=False),
]
Until = Annotated[str | None, typer.Option("--until", help="Only runs before then (same forms).", show_default=False)]
Query = Annotated[
    str | None, typer.Option("--query", "-q", help="Full-text search of prompts, responses and system prompts.")
]
Command = Annotated[
    str | None, typer.Option("--command", help="Only runs of this command: generate, chat, batch or serve.")
]


def _filters(
    model: str | None, since: str | None, until: str | None, text: str | None, command: str | None
) -> query.Filters:
    from localrun.history import query

    return query.Filters(
        model=model,
        since=query.parse_when(since) if since else None,
        until=query.parse_when(until, end=True) if until else None,
        query=text,
        command=query.check_command(command) if command is not None else None,
    )


@contextmanager
def _history() -> Iterator[sqlite3.Connection | None]:
    """The history for reading (None when nothing was logged yet); its errors as one line."""
    import sqlite3

    from localrun.history.db import HistoryError, reader

    moved: list[Path] = []
    try:
        conn = reader(moved=moved)
    except sqlite3.DatabaseError as exc:
        raise LocalrunError(f"cannot read the run history {paths.history_db()}: {exc}") from None
    except HistoryError as exc:
        raise LocalrunError(
            f"cannot read the run history {paths.history_db()}: {exc}", hint="upgrade localrun"
        ) from None
    for aside in moved:
        out().warn(f"the run history was damaged; moved it to {aside}")
    try:
        yield conn
    except sqlite3.Error as exc:
        raise LocalrunError(f"cannot read the run history {paths.history_db()}: {exc}") from None
    finally:
        if conn is not None:
            conn.close()


@app.callback()
@bounded
def logs(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option("-n", "--limit", help="How many runs (0: all).")] = 20,
    as_json: Json = False,
    text: Query = None,
    model: ModelFilter = None,
    since: Since = None,
    until: Until = None,
    command: Command = None,
) -> None:
    """The runs logged, newest first (subcommands: show, stats, rm, on, off, path)."""
    from localrun.history import query

    if ctx.invoked_subcommand is not None:
        return
    if limit < 0:
        raise UsageError("-n must be 0 (all) or more")
    filters = _filters(model, since, until, text, command)
    with _history() as conn:
        rows = query.list_runs(conn, filters, limit or None) if conn is not None else []
    if as_json:
        out().json([query.as_json(r) for r in rows], indent=2)
        return
    if not rows:
        from localrun.history.record import logging_enabled

        if conn is not None and filters != query.Filters():
            out().note("no runs match")
            return
        out().note("no runs logged" + ("" if logging_enabled() else " (logging is off: localrun logs on)"))
        return
    from localrun.ui.history import runs_table

    out().table(runs_table(rows))


@app.command("show")
@bounded
def show(
    run_id: Annotated[int, typer.Argument(help="The run's ID (from localrun logs).")], as_json: Json = False
) -> None:
    """One run in full: settings with their sources, figures, prompt and response."""
    from localrun.history import query

    with _history() as conn:
        found = query.get_run(conn, run_id) if conn is not None else None
    if found is None:
        raise UsageError(f"no run {run_id} in the history", hint="localrun logs lists them")
    if as_json:
        out().json(query.as_json(found), indent=2)
        return
    from localrun.ui.history import run_text

    out().result(run_text(found))


def _keys(by: str | None) -> list[str]:
    from localrun.history import query

    keys = [k.strip() for k in (by or "").split(",") if k.strip()]
    for key in keys:
        query.key_sql(key)  # an unknown key fails before any work
    return keys


@app.command("stats")
@bounded
def stats(
    by: Annotated[
        str | None,
        typer.Option("--by", help=f"Group by these, comma-separated: {GROUP_KEYS}.", show_default=False),
    ] = None,
    compare: Annotated[
        tuple[str, str] | None,
        typer.Option(
            "--compare",
            help="Two groups side by side and the change: KEY=VALUE[,KEY=VALUE] or a date range FROM..TO each.",
            show_default=False,
        ),
    ] = None,
    chart: Annotated[
        Path | None, typer.Option("--chart", help="Write tokens/sec over time per group as SVG.", show_default=False)
    ] = None,
    as_json: Json = False,
    text: Query = None,
    model: ModelFilter = None,
    since: Since = None,
    until: Until = None,
    command: Command = None,
) -> None:
    """Runs, median tokens/sec, p95 time per token, time to first token and acceptance, per group."""
    from localrun.history import query

    keys = _keys(by)
    filters = _filters(model, since, until, text, command)
    sides = (query.selector(compare[0]), query.selector(compare[1])) if compare else None
    if chart is not None:
        opt.check_output_file("--chart", chart)
    from localrun.ui.history import chart as draw
    from localrun.ui.history import compare_table, comparison, stats_table

    with _history() as conn:
        if conn is None:
            out().note("no runs logged")
            return
        if sides is not None and compare is not None:
            a, b = query.compare(conn, sides[0], sides[1], filters)
            for label, side in ((compare[0], a), (compare[1], b)):
                if not side.runs:
                    out().note(f"no runs match {label}: nothing to compare on that side")
            if as_json:
                out().json(comparison(compare[0], compare[1], a, b), indent=2)
            else:
                out().table(compare_table(compare[0], compare[1], a, b))
        else:
            groups = query.group_stats(conn, keys, filters)
            if as_json:
                out().json([dict(zip(keys, g.key, strict=True)) | g.summary() for g in groups], indent=2)
            elif groups:
                out().table(stats_table(keys, groups))
            else:
                out().note("no runs match")
        lines: dict[tuple[str, ...], list[Any]] = query.series(conn, keys, filters) if chart is not None else {}
    if chart is not None:
        paths.atomic_write(chart, draw(keys, lines))
        out().note(f"wrote {chart}")


@app.command("rm")
@bounded
def rm(
    run_ids: Annotated[list[int] | None, typer.Argument(help="The runs to remove.", show_default=False)] = None,
    every: Annotated[bool, typer.Option("--all", help="Remove every run and conversation.")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask (--all).")] = False,
) -> None:
    """Remove runs from the history (their text is overwritten, not left on disk)."""
    from localrun.history import query

    if every == bool(run_ids):
        raise UsageError("give run IDs or --all", hint="localrun logs lists the IDs")
    if every and not yes:
        if not current().stdin_isatty:
            raise UsageError("refusing to remove the whole history without --yes (stdin is not a terminal)")
        if not typer.confirm(f"remove every run from {paths.history_db()}?", err=True):
            out().note("kept the history")
            return
    with _history() as conn:
        removed = query.delete_runs(conn, None if every else run_ids or []) if conn is not None else 0
    if run_ids and removed < len(run_ids):
        missing = len(run_ids) - removed
        out().warn(f"{count(missing, 'ID')} {'was' if missing == 1 else 'were'} not in the history")
    out().result(f"removed {count(removed, 'run')}")


@app.command("off")
@bounded
def off() -> None:
    """Stop logging runs (what is logged stays; localrun logs rm --all removes it)."""
    marker = paths.history_off_marker()
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    out().result("logging is off")


@app.command("on")
@bounded
def on() -> None:
    """Log runs again (the default)."""
    paths.history_off_marker().unlink(missing_ok=True)
    from localrun.history.record import NO_LOG_ENV, logging_enabled

    note = f" (but {NO_LOG_ENV} is set in this environment)" if not logging_enabled() else ""
    out().result("logging is on" + note)


@app.command("path")
@bounded
def path() -> None:
    """Where the history is, and whether logging is on."""
    from localrun.history.record import logging_enabled

    out().result(str(paths.history_db()))
    out().note("logging is " + ("on" if logging_enabled() else "off"))
