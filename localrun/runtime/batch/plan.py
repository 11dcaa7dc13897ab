"""Planning a batch: each line's tokens, each sequence's context, how many
sequences run at once, and which lines cannot run (and why).

`plan_batch` tokenizes on a small context over weights the run then reuses,
so the model file is loaded once; `run_plan` runs what can run through the
continuous batching scheduler.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from localrun.errors import BadModelError, UsageError
from localrun.events import BatchEvent
from localrun.gguf.info import CONTEXT_STEP, describe
from localrun.runtime.batch.input import BatchLine
from localrun.runtime.batch.scheduler import BatchRequest, run_batch
from localrun.runtime.engine import Engine, EngineConfig, Weights
from localrun.runtime.placement import DEFAULT_CTX, sequence_context, sequences
from localrun.runtime.prompt import build_prompt, chat_prompt, compose
from localrun.runtime.reasoning import Reasoning, reasoning_for, switches_for
from localrun.runtime.sampling import SamplingParams
from localrun.settings import check_context
from localrun.structured.spec import OutputSpec

_LINE_SAMPLING = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed")


@dataclass(frozen=True)
class BatchSettings:
    """What the command line says for every line (a line's own settings win)."""

    instruction: str | None = None  # put before every line's prompt: a shared prefix
    system: str | None = None
    raw: bool = False
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    seq_ctx: int | None = None  # each sequence's context; None: sized from the prompts
    ctx_limit: int | None = None  # the most a sized context may be (the model's default context), besides training
    parallel: int | None = None  # the user's --parallel (or config); None: tuned_parallel, else llama-server's default
    tuned_parallel: int | None = None  # what `localrun tune` measured fastest on this machine
    output: OutputSpec | None = None  # --schema/--grammar: every line's, unless the line has its own


@dataclass
class Job:
    """A line to run: where it sits in the output, and its tokens once known."""

    position: int
    line: BatchLine
    tokens: list[int] | None = None
    max_tokens: int | None = None
    error: str | None = None
    reasoning: Reasoning | None = None  # a reasoning model's thinking: kept out of the line's text


@dataclass(frozen=True)
class BatchPlan:
    jobs: list[Job]
    seq_ctx: int
    parallel: int

    @property
    def runnable(self) -> list[Job]:
        return [job for job in self.jobs if job.error is None]

    @property
    def failed(self) -> list[Job]:
        return [job for job in self.jobs if job.error is not None]


def check_settings(settings: BatchSettings) -> None:
    """Refuse impossible settings before anything is read or loaded."""
    if settings.parallel is not None and settings.parallel < 1:
        raise UsageError("--parallel must be at least 1")
    if settings.seq_ctx is not None:
        check_context(settings.seq_ctx)


def jobs_for(lines: Sequence[BatchLine]) -> list[Job]:
    """One job per line, in output order; a line that could not be read carries its error."""
    return [Job(position, line, error=line.error) for position, line in enumerate(lines)]


def _tokenize(engine: Engine, job: Job, settings: BatchSettings) -> None:
    line = job.line
    system = line.settings.get("system", settings.system)
    raw = settings.raw or line.raw
    template = None if raw else engine.info.chat_template
    switches = switches_for(template, "auto")  # the template's thinking default, as llama.cpp renders it
    try:
        if line.messages is not None:
            has_system = any(m["role"] == "system" for m in line.messages)
            messages = (
                line.messages if has_system or not system else [{"role": "system", "content": system}, *line.messages]
            )
            built = chat_prompt(engine, messages, raw=raw, switches=switches)
        else:
            text = compose(line.prompt, settings.instruction)  # the shared argument first: a common prefix
            built = build_prompt(engine, text, system=system, raw=raw, switches=switches)
    except (UsageError, BadModelError) as exc:
        job.error = exc.message
        return
    job.tokens = built.tokens
    job.reasoning = reasoning_for(template, built.text)
    if not job.tokens:
        job.error = "the prompt is empty"
    job.max_tokens = line.settings.get("max_tokens", settings.max_tokens)


def _need(job: Job) -> int:
    """Context one job may use: its prompt and max tokens (without a limit, up to DEFAULT_CTX)."""
    n = len(job.tokens or ())
    return n + job.max_tokens if job.max_tokens is not None else max(DEFAULT_CTX, n + 1)


def _parallel(n_prompts: int, seq_ctx: int, settings: BatchSettings, config: EngineConfig, weights: Weights) -> int:
    """--parallel, checked against memory; by default the tuned count (else
    llama-server's default), no more than fit."""
    return sequences(
        describe(weights.info),
        seq_ctx,
        (config.type_k, config.type_v),
        (config.placement or weights.placement).budget,  # measured before the weights loaded
        asked=settings.parallel,
        tuned=settings.tuned_parallel,
        wanted=n_prompts,
        unit="sequence",
        smaller="--ctx or --max-tokens",
    )


def plan_batch(jobs: list[Job], settings: BatchSettings, weights: Weights, config: EngineConfig) -> BatchPlan:
    """Tokenize every job that can run (a small context on ``weights``), size
    each sequence's context and the number run at once; a job whose prompt
    cannot run gets its error."""
    check_settings(settings)
    with Engine(replace(config, n_ctx=CONTEXT_STEP, n_seq_max=1), weights=weights) as tokenizer:
        n_ctx_train = tokenizer.n_ctx_train
        for job in jobs:
            if job.error is None:
                _tokenize(tokenizer, job, settings)
    needs = [_need(job) for job in jobs if job.error is None]
    limit = min(n_ctx_train, settings.ctx_limit) if settings.ctx_limit else n_ctx_train
    seq_ctx = sequence_context(needs, settings.seq_ctx, limit)
    for job in jobs:
        if job.error is None and job.tokens is not None and len(job.tokens) >= seq_ctx:
            job.error = f"the prompt is {len(job.tokens)} tokens; each sequence's context holds {seq_ctx}"
    n_runnable = sum(job.error is None for job in jobs)
    return BatchPlan(jobs, seq_ctx, _parallel(n_runnable, seq_ctx, settings, config, weights))


def requests_for(plan: BatchPlan, settings: BatchSettings) -> list[BatchRequest]:
    return [
        BatchRequest(
            index=job.position,
            tokens=job.tokens or [],
            sampling=replace(
                settings.sampling, **{k: job.line.settings[k] for k in _LINE_SAMPLING if k in job.line.settings}
            ),
            max_tokens=job.max_tokens,
            stop=job.line.stop if job.line.stop is not None else settings.stop,
            output=job.line.output if job.line.output is not None else settings.output,
            reasoning=job.reasoning,
        )
        for job in plan.runnable
    ]


@contextmanager
def running(
    plan: BatchPlan, settings: BatchSettings, weights: Weights, config: EngineConfig
) -> Iterator[tuple[Engine, Iterator[BatchEvent]]]:
    """The engine the plan runs on (its abort flag stops the run) and the
    scheduler's events for the runnable jobs (`SequenceDone.index` is the
    job's position)."""
    run_config = replace(config, n_ctx=plan.parallel * plan.seq_ctx, n_seq_max=plan.parallel)
    with Engine(run_config, weights=weights) as engine:
        yield engine, run_batch(engine, requests_for(plan, settings))
