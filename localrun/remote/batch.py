"""`generate --batch` on a remote: up to ``parallel`` requests in flight,
each answer a `SequenceDone` as the local scheduler yields it, so the same
writer, progress bar and exit codes apply.

An answer cut mid-way is asked for again (the client already retries a busy
server and a failed connection); a line the server refuses gets its error
record. A server that cannot serve at all (unreachable, the key refused, the
model unknown) ends the run: what finished is written, `--resume` continues.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import Any

from localrun.errors import LocalrunError, ModelNotFoundError, RemoteUnavailableError, StreamCutError
from localrun.events import BatchProgress, DoneEvent, SequenceDone, TokenEvent
from localrun.remote.backend import Message, RemoteModel, Request
from localrun.runtime.batch.input import BatchLine
from localrun.runtime.batch.plan import BatchSettings
from localrun.runtime.prompt import compose

DEFAULT_PARALLEL = 32  # requests in flight: a server batches them (vLLM, SGLang, localrun serve)
_LINE_SAMPLING = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed")


@dataclass(frozen=True)
class SequenceFailed:
    """A line the server would not answer: its position and why."""

    index: int
    message: str


def request_for(line: BatchLine, settings: BatchSettings) -> Request:
    """The line as a request: its messages (the system prompt first unless
    they have one) or its prompt after the shared instruction, as a local
    run builds them; raw text to /completions with --raw or an OpenAI line's
    /v1/completions url."""
    system = line.settings.get("system", settings.system)
    raw = settings.raw or line.raw
    if line.messages is not None:
        has_system = any(m["role"] == "system" for m in line.messages)
        messages: list[Message] = (
            line.messages if has_system or not system else [{"role": "system", "content": system}, *line.messages]
        )
    else:
        text = compose(line.prompt, settings.instruction)
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": text})
    sampling = replace(settings.sampling, **{k: line.settings[k] for k in _LINE_SAMPLING if k in line.settings})
    common: dict[str, Any] = {
        "sampling": sampling,
        "max_tokens": line.settings.get("max_tokens", settings.max_tokens),
        "stop": line.stop if line.stop is not None else settings.stop,
        "output": line.output if line.output is not None else settings.output,
    }
    if raw:
        return Request(prompt="\n\n".join(m["content"] for m in messages), **common)
    return Request(messages=messages, **common)


def _answer(model: RemoteModel, position: int, request: Request, attempts: int) -> SequenceDone | None:
    """The whole answer (None if interrupted), asked again when it was cut."""
    for attempt in range(attempts):
        text, stats = "", None
        try:
            for ev in model.generate(request, keep_partial=False):
                if isinstance(ev, TokenEvent):
                    text += ev.text
                elif isinstance(ev, DoneEvent):
                    stats = ev.stats
        except StreamCutError:
            if attempt == attempts - 1 or model.abort_requested:
                raise
            model.client.sleep(model.client.retry.delay(attempt))
            continue
        assert stats is not None
        return None if stats.stop_reason == "interrupted" else SequenceDone(position, text, stats)
    raise AssertionError("unreachable")


def _outcome(future: Future[SequenceDone | None], position: int) -> SequenceDone | SequenceFailed | Exception | None:
    """What a finished request gave: its answer, its line's error, an error
    that ends the run (the server cannot serve at all), or None (cancelled, interrupted)."""
    if future.cancelled():
        return None
    try:
        return future.result()
    except Exception as exc:
        if isinstance(exc, RemoteUnavailableError | ModelNotFoundError) or not isinstance(exc, LocalrunError):
            return exc
        return SequenceFailed(position, exc.message)


def run_remote_batch(
    model: RemoteModel, lines: list[tuple[int, BatchLine]], settings: BatchSettings, parallel: int
) -> Iterator[SequenceDone | SequenceFailed | BatchProgress]:
    """Run ``lines`` (each with its output position) on ``model``, ``parallel`` at once."""
    t0 = time.perf_counter()
    total, done, generated, evaluated = len(lines), 0, 0, 0
    parallel = max(1, min(parallel, total))
    fatal: Exception | None = None

    def progress(final: bool = False) -> BatchProgress:
        interrupted = final and (model.abort_requested or fatal is not None) and done < total
        return BatchProgress(
            done, total, generated, evaluated, 0, time.perf_counter() - t0, parallel, final, interrupted
        )

    attempts = model.client.retry.attempts
    pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="remote")
    try:
        pending: dict[Future[SequenceDone | None], int] = {
            pool.submit(_answer, model, position, request_for(line, settings), attempts): position
            for position, line in lines
        }
        while pending:
            finished, _ = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
            for future in finished:
                outcome = _outcome(future, pending.pop(future))
                if isinstance(outcome, Exception):
                    fatal = fatal or outcome
                    model.abort_requested = True
                elif outcome is not None:
                    done += 1
                    if isinstance(outcome, SequenceDone):
                        generated += outcome.stats.generated_tokens
                        evaluated += outcome.stats.prompt_tokens - outcome.stats.cached_tokens
                    yield outcome
                    yield progress()
            if model.abort_requested:
                for future in pending:
                    future.cancel()
        yield progress(final=True)
    finally:
        model.abort_requested = True  # threads still running stop at their next piece
        pool.shutdown(wait=True, cancel_futures=True)
    if fatal is not None:
        raise fatal
