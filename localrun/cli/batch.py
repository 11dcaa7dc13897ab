"""`localrun generate --batch`: read the lines, plan and run them in the core,
write one JSON object per line."""

from __future__ import annotations

import contextlib
import dataclasses
import io
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING

from localrun.cli import _history
from localrun.cli import _options as opt
from localrun.cli._env import current
from localrun.cli._errors import ExitCode
from localrun.cli._output import out
from localrun.cli._signals import ctrl_c_stops
from localrun.errors import LocalrunError, UsageError
from localrun.events import BatchProgress, SequenceDone
from localrun.runtime.batch.input import BatchLine, finished_ids, read_lines
from localrun.runtime.batch.plan import BatchPlan, BatchSettings, Job, batch_plan, jobs_for, running, tokenize_jobs
from localrun.runtime.engine import EngineConfig, Vocabulary, Weights
from localrun.ui.batch import BatchProgressBar, JsonlWriter, error_for, record_for, summary

if TYPE_CHECKING:
    from localrun.history.record import Recorder
    from localrun.remote.backend import RemoteModel
    from localrun.structured.spec import OutputSpec


def _read_source(source: str) -> list[BatchLine]:
    if source == "-":
        stdin = current().stdin
        if isinstance(stdin, io.TextIOWrapper):  # as for a file: a line not UTF-8 fails alone
            stdin.reconfigure(errors="surrogateescape")
        return read_lines(stdin)
    path = Path(source)
    if path.is_dir() or not path.exists():  # a FIFO (`<(...)`, /dev/stdin) is read as a file is
        what = "is a folder" if path.is_dir() else "no such file"
        raise UsageError(f"--batch {source}: {what}", hint="give a file of prompts, or - for stdin")
    with path.open(encoding="utf-8", errors="surrogateescape") as f:  # a line not UTF-8 fails alone
        return read_lines(f)


@contextmanager
def _output(resume: Path | None) -> Iterator[IO[str]]:
    """stdout, or with --resume the output file, opened for appending (after a
    newline if the last run was cut off mid-line)."""
    if resume is None:
        yield current().stdout
        return
    cut = False
    if resume.exists() and resume.stat().st_size:
        with resume.open("rb") as f:
            f.seek(-1, 2)
            cut = f.read(1) != b"\n"
    with resume.open("a", encoding="utf-8") as f:
        if cut:
            f.write("\n")
        yield f


def _jobs(source: str, settings: BatchSettings, resume: Path | None) -> list[Job]:
    """The lines still to run (those ``resume`` has no record of), after the settings and the file are checked."""
    if resume is not None:
        opt.check_output_file("--resume", resume)
    done_ids = finished_ids(resume) if resume is not None else set()
    lines = _read_source(source)
    todo = [line for line in lines if line.id not in done_ids]
    if not todo:  # said, not a silent exit
        where = "stdin" if source == "-" else source
        out().note(
            f"nothing to run: every line of {where} has a record in {resume} already"
            if lines
            else f"nothing to run: {where} holds no prompts"
        )
    return jobs_for(todo)


def _writer(out: IO[str]) -> Callable[[str], None]:
    def emit(text: str) -> None:
        out.write(text)
        out.flush()

    return emit


def run(
    source: str,
    settings: BatchSettings,
    settled: opt.Settled,
    *,
    verbose: bool = False,
    unordered: bool = False,
    resume: Path | None = None,
    show_stats: bool = False,
    output: OutputSpec | None = None,
    no_log: bool = False,
) -> ExitCode:
    """Run the batch: its lines counted in tokens with the model's vocabulary
    alone, the run planned for them, then run. OK, BATCH_FAILED when a line
    failed, INVALID_OUTPUT when a result does not follow its schema, INTERRUPTED on Ctrl-C."""
    from localrun.assemble import Prompts
    from localrun.cli.serve import model_id
    from localrun.runtime.model_template import choose_template, with_template

    jobs = _jobs(source, settings, resume)
    if not jobs:
        return ExitCode.OK
    with Vocabulary(settled.path) as vocabulary:
        vocabulary.info = with_template(vocabulary.info, choose_template(vocabulary.info, settled.template))
        needs = tokenize_jobs(jobs, settings, vocabulary)
    runnable = [job for job in jobs if job.error is None]
    shape = Prompts(needs, tuple(len(j.tokens or ()) for j in runnable), tuple(j.max_tokens or 0 for j in runnable))
    resolved = opt.plan(settled, shape, verbose=verbose)
    opt.say_template(resolved, raw=settings.raw)
    recorder = _history.recorder(_history.context("batch", resolved, output=output), no_log=no_log)
    model_name = model_id(resolved.target)  # the name a server would answer with, never a path
    config = resolved.config
    env = current()
    try:
        with Weights(config.model_path, config.placement, verbose=config.verbose) as weights:
            for notice in weights.notices:
                out().warn(notice)
            config = dataclasses.replace(config, placement=weights.placement)  # fewer layers, if the load retried
            plan = batch_plan(jobs, config)
            progress = BatchProgressBar(env.stderr, len(plan.runnable), terminal=env.stderr_isatty)
            with _output(resume) as sink, progress as bar:
                to_terminal = resume is None and bool(env.stdout_isatty and env.stderr_isatty)
                writer = JsonlWriter(bar.print_line if to_terminal else _writer(sink), ordered=not unordered)
                for job in plan.failed:
                    writer.add(job.position, error_for(job.line, job.error or ""))
                final, invalid = (
                    _run_plan(plan, settings, weights, config, writer, bar, model_name, recorder)
                    if plan.runnable
                    else (None, 0)
                )
    finally:
        if recorder is not None:
            recorder.flush()  # each finished line's record, after the results are written; a second Ctrl-C too
    return _exit_code(final, len(plan.failed), invalid, len(jobs), show_stats)


