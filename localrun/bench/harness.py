"""What bench measures with: the plan, a row's spec and its rounds, the
result, and `Bench`, which loads engines (sharing weights between rows on
one file) and measures one round of a row."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localrun.assemble import Prompts, assemble
from localrun.bench.stats import Advice, Row
from localrun.events import BatchProgress, DoneEvent, Event, SequenceDone, Stats, TokenEvent
from localrun.gguf.info import ModelInfo, describe
from localrun.gguf.reader import read_gguf
from localrun.quantiles import median
from localrun.runtime.batch.scheduler import BatchRequest, run_batch
from localrun.runtime.engine import Engine, EngineConfig, Tokens, Vocabulary, Weights
from localrun.runtime.generate import PLAIN, Decoding, generate
from localrun.runtime.perplexity import REFERENCE_TEXT, Perplexity, perplexity
from localrun.runtime.prompt import prompt_tokens
from localrun.runtime.sampling import SamplingParams
from localrun.settings import Options, resolve
from localrun.speculative import open_speculation
from localrun.system import peak_rss, reset_peak_rss

PROMPTS = (
    "Write a Python function `merge_sorted(a, b)` that merges two sorted lists into one sorted list "
    "in linear time, with a docstring and three doctest examples. Then explain in two sentences why "
    "it runs in linear time.",
    "Rename the variable `tmp` to `total` in this function and return the whole function:\n\n"
    "def add_prices(items):\n"
    "    tmp = 0\n"
    "    for item in items:\n"
    "        if item.price > 0:\n"
    "            tmp += item.price * item.quantity\n"
    "    tax = tmp * 0.2\n"
    "    tmp = tmp + tax\n"
    "    return round(tmp, 2)\n",
)


@dataclass(frozen=True)
class Plan:
    """How much to measure: `quick` or full, and the engine settings every row shares."""

    quick: bool = False
    rounds: int = 2
    max_tokens: int = 32
    prompts: tuple[str, ...] = PROMPTS
    warmup_tokens: int = 2
    n_ctx: int = 1024
    ppl_tokens: int = 512
    ppl_window: int = 512
    threads: int | None = None
    flash_attn: str = "auto"
    memory_budget: int | None = None  # None: the available RAM less a reserve
    gpu_layers: str = "auto"  # --gpu-layers: auto, all or a count (0: the CPU)
    device: str | None = None  # --device: one device by name; None: every GPU
    verbose: bool = False  # llama.cpp's own log on stderr

    @classmethod
    def make(cls, quick: bool, **overrides: Any) -> Plan:
        base = (
            cls(quick=True, rounds=2, max_tokens=32, prompts=PROMPTS[:1], ppl_tokens=256, ppl_window=256)
            if quick
            else cls()
        )
        return dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})


@dataclass(frozen=True)
class Round:
    """One round of one row: every prompt generated once."""

    decode_tokens_per_s: float  # aggregate over the round's tokens (and sequences)
    token_ms: tuple[float, ...]  # time of each output token after the first of its sequence
    ttft_s: float
    peak_rss_bytes: int
    kv_bytes_per_token: float | None = None
    context_fits: int | None = None
    extra: Mapping[str, float] = field(default_factory=dict)
    drafters: tuple[str, ...] = ()  # the drafters speculation used (auto: what the controller chose)


@dataclass(frozen=True)
class RowSpec:
    technique: str
    measure: Callable[[Bench], Round] | None  # None when unavailable
    settings: dict[str, Any] | None = None  # user defaults the row stands for (None: not a setting)
    quality: Callable[[Bench], Perplexity] | None = None  # perplexity over the reference text
    sequences: int = 1
    note: str = ""


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    label: str


@dataclass(frozen=True)
class BenchResult:
    model: Path
    quantization: str
    plan: Plan
    threads: int
    budget_bytes: int
    rows: list[Row]
    advice: Advice
    interrupted: bool = False  # Ctrl-C ended the measuring: the rows measured so far
    busy: str | None = None  # other processes ran while it measured: why its advice is not kept

    def as_dict(self) -> dict[str, Any]:
        return (
            ({"interrupted": True} if self.interrupted else {})
            | ({"busy": self.busy} if self.busy else {})
            | {
                "model": str(self.model),
                "quantization": self.quantization,
                "mode": "quick" if self.plan.quick else "full",
                "rounds": self.plan.rounds,
                "max_tokens": self.plan.max_tokens,
                "prompts": len(self.plan.prompts),
                "threads": self.threads,
                "memory_budget_bytes": self.budget_bytes,
                "rows": [r.as_dict() for r in self.rows],
                "advice": self.advice.as_dict(),
            }
        )


# ------------------------------------------------------------ measurement --


def token_times(events: Iterable[Event]) -> tuple[Stats, list[float]]:
    """Drain a generation's events; its Stats and the time (ms) of each output
    token after the first, from the event timestamps. Tokens that produced no
    text of their own (an incomplete UTF-8 sequence) share the interval up to
    the next event evenly."""
    marks: list[tuple[int, float]] = []
    stats: Stats | None = None
    for ev in events:
        if isinstance(ev, TokenEvent):
            marks.append((ev.generated_tokens, ev.elapsed_s))
        elif isinstance(ev, DoneEvent):
            stats = ev.stats
    if stats is None:
        raise RuntimeError("generation ended without a done event")
    times: list[float] = []
    count, at = 1, stats.ttft_s
    for n, t in marks:
        if n > count:
            times.extend([(t - at) * 1000 / (n - count)] * (n - count))
            count, at = n, t
    return stats, times


class Bench:
    """What technique functions work with: the model, the plan, and helpers
    that measure a configuration."""

    def __init__(self, model: Path, plan: Plan, *, compare: Path | None = None, draft: Path | None = None) -> None:
        self.model = model
        self.plan = plan
        self.compare = compare
        self.draft = draft  # the matched draft model, for the speculative rows
        self.shape = describe(read_gguf(model))
        options = Options(ctx=str(plan.n_ctx), kv="f16", flash_attn=plan.flash_attn, threads=plan.threads)
        where = dataclasses.replace(options, gpu_layers=plan.gpu_layers, device=plan.device)
        self.options = dataclasses.replace(where, memory_budget=plan.memory_budget)
        settings = resolve(self.options)
        # llama.cpp's defaults, placed once before any row loads: every row changes what it measures
        self.base = assemble(model, settings, verbose=plan.verbose, use_wisdom=False, draft=draft).config
        self.budget = self.base.placement.budget
        self._shapes: dict[Path, ModelInfo] = {model: self.shape}
        self._weights: Weights | None = None

    def open_engine(self, config: EngineConfig) -> Engine:
        """An engine for ``config``. The model file stays loaded from one row to
        the next while they use the same file (a load costs seconds); one
        file at a time, so a row's peak memory holds its own model only."""
        held = self._weights
        if held is None or not held.serves(config):
            self.close()
            held = self._weights = Weights(config.model_path, config.placement, verbose=config.verbose, mtp=config.mtp)
        return Engine(config, weights=held)

    def close(self) -> None:
        """Free the model kept loaded between rows."""
        if self._weights is not None:
            self._weights.close()
            self._weights = None

    def shape_of(self, path: Path) -> ModelInfo:
        if path not in self._shapes:
            self._shapes[path] = describe(read_gguf(path))
        return self._shapes[path]

    def engine_config(self, **changes: Any) -> EngineConfig:
        return dataclasses.replace(self.base, **changes)

    def context_fits(self, config: EngineConfig) -> int:
        """Tokens of KV cache that fit the budget beside the weights and compute
        buffer, not capped by the trained context (so KV types compare)."""
        shape = dataclasses.replace(self.shape_of(config.model_path), context_length=0)
        return shape.max_context(self.budget, config.type_k, config.type_v)

    def prompts(self, vocabulary: Tokens) -> list[list[int]]:
        return [prompt_tokens(vocabulary, text) for text in self.plan.prompts]

    def single(self, config: EngineConfig, speculation: str | None = None) -> Round:
        """One round of decoding, one sequence: load, warm up, then every
        prompt, greedy, a fixed number of tokens; with ``speculation`` (a
        `--draft` choice), through the speculative loop."""
        reset_peak_rss()
        greedy = SamplingParams(temperature=0.0)
        extra: dict[str, float] = {}
        with self.open_engine(config) as engine, contextlib.ExitStack() as cleanup:
            spec = open_speculation(engine, speculation, self.draft) if speculation else None
            if spec is not None:
                cleanup.callback(spec.close)
            decoding: Decoding = spec or PLAIN
            prompts = self.prompts(engine)
            warm = prompts[0][: max(1, min(8, len(prompts[0])))]
            token_times(generate(engine, warm, greedy, max_tokens=self.plan.warmup_tokens, ignore_eos=True))
            ttfts: list[float] = []
            times: list[float] = []
            proposed = accepted = rounds = 0
            drafters: list[str] = []
            for tokens in prompts:
                stats, run_times = token_times(
                    decoding.generate(engine, tokens, greedy, max_tokens=self.plan.max_tokens, ignore_eos=True)
                )
                ttfts.append(stats.ttft_s)
                times.extend(run_times)
                if stats.draft:
                    proposed += stats.draft.proposed
                    accepted += stats.draft.accepted
                    rounds += stats.draft.rounds
                    drafters.append(stats.draft.drafter)
            if spec is not None:
                extra = {"acceptance": accepted / proposed if proposed else 0.0}
                if rounds:
                    extra["mean_accepted"] = accepted / rounds
            kv = engine.kv_bytes_per_token
            peak = peak_rss()
        return Round(
            decode_tokens_per_s=len(times) / (sum(times) / 1000) if times and sum(times) > 0 else 0.0,
            token_ms=tuple(times),
            ttft_s=median(ttfts),
            peak_rss_bytes=peak,
            kv_bytes_per_token=kv,
            context_fits=self.context_fits(config),
            extra=extra,
            drafters=tuple(drafters),
        )

    def batch_config(self, needs: tuple[int, ...]) -> EngineConfig:
        """The engine for one sequence per need in ``needs`` (prompt and
        output tokens), planned as `--batch` plans it (`localrun.assemble`
        with the `Prompts`): the layers placed for the batch's whole context,
        each sequence's context sized from the largest need, not from the plan's."""
        options = dataclasses.replace(self.options, ctx=None, parallel=len(needs))
        return assemble(
            self.model, resolve(options), workload=Prompts(needs), verbose=self.plan.verbose, use_wisdom=False
        ).config

    def batched(self, parallel: int) -> Round:
        """One round of continuous batching: ``parallel`` requests (the
        prompts, cycled) through `localrun.batch`, all at once, on the plan
        `batch_config` makes for them. Tokens/sec is
        the aggregate of the decoding phase (from the step that evaluates the
        last prompt token to the end), as the single-sequence rows count
        decoding only; the aggregate over the whole run, prompt evaluation
        included, goes in ``extra["total_tokens_per_s"]``. A sequence's token
        times are its mean step time (the batch loop does not time single
        tokens)."""
        reset_peak_rss()
        greedy = SamplingParams(temperature=0.0)
        with Vocabulary(self.model) as vocabulary:
            prompts = self.prompts(vocabulary)
        requests = [
            BatchRequest(i, prompts[i % len(prompts)], greedy, self.plan.max_tokens, ignore_eos=True)
            for i in range(parallel)
        ]
        sized = self.batch_config(tuple(len(r.tokens) + self.plan.max_tokens + 1 for r in requests))
        done: list[SequenceDone] = []
        final: BatchProgress | None = None
        prompts_done: BatchProgress | None = None  # the step that evaluated the last prompt token
        with self.open_engine(sized) as engine:
            for ev in run_batch(engine, requests):
                if isinstance(ev, SequenceDone):
                    done.append(ev)
                elif ev.final:
                    final = ev
                elif prompts_done is None or ev.evaluated_tokens > prompts_done.evaluated_tokens:
                    prompts_done = ev
            kv = engine.kv_bytes_per_token
            peak = peak_rss()
        if final is None or not done:
            raise RuntimeError("the batch ended without results")
        times = [
            1000 / d.stats.decode_tokens_per_s
            for d in done
            if d.stats.decode_tokens_per_s
            for _ in range(d.stats.generated_tokens - 1)
        ]
        total = final.generated_tokens / final.elapsed_s if final.elapsed_s > 0 else 0.0
        decoding = total
        if prompts_done is not None and final.elapsed_s > prompts_done.elapsed_s:
            tokens = final.generated_tokens - prompts_done.generated_tokens
            if tokens > 0:
                decoding = tokens / (final.elapsed_s - prompts_done.elapsed_s)
        return Round(
            decode_tokens_per_s=decoding,
            token_ms=tuple(times),
            ttft_s=median([d.stats.ttft_s for d in done]),
            peak_rss_bytes=peak,
            kv_bytes_per_token=kv,
            context_fits=self.context_fits(sized),
            extra={"total_tokens_per_s": total},
        )

    def quality(self, config: EngineConfig) -> Perplexity:
        """Perplexity over the first `ppl_tokens` of the reference text."""
        config = dataclasses.replace(config, n_ctx=max(config.n_ctx, self.plan.ppl_window))
        with self.open_engine(config) as engine:
            tokens = engine.tokenize(REFERENCE_TEXT)[: self.plan.ppl_tokens]
            return perplexity(engine, tokens, self.plan.ppl_window)


Technique = Callable[[Bench], list[RowSpec]]
