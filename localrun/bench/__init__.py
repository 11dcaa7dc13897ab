"""`localrun bench`: a ladder of techniques measured on the same prompts.

A technique is a function in `TECHNIQUES` that returns row specs: a label,
the user defaults the row stands for, and a `measure` function that runs one
round of it (load, warm up, generate every prompt) and returns a `Round`.
Rounds are interleaved (round 1 of every row, then round 2 of every row...),
so a slow spell of a noisy machine lands on all rows alike; each row's figure
is the median of its rounds, and the spread between rounds is shown.

To add a technique, write a function ``def rows(bench: Bench) -> list[RowSpec]``
and put it in `TECHNIQUES`; rows a model cannot take are `unavailable(...)`,
which the table shows as such.

The core never prints: it reports `Progress` to a callback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localrun.bench.stats import Advice, Row, advise, median, merge_extra, percentile, relate_to_baseline, spread
from localrun.errors import LocalrunError
from localrun.events import BatchProgress, DoneEvent, Event, SequenceDone, Stats, TokenEvent
from localrun.gguf.info import CONTEXT_STEP, ModelInfo, describe
from localrun.gguf.reader import read_gguf
from localrun.runtime.batch.scheduler import BatchRequest, run_batch
from localrun.runtime.engine import Engine, EngineConfig, Weights
from localrun.runtime.generate import PLAIN, Decoding, generate
from localrun.runtime.perplexity import REFERENCE_TEXT, Perplexity, perplexity
from localrun.runtime.prompt import prompt_tokens
from localrun.runtime.sampling import SamplingParams
from localrun.runtime.sizing import memory_budget, slot_context
from localrun.speculative import open_speculation
from localrun.system import default_threads, peak_rss, reset_peak_rss

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

    def as_dict(self) -> dict[str, Any]:
        return {
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
        self.budget = memory_budget(plan.memory_budget)
        self._shapes: dict[Path, ModelInfo] = {model: self.shape}
        self._weights: Weights | None = None

    def open_engine(self, config: EngineConfig) -> Engine:
        """An engine for ``config``. The model file stays loaded from one row to
        the next while they use the same file (a load costs seconds); one
        file at a time, so a row's peak memory holds its own model only."""
        held = self._weights
        if held is None or not held.serves(config):
            self.close()
            held = self._weights = Weights(config.model_path, repack=config.repack, verbose=config.verbose)
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
        base = EngineConfig(
            model_path=self.model,
            n_ctx=self.plan.n_ctx,
            n_threads=self.plan.threads,
            flash_attn=self.plan.flash_attn,
            memory_budget=self.plan.memory_budget,
            verbose=self.plan.verbose,
        )
        return dataclasses.replace(base, **changes)

    def context_fits(self, config: EngineConfig) -> int:
        """Tokens of KV cache that fit the budget beside the weights and compute
        buffer, not capped by the trained context (so KV types compare)."""
        shape = dataclasses.replace(self.shape_of(config.model_path), context_length=0)
        return shape.max_context(self.budget, config.type_k, config.type_v)

    def prompts(self, engine: Engine) -> list[list[int]]:
        return [prompt_tokens(engine, text) for text in self.plan.prompts]

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

    def batched(self, config: EngineConfig, parallel: int) -> Round:
        """One round of continuous batching: ``parallel`` requests (the
        prompts, cycled) through `localrun.batch`, all at once. Tokens/sec is
        the aggregate of the decoding phase (from the step that evaluates the
        last prompt token to the end), as the single-sequence rows count
        decoding only; the aggregate over the whole run, prompt evaluation
        included, goes in ``extra["total_tokens_per_s"]``. A sequence's token
        times are its mean step time (the batch loop does not time single
        tokens)."""
        reset_peak_rss()
        greedy = SamplingParams(temperature=0.0)
        with self.open_engine(dataclasses.replace(config, n_ctx=CONTEXT_STEP)) as tokenizer:
            prompts = self.prompts(tokenizer)
        requests = [
            BatchRequest(i, prompts[i % len(prompts)], greedy, self.plan.max_tokens, ignore_eos=True)
            for i in range(parallel)
        ]
        per_seq = slot_context(
            max(len(r.tokens) for r in requests) + self.plan.max_tokens + 1, self.shape.context_length or 1 << 20
        )
        sized = dataclasses.replace(config, n_ctx=per_seq * parallel, n_seq_max=parallel)
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
            context_fits=self.context_fits(config),
            extra={"total_tokens_per_s": total},
        )

    def quality(self, config: EngineConfig) -> Perplexity:
        """Perplexity over the first `ppl_tokens` of the reference text."""
        config = dataclasses.replace(config, n_ctx=max(config.n_ctx or 0, self.plan.ppl_window))
        with self.open_engine(config) as engine:
            tokens = engine.tokenize(REFERENCE_TEXT)[: self.plan.ppl_tokens]
            return perplexity(engine, tokens, self.plan.ppl_window)


