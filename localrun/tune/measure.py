"""`localrun tune`: measure on this machine what each speed setting does,
for one model, within a time cap, and return it as `Wisdom`.

In order, each phase with a share of the time:

1. threads: a decode step with each candidate count (all CPUs, the
   physical cores, one less), unless every layer is on a GPU;
2. the verify curve: a batch of r rows of one sequence, r = 1..16 (1..64
   with the model on a GPU, where rows are nearly free: see `Ranges`), as
   the speculative verify step runs it;
3. parallel sequences: one token for each of p sequences in one batch;
4. the prompt batch size: tokens per second evaluating batches of each size
   (the sizes the time allows: a size still getting faster at the largest
   one measured keeps llama.cpp's 512);
5. the KV cache types and flash attention together (f16 with it off and on,
   q8_0 and q8_0/q4_0 with it on, as a quantized V needs it): each context
   filled to a middle depth and then to the deepest the time allows, every
   stretch timed (the prompt's rate at that depth), and a decode step raced
   at a short depth and at each filled one. Kept as `Rates`, one line over
   depth per setting for the prompt and one for decoding; a run picks from
   them for its own prompt and answer (`localrun.tune.apply`). The prompt
   batch size is not crossed with them (its phase runs at one depth), nor
   the thread count (the one decided first is used).

Every comparison is a `Race`: rounds of every candidate in rotating order
until the best is separated beyond noise, the rounds run out, or the phase's
time is up. A tie keeps llama.cpp's default.

Nothing is learnt from noise. Before each sample the machine's load is read
(other runnable tasks: localrun.runtime.load); a phase that saw other tasks
before `BUSY_READINGS` of its samples or more is kept as not measured
("machine busy") and decides nothing: `WisdomFile.put` keeps what an earlier run
measured for it. A decision whose samples spread more than `MAX_SPREAD`
decides nothing, and neither does one that moves a default away from
llama.cpp's by more than `MAX_GAIN` (a 5x faster KV cache type is a machine
that was busy while the other type ran, not a result).
"""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import llama_cpp

from localrun.errors import EngineError
from localrun.gguf.info import N_UBATCH as LLAMA_UBATCH
from localrun.gguf.info import describe
from localrun.gguf.reader import read_gguf
from localrun.runtime import devices
from localrun.runtime.engine import Engine, EngineConfig, Weights
from localrun.runtime.llama import Batch
from localrun.runtime.load import LoadWatch
from localrun.runtime.memory import Checkpoints
from localrun.runtime.placement import LLAMA_PARALLEL, place
from localrun.system import cpu_count, physical_cores
from localrun.tune.machine import this_machine
from localrun.tune.race import Race, relative_iqr
from localrun.tune.wisdom import (
    MAX_GAIN,
    VERIFY_DEPTH,
    Attention,
    Decision,
    ModelKey,
    Rates,
    Wisdom,
    kv_label,
    setting_label,
)


@dataclass(frozen=True)
class Ranges:
    """What the phases measure. On a CPU a verify row or a parallel sequence
    costs nearly a whole step, so the ranges stop at 16; on a GPU they are
    nearly free up to large batches, so the ranges reach further, and the
    thread count matters only while layers decode on the CPU."""

    max_rows: int  # verify batches measured: 1..max_rows
    parallel: tuple[int, ...]
    ubatch: tuple[int, ...]
    threads: bool

    @property
    def sequences(self) -> int:
        return max(self.max_rows, *self.parallel)

    @property
    def largest_batch(self) -> int:
        return max(LLAMA_UBATCH, *self.ubatch)


CPU_RANGES = Ranges(16, (1, 2, 3, 4, 6, 8, 12, 16), (64, 128, 256, 512), threads=True)
GPU_RANGES = Ranges(64, (1, 2, 4, 8, 16, 32, 64, 128), (128, 256, 512, 1024, 2048), threads=False)
MAX_ROWS = CPU_RANGES.max_rows
PROMPT = VERIFY_DEPTH  # tokens evaluated before anything is timed
MAX_SPREAD = 0.25  # samples whose interquartile range is more than this share of their median decide nothing
SAMPLE_S = 0.25  # aim of one timed sample: enough steps that one slow step does not decide
MIN_DEPTH, MAX_DEPTH = 128, 2048
# the share of the time cap each phase may use, in order (the rest is load and set-up)
SHARES = {"threads": 0.08, "verify": 0.18, "parallel": 0.1, "ubatch": 0.12, "depth": 0.45}
TEXT = (
    "The quick brown fox jumps over the lazy dog. def add(a, b):\n    return a + b\n"
    "Numbers are stored in binary; a float has a sign, an exponent and a fraction. "
)