def _exit_code(final: BatchProgress | None, failed: int, invalid: int, lines: int, show_stats: bool) -> ExitCode:
    """The summary or warnings on stderr, and the run's exit code."""
    if final is not None and (show_stats or final.interrupted or current().stderr_isatty):
        out().note(summary(final, failed))
    elif failed:
        out().warn(f"{failed} of {lines} lines failed; see their error records")
    if final is not None and final.interrupted:
        return ExitCode.INTERRUPTED
    if invalid:
        out().warn(f'{invalid} result{"s do" if invalid > 1 else " does"} not follow the schema; see "valid"')
    if failed:
        return ExitCode.BATCH_FAILED
    return ExitCode.INVALID_OUTPUT if invalid else ExitCode.OK


def _run_plan(
    plan: BatchPlan,
    settings: BatchSettings,
    weights: Weights,
    config: EngineConfig,
    writer: JsonlWriter,
    bar: BatchProgressBar,
    model_name: str,
    recorder: Recorder | None = None,
) -> tuple[BatchProgress, int]:
    """Run the plan's runnable lines, writing each result as it comes; the
    last progress, and how many results do not follow their schema."""
    lines = {job.position: job.line for job in plan.runnable}
    final: BatchProgress | None = None
    invalid = 0
    with running(plan, settings, weights, config) as (engine, events), ctrl_c_stops(engine):
        try:
            for ev in events:
                if isinstance(ev, SequenceDone):
                    writer.add(ev.index, record_for(lines[ev.index], ev, model_name))
                    if recorder is not None:
                        _history.add_line(recorder, lines[ev.index], ev, plan.parallel, plan.seq_ctx)
                    invalid += ev.stats.valid is False
                else:
                    bar.update(ev)
                    final = ev
        finally:
            if final is None or not final.final or final.interrupted:
                writer.flush_finished()
    if final is None:
        raise LocalrunError("the batch ended without a summary")
    return final, invalid


def run_remote(
    source: str,
    settings: BatchSettings,
    model: RemoteModel,
    *,
    parallel: int,
    unordered: bool = False,
    resume: Path | None = None,
    show_stats: bool = False,
    recorder: Recorder,
) -> ExitCode:
    """The batch on a remote server, ``parallel`` requests at a time; the
    same records, progress and exit codes as a local run."""
    from localrun.remote.batch import SequenceFailed, run_remote_batch

    jobs = _jobs(source, settings, resume)
    if not jobs:
        return ExitCode.OK
    env = current()
    runnable = {job.position: job.line for job in jobs if job.error is None}
    failed, invalid = 0, 0
    final: BatchProgress | None = None
    with (
        contextlib.ExitStack() as logged,
        _output(resume) as sink,
        BatchProgressBar(env.stderr, len(runnable), terminal=env.stderr_isatty) as bar,
    ):
        logged.callback(recorder.flush)  # each finished line's record, after the results; a second Ctrl-C too
        to_terminal = resume is None and bool(env.stdout_isatty and env.stderr_isatty)
        writer = JsonlWriter(bar.print_line if to_terminal else _writer(sink), ordered=not unordered)
        for job in jobs:
            if job.error is not None:
                writer.add(job.position, error_for(job.line, job.error))
                failed += 1
        with ctrl_c_stops(model):
            try:
                for ev in run_remote_batch(model, list(runnable.items()), settings, parallel) if runnable else ():
                    if isinstance(ev, SequenceDone):
                        writer.add(ev.index, record_for(runnable[ev.index], ev, model.model_id))
                        _history.add_line(recorder, runnable[ev.index], ev, parallel)
                        invalid += ev.stats.valid is False
                    elif isinstance(ev, SequenceFailed):
                        writer.add(ev.index, error_for(runnable[ev.index], ev.message))
                        failed += 1
                    else:
                        bar.update(ev)
                        final = ev
            finally:
                if final is None or not final.final or final.interrupted:
                    writer.flush_finished()
    return _exit_code(final, failed, invalid, len(jobs), show_stats)
