"""What a record holds, and the recorder a command feeds.

A command builds a `RunContext` (the model and every setting that shapes
speed, each with its source) and a `Recorder`. The recorder watches the
events the command already renders, keeping each TokenEvent it sees (one
list append per token, nothing more), and builds the row when the DoneEvent
passes. `flush` writes the rows in one short transaction after the text was
shown. It never raises: a database that cannot be written costs one warning
(through the ``warn`` callback) and the run goes on.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from localrun import paths
from localrun.events import DoneEvent, Event, Stats, TokenEvent

Warn = Callable[[str], None]
NO_LOG_ENV = "LOCALRUN_NO_LOG"


def logging_enabled(no_log: bool = False) -> bool:
    """Whether this run is logged: not with --no-log, LOCALRUN_NO_LOG=1, or after `localrun logs off`."""
    if no_log or os.environ.get(NO_LOG_ENV, "").strip().lower() not in ("", "0", "false", "no"):
        return False
    return not paths.history_off_marker().exists()


@dataclass
class RunContext:
    """What a command knows about its runs before they start."""

    command: str  # generate, chat, batch, serve
    model: str | None = None  # the name the user gave (an alias, a file's name, a remote)
    model_file: str | None = None
    model_sha256: str | None = None
    remote: str | None = None  # the server's URL, for a remote model
    kv: str | None = None  # "f16", or "q8_0/q4_0" when K and V differ
    flash_attn: str | None = None
    draft: str | None = None  # the speculation setting (auto, none, lookup, a draft model)
    ctx: int | None = None
    threads: int | None = None
    parallel: int | None = None
    schema: str | None = None  # where --schema or --grammar came from
    settings: dict[str, Any] | None = None  # each setting with its value and source
    system: str | None = None
    cpu: str | None = None

    def __post_init__(self) -> None:
        if self.cpu is None:
            from localrun.tune.machine import cpu_name

            self.cpu = cpu_name()


def kv_label(type_k: str | None, type_v: str | None) -> str | None:
    if type_k is None and type_v is None:
        return None
    return type_k if type_k == type_v else f"{type_k}/{type_v}"


def token_times_ms(events: Sequence[TokenEvent]) -> tuple[float | None, float | None]:
    """p50 and p95 of the time per generated token after the first, in ms,
    from the events' own clocks: tokens that came in one event (a held-back
    piece of text, an accepted draft) share the gap before it."""
    gaps: list[tuple[float, int]] = []
    for before, after in itertools.pairwise(events):
        count = after.generated_tokens - before.generated_tokens
        if count > 0:
            gaps.append(((after.elapsed_s - before.elapsed_s) * 1000 / count, count))
    if not gaps:
        return None, None
    gaps.sort()
    total = sum(count for _, count in gaps)

    def at(q: float) -> float:  # nearest rank: the smallest time that q of the tokens do not exceed
        target, seen = max(1, math.ceil(q * total)), 0
        for value, count in gaps:
            seen += count
            if seen >= target:
                return value
        return gaps[-1][0]

    return at(0.5), at(0.95)


COLUMNS: tuple[str, ...] = (
    "time",
    "command",
    "conversation_id",
    "retry",
    "model",
    "model_file",
    "model_sha256",
    "remote",
    "kv",
    "flash_attn",
    "draft",
    "drafter",
    "ctx",
    "threads",
    "thread_shares",
    "parallel",
    "schema",
    "settings",
    "system",
    "prompt",
    "response",
    "prompt_tokens",
    "cached_tokens",
    "generated_tokens",
    "reasoning_tokens",
    "ttft_s",
    "decode_tps",
    "prompt_tps",
    "elapsed_s",
    "token_p50_ms",
    "token_p95_ms",
    "drafted",
    "accepted",
    "stop_reason",
    "exit_status",
    "valid",
    "cpu",
    "tool_calls",
)
_INSERT = f"INSERT INTO runs ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
_CONTEXT_COLUMNS = {f.name for f in fields(RunContext)} & set(COLUMNS)


class _Turn(Protocol):
    user: str
    reply: str


@dataclass
class Conversation:
    """A chat's conversation: its id once written, and the turns recorded in it (to tell a retry
    or a new conversation from the next turn)."""

    id: int | None = None
    turns: list[Any] = field(default_factory=list)
    carried: list[Any] = field(default_factory=list)  # turns it began with that no run of it answered (/load)


def row(
    context: RunContext,
    stats: Stats | None,
    *,
    prompt: str | None,
    response: str | None,
    tokens: Sequence[TokenEvent] = (),
    exit_status: int | None = None,
    when: float | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The record of one run: the context, the text, and the figures from ``stats``."""
    values: dict[str, Any] = {name: getattr(context, name) for name in _CONTEXT_COLUMNS}
    values["settings"] = json.dumps(context.settings, default=str) if context.settings is not None else None
    values |= {"time": when if when is not None else time.time(), "prompt": prompt, "response": response}
    values["exit_status"] = exit_status
    values["retry"] = 0
    if stats is not None:
        p50, p95 = token_times_ms(tokens)
        values |= {
            "prompt_tokens": stats.prompt_tokens,
            "cached_tokens": stats.cached_tokens,
            "generated_tokens": stats.generated_tokens,
            "reasoning_tokens": stats.reasoning_tokens or None,
            "ttft_s": stats.ttft_s if stats.generated_tokens else None,
            "decode_tps": stats.decode_tokens_per_s or None,
            "prompt_tps": stats.prompt_tokens_per_s or None,
            "elapsed_s": stats.elapsed_s,
            "token_p50_ms": p50,
            "token_p95_ms": p95,
            "stop_reason": stats.stop_reason,
            "valid": stats.valid,
        }
        if stats.threads is not None:
            values["threads"] = stats.threads
        if stats.thread_shares:
            values["thread_shares"] = ",".join(f"{n}:{share:g}" for n, share in stats.thread_shares.items())
        if stats.draft is not None:
            draft = stats.draft
            values |= {"drafter": draft.drafter, "drafted": draft.proposed, "accepted": draft.accepted}
    return values | extra