@dataclass(frozen=True)
class TuneProgress:
    fraction: float  # of the time cap spent
    label: str


class Context:
    """One engine context with PROMPT tokens in every sequence, and the
    timed operations the phases need."""

    def __init__(self, weights: Weights, config: EngineConfig, tokens: Sequence[int] = ()) -> None:
        self.engine = Engine(config, weights=weights)
        self.tokens = tokens or self.engine.tokenize(TEXT * 8, add_special=False) or [0]
        self.batch = Batch(max(config.n_batch, config.n_seq_max))
        self.depth = 0  # tokens sequence 0 holds
        self.checkpoints = Checkpoints(self.engine.ctx, self.engine.cuts)  # a recurrent memory's, at the depth
        self.fill(PROMPT)

    def _token(self, pos: int) -> int:
        return self.tokens[pos % len(self.tokens)]

    def _run(self, rows: Sequence[tuple[int, int, bool]]) -> float:
        """Decode (pos, seq, logits) rows; seconds."""
        b = self.batch
        b.clear()
        for pos, seq, want in rows:
            b.add(self._token(pos), pos, seq, want)
        t = time.perf_counter()
        b.decode(self.engine)
        return time.perf_counter() - t

    def _held(self, n: int) -> list[int]:
        return [self._token(i) for i in range(n)]

    def _forget(self, pos: int, seqs: int = 1) -> None:
        """Take each sequence back to ``pos`` (a recurrent memory: to the checkpoint `fill` left there)."""
        for s in range(seqs):
            if self.engine.cuts.recurrent:
                self.engine.cuts.decoded(s, 0)  # the timed batch is undone from the checkpoint, never its snapshots
                if self.checkpoints.cut(s, self._held(pos), pos) < pos:
                    raise EngineError(f"sequence {s} could not be taken back to {pos} tokens")
            else:
                llama_cpp.llama_memory_seq_rm(self.engine.memory, s, pos, -1)

    def fill(self, depth: int, chunk: int = LLAMA_UBATCH) -> float:
        """Evaluate sequence 0 up to ``depth`` in batches of ``chunk``; the seconds it took."""
        spent = 0.0
        while self.depth < depth:
            k = min(chunk, depth - self.depth)
            spent += self._run([(self.depth + i, 0, i == k - 1) for i in range(k)])
            self.depth += k
        if self.engine.cuts.recurrent:
            self.checkpoints.save(0, self._held(self.depth))
        return spent

    def step_s(self, steps: int) -> float:
        """Seconds per single-token decode step at the current depth."""
        total = 0.0
        for _ in range(steps):
            total += self._run([(self.depth, 0, True)])
            self._forget(self.depth)
        return total / steps

    def rows_s(self, rows: int) -> float:
        """Seconds for a verify batch: ``rows`` positions of sequence 0, logits for each."""
        spent = self._run([(self.depth + i, 0, True) for i in range(rows)])
        self._forget(self.depth)
        return spent

    def parallel_s(self, n: int) -> float:
        """Seconds per token for one token in each of ``n`` sequences."""
        spent = self._run([(self.depth, s, True) for s in range(n)])
        self._forget(self.depth, n)
        return spent / n

    def prompt_s(self, size: int) -> float:
        """Seconds per token evaluating a batch of ``size`` tokens."""
        spent = self._run([(self.depth + i, 0, i == size - 1) for i in range(size)])
        self._forget(self.depth)
        return spent / size

    def share_prompt(self, seqs: int) -> None:
        for s in range(1, seqs):
            llama_cpp.llama_memory_seq_cp(self.engine.memory, 0, s, -1, -1)

    def close(self) -> None:
        self.batch.close()
        self.engine.close()


def _decision(
    race: Race[Any],
    default: Any,
    unit: str,
    *,
    name: Callable[[Any], int | str] = int,
    max_gain: float | None = None,
) -> Decision:
    """The race's choice as a Decision (figures in ms): None (llama.cpp's
    default kept) on a tie that includes ``default``, when the samples spread
    more than `MAX_SPREAD`, or when the best is more than ``max_gain`` times
    as fast as ``default``; the smallest of the tied otherwise. ``name``: a
    candidate as a setting's value."""
    tied = race.tied()
    figures = {str(name(c)): round(race.median(c) * 1e3, 4) for c in race.candidates}
    noise = statistics.median(relative_iqr(race.samples[c]) for c in race.candidates)
    if noise > MAX_SPREAD:
        return Decision(None, figures, unit, note=f"too noisy to decide: the samples spread {noise:.0%}")
    if len(tied) == 1:
        best = tied[0]
        gain = race.median(default) / race.median(best) if default in race.candidates and best != default else 1.0
        if max_gain is not None and gain > max_gain:
            note = f"{name(best)} measured {gain:.1f}x as fast: more than a setting gives, so not taken"
            return Decision(None, figures, unit, note=note)
        return Decision(name(best), figures, unit)
    note = f"tie: {', '.join(str(name(c)) for c in tied)}"
    return Decision(None if default in tied else name(min(tied)), figures, unit, note=note)


