"""A batch's lines as the run's plan takes them: each line's tokens,
counted with the model's vocabulary alone before the run is placed
(`tokenize_jobs`, `needs`), then the lines the planned sequences can hold
(`batch_plan`: the context and the count are the run's plan, made in
`localrun.assemble`), run through the continuous batching scheduler (`running`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from localrun.errors import BadModelError, UsageError
from localrun.events import BatchEvent
from localrun.runtime.batch.input import BatchLine
from localrun.runtime.batch.scheduler import BatchRequest, run_batch
from localrun.runtime.engine import Engine, EngineConfig, Tokens, Weights
from localrun.runtime.placement import DEFAULT_CTX
from localrun.runtime.prompt import build_prompt, chat_prompt, compose
from localrun.runtime.reasoning import Reasoning, reasoning_for, switches_for
from localrun.runtime.sampling import SamplingParams
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


def jobs_for(lines: Sequence[BatchLine]) -> list[Job]:
    """One job per line, in output order; a line that could not be read carries its error."""
    return [Job(position, line, error=line.error) for position, line in enumerate(lines)]


def _tokenize(vocabulary: Tokens, job: Job, settings: BatchSettings) -> None:
    line = job.line
    system = line.settings.get("system", settings.system)
    raw = settings.raw or line.raw
    template = None if raw else vocabulary.info.chat_template
    switches = switches_for(template, "auto")  # the template's thinking default, as llama.cpp renders it
    try:
        if line.messages is not None:
            has_system = any(m["role"] == "system" for m in line.messages)
            messages = (
                line.messages if has_system or not system else [{"role": "system", "content": system}, *line.messages]
            )
            built = chat_prompt(vocabulary, messages, raw=raw, switches=switches)
        else:
            text = compose(line.prompt, settings.instruction)  # the shared argument first: a common prefix
            built = build_prompt(vocabulary, text, system=system, raw=raw, switches=switches)
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


def tokenize_jobs(jobs: list[Job], settings: BatchSettings, vocabulary: Tokens) -> tuple[int, ...]:
    """Tokenize every job that can run with the model's ``vocabulary``
    (loaded alone, before the run is placed); a job whose prompt cannot be
    tokenized gets its error. Returns each runnable job's context need, for the plan."""
    for job in jobs:
        if job.error is None:
            _tokenize(vocabulary, job, settings)
    return tuple(_need(job) for job in jobs if job.error is None)


def batch_plan(jobs: list[Job], config: EngineConfig) -> BatchPlan:
    """The jobs on the run's planned sequences (``config``: their count and
    context, together); a job whose prompt a sequence cannot hold gets its error."""
    parallel = max(config.n_seq_max, 1)
    seq_ctx = config.n_ctx // parallel
    for job in jobs:
        if job.error is None and job.tokens is not None and len(job.tokens) >= seq_ctx:
            job.error = f"the prompt is {len(job.tokens)} tokens; each sequence's context holds {seq_ctx}"
    return BatchPlan(jobs, seq_ctx, parallel)


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
    with Engine(config, weights=weights) as engine:
        yield engine, run_batch(engine, requests_for(plan, settings))