class Recorder:
    """Collects a command's records and writes them after the text is shown.

    ``watch`` wraps a generation's events; ``add`` takes a finished one
    (a batch line); ``flush`` writes what is pending. A disabled recorder
    (--no-log, LOCALRUN_NO_LOG, `logs off`) does nothing and costs nothing."""

    def __init__(self, context: RunContext, *, warn: Warn, enabled: bool = True, path: Path | None = None) -> None:
        self.context = context
        self.warn = warn
        self.enabled = enabled
        self.path = path
        self.pending: list[dict[str, Any]] = []
        self.conversation: Conversation | None = None
        self.written = 0
        self._warned = False

    # -- collecting --

    def watch(self, events: Iterable[Event], prompt: str | None, **extra: Any) -> Iterable[Event]:
        """``events``, passed through; the run's record is pending once its DoneEvent went by."""
        if not self.enabled:
            return events
        return self._watch(events, prompt, extra)

    def _watch(self, events: Iterable[Event], prompt: str | None, extra: dict[str, Any]) -> Iterator[Event]:
        seen: list[TokenEvent] = []
        keep = seen.append
        for ev in events:
            if isinstance(ev, TokenEvent):
                keep(ev)
            elif isinstance(ev, DoneEvent):
                response = "".join(t.text for t in seen)
                self.pending.append(row(self.context, ev.stats, prompt=prompt, response=response, tokens=seen, **extra))
            yield ev

    def watch_turn(self, turns: Sequence[_Turn], events: Iterable[Event], *, system: str | None) -> Iterable[Event]:
        """A chat turn: the reply to ``turns[-1]`` (the session's turns, the last
        one just planned), under the session's ``system`` prompt. The turns
        before it tell whether this continues the conversation, retries its
        last reply, or starts a new one (after /clear, /system or /load); a
        new one that starts from turns no run answered (`chat --load`, /load)
        carries them, so that `chat --continue` finds them."""
        if not self.enabled or not turns:
            return events
        current = turns[-1]
        before = list(turns[:-1])
        conversation = self.conversation
        if conversation is None or not _continues(conversation.turns, before):
            conversation = self.conversation = Conversation(turns=list(before), carried=list(before))
        # a retry replaces the last reply: the turn it answered is gone from the session
        retry = bool(conversation.turns) and (not before or conversation.turns[-1] is not before[-1])
        if retry:
            conversation.turns.pop()
        conversation.turns.append(current)
        extra = {"_conversation": conversation, "retry": int(retry), "system": system}
        return self._watch(events, current.user, extra)

    def resume(self, conversation_id: int, turns: Sequence[_Turn]) -> None:
        """Turns taken from the history (`chat --continue`): the next ones continue that conversation."""
        self.conversation = Conversation(conversation_id, list(turns))

    def add(self, stats: Stats | None, *, prompt: str | None, response: str | None, **extra: Any) -> None:
        """A run that finished elsewhere (a batch line, a server request)."""
        if self.enabled:
            self.pending.append(row(self.context, stats, prompt=prompt, response=response, **extra))

    # -- writing --

    def flush(self, exit_status: int | None = None) -> None:
        """Write the pending records (``exit_status`` for those without one). Never raises."""
        if not self.enabled or not self.pending:
            return
        import sqlite3  # here, not at the top: a command that logs nothing never loads it

        from localrun.history.db import HistoryError, is_damaged, move_aside

        rows, self.pending = self.pending, []
        moved: list[Path] = []
        try:
            try:
                self._write(rows, exit_status, moved)
            except sqlite3.DatabaseError as exc:  # damage found past the header: set it aside, start again
                if not is_damaged(exc):
                    raise
                moved.append(move_aside(self.path or paths.history_db()))
                self._write(rows, exit_status, moved)
        except (sqlite3.Error, OSError, HistoryError) as exc:
            where = "" if isinstance(exc, OSError) and exc.filename else f" ({self.path or paths.history_db()})"
            self._warn_once(
                f"this run was not logged: {describe_failure(exc)}{where}; `localrun logs off` stops trying"
            )
            return
        if moved:
            self._warn_once(f"the run history was damaged; moved it to {moved[0]} and started a new one")

    def _write(self, rows: list[dict[str, Any]], exit_status: int | None, moved: list[Path]) -> None:
        from localrun.history.db import connect, transaction

        started: list[Conversation] = []  # conversations this transaction creates
        try:
            with connect(self.path, moved=moved) as conn, transaction(conn):
                for values in rows:
                    conversation = values.get("_conversation")
                    if conversation is not None and conversation.id is None:
                        conversation.id = conn.execute(
                            "INSERT INTO conversations (started, model, system, carried) VALUES (?, ?, ?, ?)",
                            (values["time"], values["model"], values["system"], _carried(conversation.carried)),
                        ).lastrowid
                        started.append(conversation)
                    if conversation is not None:
                        values["conversation_id"] = conversation.id
                    conn.execute(_INSERT, [_value(values, name, exit_status) for name in COLUMNS])
        except BaseException:
            for conversation in started:  # rolled back: the next write starts them again
                conversation.id = None
            raise
        self.written += len(rows)

    def _warn_once(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            self.warn(message)


def _value(values: dict[str, Any], name: str, exit_status: int | None) -> Any:
    if name == "exit_status" and values.get(name) is None:
        return exit_status
    return values.get(name)


def _carried(turns: list[Any]) -> str | None:
    """A conversation's carried turns as the database keeps them (JSON), None for none."""
    if not turns:
        return None
    return json.dumps(
        [{"user": t.user, "reply": t.reply, "interrupted": bool(getattr(t, "interrupted", False))} for t in turns],
        ensure_ascii=False,
    )


def _continues(recorded: list[Any], before: list[Any]) -> bool:
    """Whether the turns before a new one are the recorded conversation (less
    the oldest turns, dropped to fit the context, and less the last one, on a retry)."""
    if not before:
        return len(recorded) <= 1  # a first turn again: a retry of it (or a new conversation, the same thing)
    ids = [id(t) for t in recorded]
    try:
        start = ids.index(id(before[0]))
    except ValueError:
        return False
    return ids[start : start + len(before)] == [id(t) for t in before] and start + len(before) >= len(ids) - 1


def describe_failure(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.strerror or exc} ({exc.filename})"
    return str(exc) or type(exc).__name__


# ----------------------------------------------------------------- serve --


class BackgroundRecorder:
    """For a server: records are queued from any thread and written by one
    thread of their own, so a request never waits for the database."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.queue: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="localrun-history", daemon=True)
        if recorder.enabled:
            self.thread.start()

    def add(self, context: RunContext, stats: Stats | None, **values: Any) -> None:
        if self.recorder.enabled:
            prompt, response = values.pop("prompt", None), values.pop("response", None)
            self.queue.put(row(context, stats, prompt=prompt, response=response, **values))

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            batch = [item]
            while not self.queue.empty():
                batch.append(self.queue.get())
            done = None in batch
            self.recorder.pending.extend(r for r in batch if r is not None)
            self.recorder.flush()
            if done:
                return

    def close(self, timeout: float = 5.0) -> None:
        if self.thread.is_alive():
            self.queue.put(None)
            self.thread.join(timeout)