# ------------------------------------------------------------- techniques --

Technique = Callable[[Bench], list[RowSpec]]


def unavailable(techniques: Sequence[str], *, reason: str) -> list[RowSpec]:
    """Slots for rows that cannot be measured here, with the reason."""
    return [RowSpec(t, None, note=reason) for t in techniques]


def plain_row(technique: str, settings: dict[str, Any] | None, *, with_quality: bool = True, **changes: Any) -> RowSpec:
    """A row measured by `Bench.single` on the engine config with ``changes``."""
    return RowSpec(
        technique,
        measure=lambda b: b.single(b.engine_config(**changes)),
        settings=settings,
        quality=(lambda b: b.quality(b.engine_config(**changes))) if with_quality else None,
    )


def baseline_rows(bench: Bench) -> list[RowSpec]:
    settings = {"kv_k": "f16", "kv_v": "f16", "flash_attn": bench.plan.flash_attn}
    return [plain_row("baseline", settings, type_k="f16", type_v="f16")]


def attention_rows(bench: Bench) -> list[RowSpec]:
    """The other flash-attention mode than the baseline's: auto settles it by
    the model's head size (`ModelInfo.auto_flash_attn`), and this row checks
    that choice on this machine. Full mode only."""
    if bench.plan.quick:
        return []
    mode = bench.plan.flash_attn
    if mode == "auto":
        mode = bench.shape_of(bench.model).auto_flash_attn("f16")
    other = "on" if mode == "off" else "off"
    return [plain_row(f"flash attention {other}", {"flash_attn": other}, with_quality=False, flash_attn=other)]


def kv_cache_rows(bench: Bench) -> list[RowSpec]:
    pairs = [("q8_0", "q8_0"), ("q4_0", "q4_0")]
    if not bench.plan.quick:
        pairs.append(("q8_0", "q4_0"))  # the smallest cache that keeps Qwen2.5's quality (docs/benchmarks.md)
    return [
        plain_row(f"kv-cache {k}" if k == v else f"kv-cache {k}/{v}", {"kv_k": k, "kv_v": v}, type_k=k, type_v=v)
        for k, v in pairs
    ]


def speculative_rows(bench: Bench) -> list[RowSpec]:
    """Speculative decoding, lossless: the matched draft model, prompt lookup,
    and auto (the controller choosing, plain decoding included)."""

    def row(technique: str, choice: str) -> RowSpec:
        return RowSpec(
            technique,
            measure=lambda b: b.single(b.engine_config(type_k="f16", type_v="f16"), speculation=choice),
            settings={"draft": choice},
        )

    rows = [row("speculative lookup", "lookup"), row("speculative auto", "auto")]
    if bench.plan.quick:
        return rows[1:]  # auto stands for both drafters: its note names those it used
    if bench.draft is None:
        return [*unavailable(["speculative draft"], reason="no draft model (give one with --draft)"), *rows]
    return [row("speculative draft", str(bench.draft)), *rows]


def batching_rows(bench: Bench) -> list[RowSpec]:
    """N sequences in one llama.cpp batch: aggregate tokens/sec (for batch work)."""
    return [
        RowSpec(
            f"batching n={n}",
            measure=lambda b, n=n: b.batched(b.engine_config(type_k="f16", type_v="f16"), n),  # type: ignore[misc]
            settings={"parallel": n},
            sequences=n,
        )
        for n in ((4,) if bench.plan.quick else (1, 2, 4, 8))
    ]


_QUANT_IN_NAME = re.compile(r"(?i)([-_.])(q\d(?:_k)?(?:_[msl]|_\d)?|f16|bf16|f32)(\.gguf)$")


def other_weights(path: Path) -> Path | None:
    """A sibling file of the same model in 8-bit when ``path`` is 4-bit (and
    the other way round): the same name with the quantization swapped."""
    found = _QUANT_IN_NAME.search(path.name)
    if not found:
        return None
    quant = found.group(2).lower()
    wanted = ("q8_0",) if quant.startswith("q4") else ("q4_k_m", "q4_0", "q4_k_s") if quant == "q8_0" else ()
    stem = path.name[: found.start()] + found.group(1)
    for q in wanted:
        for spelled in (q, q.upper()):
            candidate = path.with_name(f"{stem}{spelled}{found.group(3)}")
            if candidate.is_file():
                return candidate
    return None


