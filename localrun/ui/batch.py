"""Show a batch run: one JSON object per prompt, and progress on a terminal.

- `JsonlWriter`: the records, in input order (a finished record waits for the
  ones before it) or as they finish.
- `BatchProgressBar`: a Rich bar on stderr (prompts done, aggregate tokens/sec,
  ETA), redrawn from the loop's thread at most twice a second.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import IO, Any

from rich.progress import BarColumn, MofNCompleteColumn, TaskID, TextColumn

from localrun.events import BatchProgress, SequenceDone
from localrun.runtime.batch.input import BatchLine, LineId
from localrun.ui.progress import bar
from localrun.units import count

Record = dict[str, Any]


def result_record(line_id: LineId, done: SequenceDone) -> Record:
    s = done.stats
    return (
        {
            "id": line_id,
            "text": done.text,
            "stop_reason": s.stop_reason,
            "prompt_tokens": s.prompt_tokens,
            "generated_tokens": s.generated_tokens,
            "ttft_s": round(s.ttft_s, 4),
            "elapsed_s": round(s.elapsed_s, 4),
        }
        | ({"valid": s.valid, "forced_tokens": s.forced_tokens} if s.valid is not None else {})
        | ({"invalid": s.invalid} if s.invalid else {})
    )


def error_record(line_id: LineId, message: str) -> Record:
    return {"id": line_id, "error": message}


def _request_id() -> str:
    return "batch_req_" + uuid.uuid4().hex[:24]


def openai_result(line: BatchLine, done: SequenceDone, model: str) -> Record:
    """OpenAI's Batch output line (as `vllm run-batch` writes it): the
    response body a server would have sent; "valid" beside it when the line
    has a schema."""
    from localrun.serve.responses import Kind, Reply

    kind: Kind = "text" if line.raw else "chat"
    body = Reply(kind, model).whole(done.text, done.stats)
    record: Record = {
        "id": _request_id(),
        "custom_id": line.id,
        "response": {"status_code": 200, "request_id": body["id"], "body": body},
        "error": None,
    }
    if done.stats.valid is not None:
        record["valid"] = done.stats.valid
        if done.stats.invalid:
            record["invalid"] = done.stats.invalid
    return record


def openai_error(line: BatchLine, message: str) -> Record:
    return {"id": _request_id(), "custom_id": line.id, "response": None, "error": {"code": None, "message": message}}


def record_for(line: BatchLine, done: SequenceDone, model: str) -> Record:
    """A line's result in the format it came in."""
    return openai_result(line, done, model) if line.format == "openai" else result_record(line.id, done)


def error_for(line: BatchLine, message: str) -> Record:
    return openai_error(line, message) if line.format == "openai" else error_record(line.id, message)


class JsonlWriter:
    """Writes records by their position in the input: in that order when
    ``ordered`` (each waits for the ones before it), else at once."""

    def __init__(self, emit: Callable[[str], None], *, ordered: bool) -> None:
        self.emit = emit
        self.ordered = ordered
        self.held: dict[int, Record] = {}
        self.next = 0  # the position the ordered output waits for
        self.written = 0

    def _write(self, record: Record) -> None:
        self.emit(json.dumps(record, ensure_ascii=False) + "\n")
        self.written += 1

    def add(self, position: int, record: Record) -> None:
        if not self.ordered:
            self._write(record)
            return
        self.held[position] = record
        while self.next in self.held:
            self._write(self.held.pop(self.next))
            self.next += 1

    def flush_finished(self) -> None:
        """The run stopped early: write what finished, in order, leaving gaps for what did not."""
        for position in sorted(self.held):
            self._write(self.held.pop(position))


def _eta(p: BatchProgress) -> str:
    if not p.done or p.done >= p.total:
        return "eta -"
    seconds = int(p.elapsed_s / p.done * (p.total - p.done))
    return f"eta {seconds // 60}:{seconds % 60:02d}"


def summary(p: BatchProgress, failed: int) -> str:
    state = "interrupted after" if p.interrupted else "done:"
    prefix = f", shared prefix {count(p.shared_prefix, 'token')}" if p.shared_prefix else ""
    return (
        f"batch {state} {p.done}/{p.total} prompts, {count(p.generated_tokens, 'token')} in {p.elapsed_s:.1f}s "
        f"({p.tokens_per_s:.1f} tok/s aggregate, {p.parallel} at a time){prefix}"
        + (f"; {count(failed, 'line')} failed" if failed else "")
    )


class BatchProgressBar:
    """Progress on a terminal; does nothing when ``err`` is not one
    (``terminal``: whether it is, when the caller knows; else asked)."""

    def __init__(self, err: IO[str], total: int, *, refresh_s: float = 0.5, terminal: bool | None = None) -> None:
        self.err = err
        self.refresh_s = refresh_s
        self.next_refresh = 0.0
        self.task: TaskID | None = None
        self.progress = bar(
            err,
            TextColumn("prompts"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TextColumn("{task.fields[eta]}"),
            terminal=terminal,
            auto_refresh=False,  # a refresh thread would preempt llama.cpp's compute threads
            redirect_stdout=False,
        )
        if self.progress is not None:
            self.task = self.progress.add_task("batch", total=total, rate="- tok/s", eta="eta -")

    def __enter__(self) -> BatchProgressBar:
        if self.progress is not None:
            self.progress.start()
        return self

    def print_line(self, text: str) -> None:
        """Text for the terminal, printed above the bar."""
        if self.progress is not None:
            self.progress.console.print(text.rstrip("\n"), markup=False, highlight=False, soft_wrap=True)

    def update(self, p: BatchProgress) -> None:
        if self.progress is None or self.task is None:
            return
        now = time.perf_counter()
        if now < self.next_refresh and not p.final:
            return
        self.next_refresh = now + self.refresh_s
        self.progress.update(self.task, completed=p.done, rate=f"{p.tokens_per_s:.1f} tok/s", eta=_eta(p))
        self.progress.refresh()

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()