def thread_candidates() -> list[int]:
    n = cpu_count()
    return sorted({n, physical_cores(), max(1, n - 1)}, reverse=True)


class Tuner:
    """Runs the phases on one model within ``seconds``."""

    def __init__(
        self,
        model: Path,
        *,
        seconds: float = 60.0,
        kv: tuple[str, str] = ("f16", "f16"),
        progress: Callable[[TuneProgress], None] | None = None,
        memory_budget: int | None = None,
        load: Callable[[], int | None] | None = None,
    ) -> None:
        self.model = model
        self.load = LoadWatch(load)  # the current phase's load readings, one per sample
        self.unmeasured: dict[str, str] = {}  # phase: why it decides nothing
        self.seconds = seconds
        self.kv = kv
        self.progress = progress
        # placed once, before any phase loads; a model on a GPU is measured over a GPU's ranges
        self.placement = place(devices.probe(), memory_budget=memory_budget, shape=describe(read_gguf(model)))
        self.ranges = GPU_RANGES if self.placement.model.offloaded else CPU_RANGES
        self.start = time.monotonic()
        self.deadline = self.start
        self.busy = 0.0

    def _phase(self, name: str) -> float:
        """Start a phase: report it and return its deadline."""
        self.load.reset()
        now = time.monotonic()
        self.deadline = max(self.deadline, now) + SHARES[name] * self.seconds
        self._report(name)
        return self.deadline

    def _watched(self, sample: Callable[[Any], float]) -> Callable[[Any], float]:
        """``sample``, with the machine's load read before each call."""

        def watched(candidate: Any) -> float:
            self.load.read()
            return sample(candidate)

        return watched

    def _ran_busy(self, phase: str) -> bool:
        """Whether ``phase`` ran under load; if so it is kept as not measured."""
        why = self.load.busy()
        if why is not None:
            self.unmeasured[phase] = why
        return why is not None

    def _report(self, label: str) -> None:
        if self.progress is not None:
            spent = (time.monotonic() - self.start) / self.seconds
            self.progress(TuneProgress(min(spent, 1.0), label))

    def _config(self, n_ctx: int, type_k: str, type_v: str, flash_attn: str, threads: int) -> EngineConfig:
        return EngineConfig(
            model_path=self.model,
            n_ctx=n_ctx,
            n_threads=threads,
            placement=self.placement,
            n_batch=self.ranges.largest_batch,
            n_ubatch=self.ranges.largest_batch,
            type_k=type_k,
            type_v=type_v,
            flash_attn=flash_attn,
            n_seq_max=self.ranges.sequences,
            kv_unified=True,
        )

    def run(self) -> Wisdom:
        self._report("loading the model")
        with Weights(self.model, self.placement) as weights:
            shape = describe(weights.info)
            type_k, type_v = self.kv
            fa_base = "on" if type_v != "f16" else "auto"
            main = Context(weights, self._config(2 * self.ranges.largest_batch, type_k, type_v, fa_base, cpu_count()))
            tokens = main.tokens
            try:
                threads = self._threads(main)
                best_threads = (
                    threads.value if threads is not None and isinstance(threads.value, int) else physical_cores()
                )
                main.engine.set_threads(best_threads)
                verify_ms = self._verify(main)
                parallel = self._parallel(main)
                n_ubatch, pp_rate = self._ubatch(main)
            finally:
                main.close()
            attention, kv_cost, depth, rates = self._depths(weights, shape, tokens, best_threads, pp_rate)
        self._report("done")
        return Wisdom(
            machine=this_machine(),
            model=ModelKey.of(self.model),
            kv=kv_label(*self.kv),
            measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
            seconds=time.monotonic() - self.start,
            threads=threads,
            n_ubatch=n_ubatch,
            flash_attn=attention,
            verify_ms=verify_ms,
            parallel=parallel,
            kv_cost=kv_cost,
            kv_depth=depth,
            rates=rates,
            busy=round(self.busy, 3),
            unmeasured=dict(self.unmeasured),
        )

    # -- phases --

    def _steps(self, seconds_per_step: float) -> int:
        return max(2, min(32, round(SAMPLE_S / max(seconds_per_step, 1e-4))))

    def _threads(self, ctx: Context) -> Decision | None:
        if not self.ranges.threads:  # every layer on a GPU: the CPU's thread count decides nothing
            return None
        deadline = self._phase("threads")
        ctx.step_s(2)  # warm up
        steps = self._steps(ctx.step_s(2))
        self.busy = _busy_share(lambda: ctx.step_s(steps), cpu_count())
        candidates = thread_candidates()

        def sample(n: int) -> float:
            ctx.engine.set_threads(n)
            return ctx.step_s(steps)

        race = Race(candidates).run(self._watched(sample), deadline=deadline)
        if self._ran_busy("threads"):
            return None
        return _decision(race, physical_cores(), "ms/token", max_gain=MAX_GAIN)

    def _verify(self, ctx: Context) -> tuple[float, ...]:
        deadline = self._phase("verify")
        race = Race(list(range(1, self.ranges.max_rows + 1)))
        race.run(self._watched(ctx.rows_s), min_rounds=2, max_rounds=5, deadline=deadline)
        if self._ran_busy("verify"):
            return ()
        return tuple(race.median(r) * 1e3 for r in race.candidates)

    def _parallel(self, ctx: Context) -> Decision | None:
        deadline = self._phase("parallel")
        ctx.share_prompt(self.ranges.sequences)
        race = Race(list(self.ranges.parallel))
        race.run(self._watched(ctx.parallel_s), min_rounds=2, max_rounds=6, deadline=deadline)
        if self._ran_busy("parallel"):
            return None
        return _decision(race, LLAMA_PARALLEL, "ms/token")

    def _ubatch(self, ctx: Context) -> tuple[Decision | None, float]:
        """The prompt batch size; and the prompt rate (tokens/s) it measured."""
        deadline = self._phase("ubatch")
        budget = SHARES["ubatch"] * self.seconds
        candidates = self.ranges.ubatch
        first = ctx.prompt_s(candidates[0])  # a warm-up and an estimate
        # sizes one of whose rounds fits half the phase
        sizes = [u for u in candidates if u * first * sum(1 for s in candidates if s <= u) <= budget / 2] or [
            candidates[0]
        ]
        race = Race(sizes).run(self._watched(ctx.prompt_s), min_rounds=2, max_rounds=5, deadline=deadline)
        rate = 1.0 / race.median(max(sizes))
        if self._ran_busy("ubatch"):
            return None, rate
        decision = _decision(race, LLAMA_UBATCH, "ms/token")
        if decision.value is not None and max(sizes) in race.tied() and max(sizes) < LLAMA_UBATCH:
            note = f"fastest at {max(sizes)}, the largest measured: llama.cpp's {LLAMA_UBATCH} kept"
            decision = Decision(None, decision.figures, decision.unit, note=note)
        return decision, rate

    def _depths(
        self, weights: Weights, shape: Any, tokens: Sequence[int], threads: int, pp_rate: float
    ) -> tuple[Attention | None, Decision | None, int, Rates | None]:
        """Every KV-types and flash-attention setting together (f16 off and on,
        the quantized types on, as they need it): the prompt filled to a middle
        and to the deepest depth the time allows, each stretch timed (the
        prompt's rate), and decode steps raced at a short depth and at each
        filled depth, interleaved."""
        deadline = self._phase("depth")
        type_k, type_v = self.kv
        kinds: list[tuple[str, str, str]] = []
        if type_v == "f16":
            kinds += [(type_k, type_v, "off"), (type_k, type_v, "on")]
        else:
            kinds.append((type_k, type_v, "on"))
        if self.kv == ("f16", "f16") and shape.key_length % 32 == 0 and shape.value_length % 32 == 0:
            kinds += [("q8_0", "q8_0", "on"), ("q8_0", "q4_0", "on")]
        fill_budget = 0.7 * SHARES["depth"] * self.seconds
        depth = int(pp_rate * fill_budget / len(kinds)) // 64 * 64
        rows = self.ranges.max_rows
        limit = (shape.context_length or MAX_DEPTH) - 2 * rows
        depth = max(MIN_DEPTH, min(depth, MAX_DEPTH, limit))
        middle = (PROMPT + depth) // 2  # two stretches of one size: the same batches in each
        stretch = middle - PROMPT
        chunk = -(-stretch // -(-stretch // LLAMA_UBATCH))  # equal batches of at most llama.cpp's ubatch
        depths = [PROMPT, depth] if depth < 4 * MIN_DEPTH else [PROMPT, middle, depth]
        contexts = {
            kind: Context(weights, self._config(depth + 2 * rows, *kind[:2], kind[2], threads), tokens)
            for kind in kinds
        }
        fill_ms: dict[tuple[str, str, str], list[float]] = {k: [] for k in kinds}
        try:
            steps = self._steps(contexts[kinds[0]].step_s(2))
            at: dict[int, Race[tuple[str, str, str]]] = {}

            def race_at(d: int) -> None:
                self._report(f"depth {d}")
                at[d] = Race(kinds).run(
                    self._watched(lambda k: contexts[k].step_s(steps)), max_rounds=6, deadline=deadline
                )

            race_at(PROMPT)
            for i, target in enumerate((middle, depth)):
                for kind in kinds[i % len(kinds) :] + kinds[: i % len(kinds)]:  # rotating, as a race does
                    self.load.read()
                    filled = target - contexts[kind].depth
                    fill_ms[kind].append(contexts[kind].fill(target, chunk) * 1e3 / max(filled, 1))
                if target in depths:
                    race_at(target)
        finally:
            for ctx in contexts.values():
                ctx.close()
        if self._ran_busy("depth"):
            return None, None, 0, None
        attention, kv_cost = _depth_figures(self.kv, kinds, depths, at, depth)
        fill_depths = ((PROMPT + middle) // 2, (middle + depth) // 2)
        return attention, kv_cost, depth, _rates(kinds, depths, at, fill_ms, fill_depths, chunk)


def _depth_figures(
    kv: tuple[str, str],
    kinds: Sequence[tuple[str, str, str]],
    depths: Sequence[int],
    at: Mapping[int, Race[tuple[str, str, str]]],
    depth: int,
) -> tuple[Attention | None, Decision | None]:
    """Flash attention off and on with f16 V as a curve, and the KV types with
    it on at the deepest depth, as tune kept them before the rates (shown by
    `localrun tune --show`; a run's choice reads the rates)."""
    type_k, type_v = kv
    attention = None
    if type_v == "f16":
        off, on = (type_k, type_v, "off"), (type_k, type_v, "on")
        attention = Attention(
            tuple(depths),
            tuple(at[d].median(off) * 1e3 for d in depths),
            tuple(at[d].median(on) * 1e3 for d in depths),
            noise=round(statistics.median(relative_iqr(at[d].samples[k]) for d in depths for k in (off, on)), 4),
        )
    kv_cost = None
    on_kinds = [k for k in kinds if k[2] == "on"]
    if len(on_kinds) > 1:
        deep = Race(on_kinds, {k: at[depth].samples[k] for k in on_kinds})
        kv_cost = _decision(deep, on_kinds[0], "ms/token", name=lambda k: kv_label(k[0], k[1]), max_gain=MAX_GAIN)
    return attention, kv_cost


def _rates(
    kinds: Sequence[tuple[str, str, str]],
    depths: Sequence[int],
    at: Mapping[int, Race[tuple[str, str, str]]],
    fill_ms: Mapping[tuple[str, str, str], Sequence[float]],
    fill_depths: tuple[int, int],
    chunk: int,
) -> Rates:
    """Every setting's prompt rate over its two filled stretches and decode
    cost at each depth: what a run's shape is weighed against."""
    return Rates(
        fill_depths=fill_depths,
        fill_tps={setting_label(*k): tuple(1e3 / max(ms, 1e-9) for ms in fill_ms[k]) for k in kinds},
        decode_depths=tuple(depths),
        decode_ms={setting_label(*k): tuple(at[d].median(k) * 1e3 for d in depths) for k in kinds},
        chunk=chunk,
        noise=round(statistics.median(relative_iqr(at[d].samples[k]) for d in depths for k in kinds), 4),
    )


def _busy_share(run: Callable[[], object], threads: int) -> float:
    """The share of ``threads`` CPUs' time that other processes took while
    ``run`` ran: llama.cpp's threads spin, so on an idle machine they use all
    of it."""
    before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    run()
    after, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - t0
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return max(0.0, 1.0 - cpu / (wall * threads)) if wall > 0 else 0.0


def tune(
    model: Path,
    *,
    seconds: float = 60.0,
    kv: tuple[str, str] = ("f16", "f16"),
    progress: Callable[[TuneProgress], None] | None = None,
    memory_budget: int | None = None,
) -> Wisdom:
    """Measure ``model`` on this machine (see the module docstring)."""
    return Tuner(model, seconds=seconds, kv=kv, progress=progress, memory_budget=memory_budget).run()
