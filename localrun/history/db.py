"""The history database: one SQLite file in WAL mode, its schema and the
forward migrations.

Every connection is short: open, one transaction, close. WAL lets readers
and a writer work at once, and the busy timeout makes concurrent writers
(two generates, a batch and a chat) wait their turn instead of failing. A
file that is not a database, or a damaged one, is moved aside and a new one
started; the caller hears of it once.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

from localrun import paths

BUSY_TIMEOUT_S = 5.0  # a writer waits this long for another's transaction (each lasts milliseconds)

# Each entry moves the schema one version forward; the database records the
# version it is at (PRAGMA user_version). Never edit an entry once released:
# append a new one.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE conversations (
            id INTEGER PRIMARY KEY,
            started REAL NOT NULL,
            model TEXT,
            system TEXT
        )""",
        """CREATE TABLE runs (
            id INTEGER PRIMARY KEY,
            time REAL NOT NULL,
            command TEXT NOT NULL,
            conversation_id INTEGER REFERENCES conversations(id) ON DELETE SET NULL,
            retry INTEGER NOT NULL DEFAULT 0,
            model TEXT,
            model_file TEXT,
            model_sha256 TEXT,
            remote TEXT,
            kv TEXT,
            flash_attn TEXT,
            draft TEXT,
            drafter TEXT,
            ctx INTEGER,
            threads INTEGER,
            parallel INTEGER,
            schema TEXT,
            settings TEXT,
            system TEXT,
            prompt TEXT,
            response TEXT,
            prompt_tokens INTEGER,
            cached_tokens INTEGER,
            generated_tokens INTEGER,
            ttft_s REAL,
            decode_tps REAL,
            prompt_tps REAL,
            elapsed_s REAL,
            token_p50_ms REAL,
            token_p95_ms REAL,
            drafted INTEGER,
            accepted INTEGER,
            stop_reason TEXT,
            exit_status INTEGER,
            valid INTEGER,
            cpu TEXT
        )""",
        "CREATE INDEX runs_time ON runs(time)",
        "CREATE INDEX runs_conversation ON runs(conversation_id)",
        """CREATE VIRTUAL TABLE runs_fts USING fts5(
            prompt, response, system, content='runs', content_rowid='id'
        )""",
        """CREATE TRIGGER runs_fts_insert AFTER INSERT ON runs BEGIN
            INSERT INTO runs_fts(rowid, prompt, response, system)
            VALUES (new.id, new.prompt, new.response, new.system);
        END""",
        """CREATE TRIGGER runs_fts_delete AFTER DELETE ON runs BEGIN
            INSERT INTO runs_fts(runs_fts, rowid, prompt, response, system)
            VALUES ('delete', old.id, old.prompt, old.response, old.system);
        END""",
    ),
    (
        # the share of decode steps at each thread count ("2:0.125,1:0.875"): `threads` is the count a run
        # ended with, which says nothing of the steps the governor ran before it dropped a thread
        "ALTER TABLE runs ADD COLUMN thread_shares TEXT",
    ),
    (
        # of generated_tokens, those a reasoning model thought with (its thinking is not in `response`)
        "ALTER TABLE runs ADD COLUMN reasoning_tokens INTEGER",
    ),
    (
        # the turns a conversation began with that none of its runs answered (`chat --load FILE`),
        # as JSON [{"user", "reply", "interrupted"}]: `chat --continue` starts from them
        "ALTER TABLE conversations ADD COLUMN carried TEXT",
    ),
    (
        # a reply's tool calls (chat and generate with MCP tools), as JSON
        # [{"name", "status", "chars" (of the result), "seconds"}]
        "ALTER TABLE runs ADD COLUMN tool_calls TEXT",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)

_DAMAGED = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}


class HistoryError(Exception):
    """The history cannot be used: a read-only place, a full disk, a lock held
    too long, or a database written by a newer localrun."""


def is_damaged(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.DatabaseError) and getattr(exc, "sqlite_errorcode", None) in _DAMAGED


def move_aside(path: Path) -> Path:
    """Rename a damaged database (and its WAL files) out of the way, never
    deleting it; where it went."""
    return paths.move_aside(path, ("-wal", "-shm"))


def _open(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    conn.row_factory = sqlite3.Row
    try:
        if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            conn.execute("PRAGMA journal_mode=WAL")
        _no_sync_on_close(conn)
        conn.execute("PRAGMA foreign_keys=ON")
        _migrate(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def _no_sync_on_close(conn: sqlite3.Connection) -> None:
    """WAL with synchronous=NORMAL: a commit appends to the WAL without an
    fsync; a checkpoint syncs the WAL, then the database. A crash of the
    process loses nothing committed, and a power loss at worst the last runs,
    never the file. A short-lived connection is the last to close, so SQLite
    would checkpoint on every close, an fsync or two that alone cost more
    than a run's whole logging budget on some disks; where Python can tell
    SQLite not to (3.12+), only the occasional automatic checkpoint syncs."""
    conn.execute("PRAGMA synchronous=NORMAL")
    setconfig = getattr(conn, "setconfig", None)
    option = getattr(sqlite3, "SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE", None)
    if setconfig is not None and option is not None:
        setconfig(option, True)


def _migrate(conn: sqlite3.Connection) -> None:
    """Bring the schema to SCHEMA_VERSION, one migration at a time, each in the
    transaction that records its version (so two processes never both run one)."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version == SCHEMA_VERSION:
        return
    if version > SCHEMA_VERSION:
        raise HistoryError(
            f"the history was written by a newer localrun (schema {version}, this one reads {SCHEMA_VERSION})"
        )
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]  # another process may have migrated meanwhile
        for number in range(version, SCHEMA_VERSION):
            for statement in MIGRATIONS[number]:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {number + 1}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _connect_once(path: Path) -> sqlite3.Connection:
    """One connection; a lock met while turning on WAL or migrating (several
    processes creating the file at once) is waited out a little longer."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            return _open(path)
        except sqlite3.OperationalError as exc:
            busy = getattr(exc, "sqlite_errorcode", None) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
            if not busy or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


@contextmanager
def connect(path: Path | None = None, *, moved: list[Path] | None = None) -> Iterator[sqlite3.Connection]:
    """A connection to the history (created on first use), closed afterwards.
    A damaged file is moved aside first and its new name appended to ``moved``.
    sqlite3 errors and OSError propagate: the caller decides how to warn."""
    path = path or paths.history_db()
    paths.ensure_dir(path.parent)
    try:
        conn = _connect_once(path)
    except sqlite3.DatabaseError as exc:
        if not is_damaged(exc):
            raise
        aside = move_aside(path)
        if moved is not None:
            moved.append(aside)
        conn = _connect_once(path)
    with closing(conn):
        yield conn


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """BEGIN IMMEDIATE ... COMMIT: a writer takes the lock up front, so it
    waits (busy timeout) rather than failing half way."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def reader(path: Path | None = None, *, moved: list[Path] | None = None) -> sqlite3.Connection | None:
    """A connection for reading, or None when there is no history yet. With
    ``moved``, a damaged file is moved aside (its new name appended there)
    and read as no history; without it, the damage propagates."""
    path = path or paths.history_db()
    if not path.exists():
        return None
    try:
        return _connect_once(path)
    except sqlite3.DatabaseError as exc:
        if moved is None or not is_damaged(exc):
            raise
        moved.append(move_aside(path))
        return None
