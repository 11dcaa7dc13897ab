"""Reading the history: list and search runs, one run, group figures, the
change between two groups, tokens/sec over time, and the last conversation.

Figures per group are computed here, from one pass over the rows the filters
select (percentiles need the values, which SQLite does not aggregate).
"""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localrun.errors import UsageError
from localrun.quantiles import percentile

if TYPE_CHECKING:
    import sqlite3

NULL_LABEL = "-"

# what `--by` and `--compare` know, and the SQL each stands for (as text, "-" for none)
GROUP_KEYS: dict[str, str] = {
    "model": "model",
    "command": "command",
    "kv": "kv",
    "flash_attn": "flash_attn",
    "draft": "draft",
    "drafter": "drafter",
    "ctx": "ctx",
    "threads": "CASE WHEN thread_shares LIKE '%,%' THEN 'mixed' ELSE threads END",  # runs that changed count
    "parallel": "parallel",
    "schema": "CASE WHEN schema IS NULL THEN 'none' ELSE 'schema' END",
    "cpu": "cpu",
    "remote": "remote",
    "stop": "stop_reason",
    "day": "date(time, 'unixepoch', 'localtime')",
    "week": "strftime('%Y-W%W', time, 'unixepoch', 'localtime')",
}
KEY_ALIASES = {"fa": "flash_attn", "stop_reason": "stop", "date": "day"}


def key_sql(name: str) -> str:
    key = KEY_ALIASES.get(name, name)
    if key not in GROUP_KEYS:
        raise UsageError(f"cannot group by {name!r}", hint=f"use {', '.join(GROUP_KEYS)}")
    return f"COALESCE(CAST({GROUP_KEYS[key]} AS TEXT), '{NULL_LABEL}')"


# ---------------------------------------------------------------- filters --

_RELATIVE = re.compile(r"^(\d+)\s*([mhdw])$")
_UNITS = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_when(text: str, *, end: bool = False, now: float | None = None) -> float:
    """A point in time: `7d`, `12h`, `30m`, `2w` ago, or a local date or date and time
    (`2026-12-01`, `2026-12-01T14:30`); with ``end``, a date alone means the end of that day."""
    text = text.strip()
    relative = _RELATIVE.match(text)
    if relative:
        return (now if now is not None else time.time()) - int(relative[1]) * _UNITS[relative[2]]
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"{text!r} is not a time", hint="use 7d, 12h, 30m, 2w, or a date like 2026-12-01") from None
    if end and len(text) <= 10:
        moment += timedelta(days=1)
    return moment.timestamp()


COMMANDS = ("generate", "chat", "batch", "serve")  # what logs runs (RunContext.command)


def check_command(name: str) -> str:
    """``name`` when a command logs runs under it; else a UsageError naming those that do."""
    if name not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(name, COMMANDS, n=1)
        raise UsageError(
            f"no command {name!r} logs runs",
            hint=(f"did you mean {close[0]}? " if close else "") + f"use one of: {', '.join(COMMANDS)}",
        )
    return name


@dataclass(frozen=True)
class Filters:
    model: str | None = None  # the model name as logged (or a part of it, with %)
    since: float | None = None
    until: float | None = None
    query: str | None = None  # full-text search of prompt, response and system prompt
    command: str | None = None
    equal: tuple[tuple[str, str], ...] = ()  # (group key, value) pairs

    def where(self) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        if self.model is not None:
            clauses.append("model LIKE ?" if "%" in self.model else "model = ?")
            params.append(self.model)
        if self.since is not None:
            clauses.append("time >= ?")
            params.append(self.since)
        if self.until is not None:
            clauses.append("time < ?")
            params.append(self.until)
        if self.command is not None:
            clauses.append("command = ?")
            params.append(self.command)
        if self.query:
            clauses.append("id IN (SELECT rowid FROM runs_fts WHERE runs_fts MATCH ?)")
            params.append(fts_query(self.query))
        for key, value in self.equal:
            clauses.append(f"{key_sql(key)} = ?")
            params.append(value)
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", params

    def narrowed(self, other: Filters) -> Filters:
        """Both sets of conditions."""
        return Filters(
            model=other.model or self.model,
            since=max((x for x in (self.since, other.since) if x is not None), default=None),
            until=min((x for x in (self.until, other.until) if x is not None), default=None),
            query=other.query or self.query,
            command=other.command or self.command,
            equal=self.equal + other.equal,
        )