def weights_rows(bench: Bench) -> list[RowSpec]:
    other = bench.compare or other_weights(bench.model)
    if other is None:
        return unavailable(
            ["weights 8-bit"], reason="no 8-bit/4-bit file of this model beside it (localrun quantize makes one)"
        )
    shape = bench.shape_of(other)
    same_vocab = shape.vocab_size == bench.shape.vocab_size
    row = plain_row(f"weights {shape.quantization.lower()}", None, with_quality=same_vocab, model_path=other)
    return [dataclasses.replace(row, note=other.name)]


TECHNIQUES: list[Technique] = [
    baseline_rows,
    attention_rows,
    kv_cache_rows,
    speculative_rows,
    batching_rows,
    weights_rows,
]


# ----------------------------------------------------------------- runner --


def _summarize(spec: RowSpec, rounds: list[Round], ppl: Perplexity | None) -> Row:
    rates = [r.decode_tokens_per_s for r in rounds]
    times = [t for r in rounds for t in r.token_ms]
    return Row(
        technique=spec.technique,
        note=spec.note or ", ".join(sorted({d for r in rounds for d in r.drafters})),
        sequences=spec.sequences,
        decode_tokens_per_s=median(rates),
        repeats_tokens_per_s=rates,
        spread=spread(rates),
        p50_token_ms=percentile(times, 50) if times else None,
        p95_token_ms=percentile(times, 95) if times else None,
        ttft_s=median([r.ttft_s for r in rounds]),
        peak_rss_bytes=max(r.peak_rss_bytes for r in rounds),
        kv_bytes_per_token=rounds[-1].kv_bytes_per_token,
        context_fits=rounds[-1].context_fits,
        perplexity=ppl.value if ppl else None,
        settings=spec.settings,
        extra=merge_extra([r.extra for r in rounds]),
    )


def run(
    bench: Bench,
    progress: Callable[[Progress], None] | None = None,
    techniques: Sequence[Technique] | None = None,
) -> BenchResult:
    """Measure every row in interleaved rounds, then perplexity once per row."""
    specs = [spec for technique in (techniques or TECHNIQUES) for spec in technique(bench)]
    try:
        measured = _measure(bench, [s for s in specs if s.measure is not None], progress)
    finally:
        bench.close()
    rows = [_row(spec, measured) for spec in specs]
    baseline = next((r for r in rows if r.technique == "baseline" and r.measured), None)
    if baseline is None:
        raise RuntimeError("the ladder has no baseline row: a technique list must start with baseline_rows")
    relate_to_baseline(rows, baseline)
    return BenchResult(
        model=bench.model,
        quantization=bench.shape.quantization,
        plan=bench.plan,
        threads=bench.plan.threads or default_threads(),
        budget_bytes=bench.budget,
        rows=rows,
        advice=advise(rows, baseline),
    )


@dataclass
class _Measured:
    rounds: dict[str, list[Round]]
    quality: dict[str, Perplexity]
    failed: dict[str, str]  # technique -> why it could not be measured


def _measure(bench: Bench, live: list[RowSpec], progress: Callable[[Progress], None] | None) -> _Measured:  # noqa: C901  rounds interleaved over rows, then perplexities
    total = bench.plan.rounds * len(live) + sum(1 for s in live if s.quality is not None)
    done = 0

    def step(label: str) -> None:
        nonlocal done
        if progress is not None:
            progress(Progress(done, total, label))
        done += 1

    got = _Measured({s.technique: [] for s in live}, {}, {})
    for r in range(bench.plan.rounds):
        for spec in live:
            if spec.technique in got.failed or spec.measure is None:
                continue
            step(f"round {r + 1}/{bench.plan.rounds} · {spec.technique}")
            try:
                got.rounds[spec.technique].append(spec.measure(bench))
            except LocalrunError as exc:  # e.g. a head size a quantized KV cache cannot take
                if spec.technique == "baseline":
                    raise
                got.failed[spec.technique] = exc.message
    for spec in live:
        if spec.quality is not None and spec.technique not in got.failed:
            step(f"perplexity · {spec.technique}")
            got.quality[spec.technique] = spec.quality(bench)
    if progress is not None:
        progress(Progress(total, total, "done"))
    return got


def _row(spec: RowSpec, measured: _Measured) -> Row:
    if spec.measure is None or spec.technique in measured.failed:
        return Row(spec.technique, available=False, note=measured.failed.get(spec.technique, spec.note))
    return _summarize(spec, measured.rounds[spec.technique], measured.quality.get(spec.technique))
