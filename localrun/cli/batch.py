"""`localrun generate --batch`: many prompts, one JSON object per prompt.

Reads the input, tokenizes every line, sizes the run (each sequence's
context, how many run at once), then hands the prompts to the continuous
batching core and writes its results.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

from localrun.runtime.batch.scheduler import BatchRequest, default_parallel, parallel_that_fits, run_batch, slot_context
from localrun.runtime.batch.input import BatchLine, LineId, finished_ids, read_lines
from localrun.ui.batch import BatchProgressBar, JsonlWriter, error_record, result_record, summary
from localrun.cli._errors import ExitCode
from localrun.cli.generate import ctrl_c_stops
from localrun.runtime.decode import SamplingParams
from localrun.runtime.engine import DEFAULT_CTX, Engine, EngineConfig, memory_budget
from localrun.errors import BadModelError, LocalrunError, UsageError
from localrun.events import BatchProgress, SequenceDone
from localrun.gguf.reader import GGUFInfo
from localrun.gguf.info import CONTEXT_STEP, describe
from localrun.runtime.prompt import chat_tokens, compose, prompt_tokens


@dataclass(frozen=True)
class BatchSettings:
    source: str  # a file, or "-" for stdin
    instruction: str | None  # the PROMPT argument: put before every line's prompt
    system: str | None
    raw: bool
    sampling: SamplingParams
    max_tokens: int | None
    stop: tuple[str, ...]
    seq_ctx: int | None  # --ctx: each sequence's context; None: sized from the prompts
    parallel: int | None  # None: chosen from the context and the memory budget
    unordered: bool
    resume: Path | None  # skip the ids in this file and append to it
    show_stats: bool


@dataclass
class _Job:
    """A line to run: where it sits in the output, and its tokens once known."""

    position: int
    line: BatchLine
    tokens: list[int] | None = None
    max_tokens: int | None = None
    error: str | None = None


def _read_source(source: str) -> list[BatchLine]:
    if source == "-":
        return read_lines(sys.stdin)
    path = Path(source)
    if not path.is_file():
        raise UsageError(f"--batch {source}: no such file", hint="give a file of prompts, or - for stdin")
    with path.open(encoding="utf-8", errors="replace") as f:
        return read_lines(f)


def _sampling(base: SamplingParams, line: BatchLine) -> SamplingParams:
    keys = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed")
    return replace(base, **{k: line.settings[k] for k in keys if k in line.settings})


def _tokenize(engine: Engine, job: _Job, settings: BatchSettings) -> None:
    line = job.line
    system = line.settings.get("system", settings.system)
    try:
        if line.messages is not None:
            has_system = any(m["role"] == "system" for m in line.messages)
            messages = (
                line.messages if has_system or not system else [{"role": "system", "content": system}, *line.messages]
            )
            job.tokens = chat_tokens(engine, messages, raw=settings.raw)
        else:
            text = compose(line.prompt, settings.instruction)  # the shared argument first: a common prefix
            job.tokens = prompt_tokens(engine, text, system=system, raw=settings.raw)
    except (UsageError, BadModelError) as exc:
        job.error = exc.message
        return
    if not job.tokens:
        job.error = "the prompt is empty"
    job.max_tokens = line.settings.get("max_tokens", settings.max_tokens)


def _sequence_context(jobs: list[_Job], settings: BatchSettings, n_ctx_train: int) -> int:
    """--ctx, or just enough for the longest prompt and its max tokens (a
    line without max tokens may run on to DEFAULT_CTX), at most the trained context."""
    if settings.seq_ctx is not None:
        return -(-settings.seq_ctx // CONTEXT_STEP) * CONTEXT_STEP
    need = 1
    for job in jobs:
        if job.tokens is not None:
            n = len(job.tokens)
            need = max(need, n + job.max_tokens if job.max_tokens is not None else max(DEFAULT_CTX, n + 1))
    return slot_context(need, n_ctx_train)


@contextmanager
def _output(settings: BatchSettings) -> Iterator[IO[str]]:
    """stdout, or with --resume the output file, opened for appending (after a
    newline if the last run was cut off mid-line)."""
    if settings.resume is None:
        yield sys.stdout
        return
    path = settings.resume
    cut = False
    if path.exists() and path.stat().st_size:
        with path.open("rb") as f:
            f.seek(-1, 2)
            cut = f.read(1) != b"\n"
    with path.open("a", encoding="utf-8") as f:
        if cut:
            f.write("\n")
        yield f


def run(settings: BatchSettings, config: EngineConfig, info: GGUFInfo) -> int:
    """Run the batch; returns the exit code (0, BATCH_FAILED when a line failed, 130 when interrupted)."""
    if settings.parallel is not None and settings.parallel < 1:
        raise UsageError("--parallel must be at least 1")
    if settings.seq_ctx is not None and settings.seq_ctx < 16:
        raise UsageError(f"context size {settings.seq_ctx} is too small", hint="use --ctx 512 or more")
    lines = _read_source(settings.source)
    done_ids: set[LineId] = finished_ids(settings.resume) if settings.resume else set()
    jobs = [_Job(i, line, error=line.error) for i, line in enumerate(x for x in lines if x.id not in done_ids)]
    if not jobs:
        return int(ExitCode.OK)
    # tokenize with a small context: the real one is sized from the prompts
    with Engine(replace(config, n_ctx=CONTEXT_STEP, n_seq_max=1), info) as tokenizer:
        n_ctx_train = tokenizer.n_ctx_train
        for job in jobs:
            if job.error is None:
                _tokenize(tokenizer, job, settings)
    seq_ctx = _sequence_context(jobs, settings, n_ctx_train)
    for job in jobs:
        if job.error is None and job.tokens is not None and len(job.tokens) >= seq_ctx:
            job.error = f"the prompt is {len(job.tokens)} tokens; each sequence's context holds {seq_ctx}"
    runnable = [job for job in jobs if job.error is None]
    parallel = _parallel(len(runnable), seq_ctx, settings, config, info)

    failed = [job for job in jobs if job.error is not None]
    final: BatchProgress | None = None
    with _output(settings) as out, BatchProgressBar(sys.stderr, len(runnable)) as bar:
        to_terminal = settings.resume is None and out.isatty() and sys.stderr.isatty()
        writer = JsonlWriter(bar.print_line if to_terminal else _writer(out), ordered=not settings.unordered)
        for job in failed:
            writer.add(job.position, error_record(job.line.id, job.error or ""))
        if runnable:
            run_config = replace(config, n_ctx=parallel * seq_ctx, n_seq_max=parallel)
            final = _run_jobs(runnable, settings, run_config, info, writer, bar)
    if final is not None and (settings.show_stats or final.interrupted or sys.stderr.isatty()):
        sys.stderr.write(summary(final, len(failed)) + "\n")
    elif failed:
        sys.stderr.write(f"warning: {len(failed)} of {len(jobs)} lines failed; see their error records\n")
    if final is not None and final.interrupted:
        return int(ExitCode.INTERRUPTED)
    return int(ExitCode.BATCH_FAILED) if failed else int(ExitCode.OK)


def _parallel(n_prompts: int, seq_ctx: int, settings: BatchSettings, config: EngineConfig, info: GGUFInfo) -> int:
    """--parallel, checked against memory; by default as many as fit, up to DEFAULT_MAX_PARALLEL."""
    budget = memory_budget(config.memory_budget)
    fits = parallel_that_fits(describe(info), seq_ctx, config.type_k, config.type_v, budget) if budget else None
    if fits == 0 and n_prompts:
        raise UsageError(
            f"not even one sequence of {seq_ctx} tokens fits in {budget / 2**30:.1f} GiB beside the weights",
            hint="lower --max-tokens or --ctx, or use --kv q8_0",
        )
    if settings.parallel is not None and fits is not None and settings.parallel > fits:
        raise UsageError(
            f"--parallel {settings.parallel} with {seq_ctx}-token sequences does not fit in memory; {fits} do",
            hint=f"use --parallel {fits}, a smaller --ctx or --max-tokens, or --kv q8_0",
        )
    return min(settings.parallel or default_parallel(n_prompts, fits), max(n_prompts, 1))


def _writer(out: IO[str]) -> Callable[[str], None]:
    def emit(text: str) -> None:
        out.write(text)
        out.flush()

    return emit


def _run_jobs(
    jobs: list[_Job],
    settings: BatchSettings,
    config: EngineConfig,
    info: GGUFInfo,
    writer: JsonlWriter,
    bar: BatchProgressBar,
) -> BatchProgress:
    by_position = {job.position: job for job in jobs}
    requests = [
        BatchRequest(
            index=job.position,
            tokens=job.tokens or [],
            sampling=_sampling(settings.sampling, job.line),
            max_tokens=job.max_tokens,
            stop=job.line.stop if job.line.stop is not None else settings.stop,
        )
        for job in jobs
    ]
    final: BatchProgress | None = None
    with Engine(config, info) as engine, ctrl_c_stops(engine):
        try:
            for ev in run_batch(engine, requests):
                if isinstance(ev, SequenceDone):
                    writer.add(ev.index, result_record(by_position[ev.index].line.id, ev))
                else:
                    bar.update(ev)
                    final = ev
        finally:
            if final is None or not final.final or final.interrupted:
                writer.flush_finished()
    if final is None:
        raise LocalrunError("the batch ended without a summary")
    return final