def fts_query(text: str) -> str:
    """The words of ``text``, each quoted: a search for all of them, whatever
    characters they hold (FTS5's own syntax is not exposed)."""
    words = text.split()
    return " ".join('"' + word.replace('"', '""') + '"' for word in words) or '""'


def selector(text: str) -> Filters:
    """One side of `--compare`: `kv=f16`, `kv=q8_0,draft=none`, or a date range
    `2026-12-01..2026-12-02` (either end may be left open)."""
    if ".." in text:
        start, _, stop = text.partition("..")
        return Filters(
            since=parse_when(start) if start.strip() else None,
            until=parse_when(stop, end=True) if stop.strip() else None,
        )
    pairs: list[tuple[str, str]] = []
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--compare {text!r}: expected KEY=VALUE or a date range FROM..TO")
        key_sql(key.strip())  # an unknown key fails here
        pairs.append((key.strip(), value.strip()))
    return Filters(equal=tuple(pairs))


# ------------------------------------------------------------------- runs --

LIST_COLUMNS = (
    "id, time, command, conversation_id, model, kv, flash_attn, draft, drafter, ctx, threads, parallel, schema, "
    "prompt, response, prompt_tokens, generated_tokens, ttft_s, decode_tps, token_p50_ms, token_p95_ms, "
    "drafted, accepted, stop_reason, exit_status"
)


# the history's columns whose JSON name differs: one name per quantity across
# every JSON contract (docs/json.md), as the `--json` done event and bench say it
JSON_NAMES = {
    "decode_tps": "decode_tokens_per_s",
    "prompt_tps": "prompt_tokens_per_s",
    "token_p50_ms": "p50_token_ms",
    "token_p95_ms": "p95_token_ms",
    "drafted": "proposed",
}
_FLAGS = ("retry", "valid")


def iso_time(timestamp: float | None) -> str | None:
    """A history time (epoch seconds) as ISO 8601, in UTC, to the millisecond."""
    if timestamp is None:
        return None
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="milliseconds")


def _json_value(name: str, value: Any) -> Any:
    if name == "time":
        return iso_time(value)
    if name == "settings" and isinstance(value, str):
        return json.loads(value)
    if name == "thread_shares" and isinstance(value, str):  # "2:0.125,1:0.875", as the done event's object
        return {n: float(share) for n, _, share in (part.partition(":") for part in value.split(",") if part)}
    if name in _FLAGS and value is not None:
        return bool(value)
    return value


def as_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """A run as `logs --json` and `logs show --json` write it: the names of
    docs/json.md, the time in ISO 8601, settings as objects, flags as booleans."""
    return {JSON_NAMES.get(name, name): _json_value(name, value) for name, value in row.items()}


def list_runs(conn: sqlite3.Connection, filters: Filters, limit: int | None = 20) -> list[dict[str, Any]]:
    """The runs ``filters`` select, newest first."""
    where, params = filters.where()
    sql = f"SELECT {LIST_COLUMNS} FROM runs{where} ORDER BY id DESC"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    return [dict(r) for r in conn.execute(sql, params)]


def get_run(conn: sqlite3.Connection, run_id: int) -> dict[str, Any] | None:
    found = conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
    return dict(found) if found is not None else None


