"""The run history from a command's side: the recorder each command makes
from what it resolved, and the exit status a run's figures mean."""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Annotated, Any

import typer

from localrun.cli._errors import ExitCode
from localrun.cli._output import out
from localrun.errors import LocalrunError, UsageError
from localrun.system import default_threads

if TYPE_CHECKING:
    from localrun.cli._options import PlannedRun
    from localrun.events import SequenceDone, Stats
    from localrun.history.record import Recorder, RunContext
    from localrun.remote.config import Remote
    from localrun.runtime.batch.input import BatchLine
    from localrun.runtime.chat import Conversation
    from localrun.runtime.engine import Engine
    from localrun.serve.events import ServeEvent
    from localrun.structured.spec import OutputSpec

NoLog = Annotated[
    bool,
    typer.Option("--no-log", help="Do not log this run in the history (also LOCALRUN_NO_LOG=1; localrun logs off)."),
]


def context(
    command: str,
    resolved: PlannedRun,
    *,
    output: OutputSpec | None = None,
    engine: Engine | None = None,
    parallel: int | None = None,
    draft: str | None = None,
    remote: str | None = None,
) -> RunContext:
    """What a record says of the model and the settings that shape speed, each with its source."""
    from localrun.history.record import RunContext, kv_label

    target, settings, config = resolved.target, resolved.settings, resolved.config
    entry = target.entry
    mirrors: Any = entry.mirrors if entry is not None else ()
    as_dict: dict[str, Any] = resolved.report()
    if output is not None:
        as_dict["schema"] = {"value": output.source or output.kind, "source": "option"}
    return RunContext(
        command=command,
        model=entry.alias if entry is not None else target.path.name if target.path is not None else target.label,
        model_file=str(config.model_path),
        model_sha256=mirrors[0].sha256 if mirrors else None,
        remote=remote,
        kv=kv_label(config.type_k, config.type_v),
        flash_attn=config.flash_attn,
        draft=draft if draft is not None else settings.draft,
        ctx=engine.n_ctx if engine is not None else settings.n_ctx,
        threads=engine.threads if engine is not None else settings.threads or config.n_threads or default_threads(),
        parallel=parallel if parallel is not None else settings.parallel,
        schema=(output.source or output.kind) if output is not None else None,
        settings=as_dict,
        system=settings.system,
    )


def recorder(run: RunContext | None, *, no_log: bool = False) -> Recorder:
    """The command's recorder; it warns through the command's stderr, once."""
    from localrun.history.record import Recorder, RunContext, logging_enabled

    enabled = run is not None and logging_enabled(no_log)
    return Recorder(run or RunContext("none", cpu=""), warn=out().warn, enabled=enabled)


def exit_status(stats: Stats) -> ExitCode:
    """What a run's end means for the exit status, as the commands decide it."""
    if stats.stop_reason == "interrupted":
        return ExitCode.INTERRUPTED
    if stats.stop_reason == "error":  # a remote's stream cut mid-way
        return ExitCode.STREAM_CUT
    if stats.valid is False:
        return ExitCode.INVALID_OUTPUT
    return ExitCode.OK


def last_conversation() -> tuple[int, Conversation]:
    """`chat --continue`: the last conversation logged (its id; its system
    prompt, turns and model). A damaged history is moved aside (said once), as `localrun logs` does."""
    import sqlite3
    from pathlib import Path

    from localrun import paths
    from localrun.history.db import HistoryError, reader
    from localrun.history.query import conversation_model
    from localrun.history.query import last_conversation as last
    from localrun.runtime.chat import Conversation, Turn

    moved: list[Path] = []
    try:
        conn = reader(moved=moved)
        try:
            found = last(conn) if conn is not None else None
            model = conversation_model(conn, found[0]) if conn is not None and found is not None else None
        finally:
            if conn is not None:
                conn.close()
    except (sqlite3.Error, HistoryError) as exc:
        raise LocalrunError(f"cannot read the run history {paths.history_db()}: {exc}") from None
    if moved:
        out().warn(f"the run history was damaged; moved it to {moved[0]}")
    if found is None:
        raise UsageError("there is no conversation in the run history to continue", hint="start one: localrun chat")
    conversation_id, system, turns = found
    return conversation_id, Conversation(system, [Turn(t.user, t.reply, t.interrupted) for t in turns], model)


class ServeLog:
    """`serve`: each request answered is logged by a thread of its own, so no
    request waits for the database. ``contexts``: each served model's, by the id requests name."""

    def __init__(self, contexts: dict[str, RunContext], *, no_log: bool = False) -> None:
        from localrun.history.record import BackgroundRecorder

        self.contexts = contexts
        self.background = BackgroundRecorder(recorder(next(iter(contexts.values()), None), no_log=no_log))

    def tee(self, show: Callable[[ServeEvent], None]) -> Callable[[ServeEvent], None]:
        """``show``, and each finished request logged."""
        from localrun.serve.events import RequestDone

        def handle(ev: ServeEvent) -> None:
            show(ev)
            if isinstance(ev, RequestDone) and ev.model in self.contexts:
                self.background.add(
                    self.contexts[ev.model],
                    None,
                    prompt_tokens=ev.prompt_tokens,
                    cached_tokens=ev.cached_tokens,
                    generated_tokens=ev.generated_tokens,
                    decode_tps=ev.decode_tokens_per_s or None,
                    elapsed_s=ev.elapsed_s,
                    stop_reason=ev.outcome,
                    exit_status=ev.status,  # a request's: its HTTP status
                    prompt=ev.prompt,
                    response=ev.response,
                )

        return handle

    def __enter__(self) -> ServeLog:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.background.close()


def line_prompt(prompt: str | None, messages: list[dict[str, str]] | None) -> str | None:
    """What a batch line asks: its prompt, or its messages' user text."""
    if prompt is not None:
        return prompt
    users = [m.get("content", "") for m in messages or () if m.get("role", "user") == "user"]
    return "\n\n".join(users) if users else None


def add_line(recorder: Recorder, line: BatchLine, done: SequenceDone, parallel: int, ctx: int | None = None) -> None:
    """A batch line's record: its prompt, text and figures, the batch's parallel and context."""
    recorder.add(
        done.stats,
        prompt=line_prompt(line.prompt, line.messages),
        response=done.text,
        exit_status=exit_status(done.stats),
        parallel=parallel,
        ctx=ctx,
    )


def remote_context(
    command: str,
    remote: Remote,
    model: str,
    settings: dict[str, Any],
    output: OutputSpec | None = None,
    system: str | None = None,
) -> RunContext:
    """A run on a remote server: the model id it answered to and the server's
    URL (without any user name or password in it); the rest is the server's."""
    from urllib.parse import urlsplit, urlunsplit

    from localrun.history.record import RunContext

    parts = urlsplit(remote.url)
    netloc = parts.netloc.rpartition("@")[2]
    return RunContext(
        command=command,
        model=model,
        remote=urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment)),
        schema=(output.source or output.kind) if output is not None else None,
        settings=settings,
        system=system,
    )