def delete_runs(conn: sqlite3.Connection, ids: Sequence[int] | None) -> int:
    """Remove the runs ``ids`` (None: every run and conversation); how many went.
    Deleted text is overwritten, not left in free pages."""
    from localrun.history.db import transaction

    conn.execute("PRAGMA secure_delete=ON")
    with transaction(conn):
        if ids is None:
            removed = conn.execute("DELETE FROM runs").rowcount
            conn.execute("DELETE FROM conversations")
            conn.execute("INSERT INTO runs_fts(runs_fts) VALUES ('rebuild')")
        else:
            removed = sum(conn.execute("DELETE FROM runs WHERE id = ?", (i,)).rowcount for i in ids)
            conn.execute(
                "DELETE FROM conversations WHERE id NOT IN (SELECT conversation_id FROM runs "
                "WHERE conversation_id IS NOT NULL)"
            )
    if ids is None:
        conn.execute("VACUUM")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return removed


# ------------------------------------------------------------------ stats --


def _percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) of ``values``; None when there are none."""
    return percentile(values, q) if values else None


@dataclass
class GroupStats:
    """The figures of one group of runs."""

    key: tuple[str, ...]
    runs: int = 0
    generated_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    rates: list[float] = field(default_factory=list, repr=False)
    ttfts: list[float] = field(default_factory=list, repr=False)
    token_p95s: list[float] = field(default_factory=list, repr=False)
    first: float | None = None
    last: float | None = None

    def add(self, when: float, rate: Any, ttft: Any, token_p95: Any, tokens: Any, drafted: Any, accepted: Any) -> None:
        self.runs += 1
        self.generated_tokens += tokens or 0
        if rate:
            self.rates.append(rate)
        if ttft is not None:
            self.ttfts.append(ttft)
        if token_p95 is not None:
            self.token_p95s.append(token_p95)
        if drafted:
            self.drafted += drafted
            self.accepted += accepted or 0
        self.first = when if self.first is None else min(self.first, when)
        self.last = when if self.last is None else max(self.last, when)

    def summary(self) -> dict[str, Any]:
        """The figures: median tokens/sec, the 95th percentile of time per token
        (each run's own p95, over the runs), time to first token, acceptance."""
        for values in (self.rates, self.ttfts, self.token_p95s):
            values.sort()
        return {
            "runs": self.runs,
            "generated_tokens": self.generated_tokens,
            "decode_tokens_per_s_p50": _percentile(self.rates, 50),
            "p95_token_ms_p95": _percentile(self.token_p95s, 95),
            "ttft_s_p50": _percentile(self.ttfts, 50),
            "ttft_s_p95": _percentile(self.ttfts, 95),
            "acceptance": self.accepted / self.drafted if self.drafted else None,
            "first": iso_time(self.first),
            "last": iso_time(self.last),
        }


_STATS_COLUMNS = "time, decode_tps, ttft_s, token_p95_ms, generated_tokens, drafted, accepted"


def group_stats(conn: sqlite3.Connection, by: Sequence[str], filters: Filters) -> list[GroupStats]:
    """One `GroupStats` per distinct value of the ``by`` keys (one group of all runs when none), by key."""
    keys = [key_sql(name) for name in by]
    where, params = filters.where()
    select = ", ".join([*keys, _STATS_COLUMNS])
    groups: dict[tuple[str, ...], GroupStats] = {}
    width = len(keys)
    for r in conn.execute(f"SELECT {select} FROM runs{where}", params):
        key = tuple(r[:width])
        group = groups.get(key)
        if group is None:
            group = groups[key] = GroupStats(key)
        group.add(*r[width:])
    return [groups[k] for k in sorted(groups)]


def compare(conn: sqlite3.Connection, a: Filters, b: Filters, base: Filters) -> tuple[GroupStats, GroupStats]:
    """The figures of the runs ``a`` selects and of those ``b`` selects (both within ``base``)."""
    result = []
    for side in (a, b):
        groups = group_stats(conn, (), base.narrowed(side))
        result.append(groups[0] if groups else GroupStats(()))
    return result[0], result[1]


def change(before: Any, after: Any) -> float | None:
    """after / before - 1, when both are figures and before is not 0."""
    if not isinstance(before, int | float) or not isinstance(after, int | float) or not before:
        return None
    return after / before - 1


def series(
    conn: sqlite3.Connection, by: Sequence[str], filters: Filters, points: int = 48
) -> dict[tuple[str, ...], list[tuple[float, float, int]]]:
    """Tokens/sec over time per group: the time span cut into ``points`` equal
    bins, and in each bin the median rate of the group's runs (bin middle, median, runs)."""
    keys = [key_sql(name) for name in by]
    where, params = filters.where()
    where += (" AND " if where else " WHERE ") + "decode_tps > 0"
    rows = conn.execute(f"SELECT {', '.join([*keys, 'time', 'decode_tps'])} FROM runs{where}", params).fetchall()
    if not rows:
        return {}
    width = len(keys)
    start = min(r[width] for r in rows)
    span = max(r[width] for r in rows) - start or 1.0
    step = span / points
    bins: dict[tuple[str, ...], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        bins[tuple(r[:width])][min(int((r[width] - start) / step), points - 1)].append(r[width + 1])
    result: dict[tuple[str, ...], list[tuple[float, float, int]]] = {}
    for key in sorted(bins):
        line = []
        for index in sorted(bins[key]):
            rates = sorted(bins[key][index])
            line.append((start + (index + 0.5) * step, percentile(rates, 50), len(rates)))
        result[key] = line
    return result


# ----------------------------------------------------------- conversations --


@dataclass(frozen=True)
class LoggedTurn:
    user: str
    reply: str
    interrupted: bool


def last_conversation(conn: sqlite3.Connection) -> tuple[int, str | None, list[LoggedTurn]] | None:
    """The conversation of the newest chat turn: (its id, system prompt, turns), a
    retried reply replacing the one before it; None when no chat was logged."""
    found = conn.execute(
        "SELECT conversation_id FROM runs WHERE conversation_id IS NOT NULL ORDER BY id DESC LIMIT 1"
    ).fetchone()
    if found is None:
        return None
    conversation_id = found[0]
    head = conn.execute("SELECT system, carried FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
    system_row = (head[0],) if head else None
    turns = _carried_turns(head[1] if head else None)
    for r in conn.execute(
        "SELECT prompt, response, retry, stop_reason FROM runs WHERE conversation_id = ? ORDER BY id",
        (conversation_id,),
    ):
        if r["retry"] and turns:
            turns.pop()
        turns.append(LoggedTurn(r["prompt"] or "", r["response"] or "", r["stop_reason"] == "interrupted"))
    return conversation_id, (system_row[0] if system_row else None), turns


def _carried_turns(text: str | None) -> list[LoggedTurn]:
    """The turns a conversation began with (`chat --load`), as its record keeps them."""
    try:
        items = json.loads(text) if text else []
    except json.JSONDecodeError:
        return []
    return [
        LoggedTurn(str(t.get("user", "")), str(t.get("reply", "")), bool(t.get("interrupted")))
        for t in items
        if isinstance(t, dict)
    ]


def conversation_model(conn: sqlite3.Connection, conversation_id: int) -> str | None:
    """What `-m` takes to load the model of a conversation's newest turn: the
    alias or name it was given, or the file's path where the name logged is
    the file's own (a path given); None for a conversation on a remote server."""
    row = conn.execute(
        "SELECT model, model_file, remote FROM runs WHERE conversation_id = ? ORDER BY id DESC LIMIT 1",
        (conversation_id,),
    ).fetchone()
    if row is None or row["remote"] or not row["model"]:
        return None
    model, model_file = row["model"], row["model_file"]
    return str(model_file) if model_file and Path(model_file).name == model else str(model)
