"""`localrun tune`: its progress bar, and wisdom as text."""

from __future__ import annotations

import time
from typing import IO

from rich.progress import BarColumn, TaskID, TextColumn, TimeElapsedColumn

from localrun.tune.measure import TuneProgress
from localrun.tune.wisdom import Decision, Wisdom
from localrun.ui.progress import bar

PHASE_LABELS = {
    "threads": "threads",
    "verify": "verify batch",
    "parallel": "--batch parallel",
    "ubatch": "prompt batch",
    "depth": "flash attn, KV",
}
BUSY_SHOWN = 0.05  # a smaller share of the CPUs taken by others is any machine's background


class TuneBar:
    """A bar on stderr when it is a terminal (the share of the time cap
    spent); otherwise a line per phase."""

    def __init__(self, err: IO[str], label: str, *, terminal: bool | None = None) -> None:
        self.err = err
        self.label = label
        self._t0 = time.perf_counter()
        self._last = ""
        self._task: TaskID | None = None
        self._progress = bar(
            err,
            TextColumn(f"tune {label}"),
            BarColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            terminal=terminal,
        )

    def __enter__(self) -> TuneBar:
        if self._progress is not None:
            self._progress.start()
            self._task = self._progress.add_task("", total=1.0)
        return self

    def update(self, step: TuneProgress) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=step.fraction, description=step.label)
        elif step.label != self._last:
            self.err.write(f"tune {self.label} {time.perf_counter() - self._t0:5.1f}s {step.label}\n")
            self.err.flush()
        self._last = step.label

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()


def _figures(d: Decision, fmt: str = "{:.1f}") -> str:
    return ", ".join(f"{k}: {fmt.format(v)}" for k, v in d.figures.items()) + f" {d.unit}"


def _choice(d: Decision, default: str) -> str:
    if d.value is None:
        return f"{default} (llama.cpp's default; {d.note or 'a tie'})"
    return f"{d.value}" + (f" ({d.note})" if d.note else "")


def describe(w: Wisdom) -> str:
    """The wisdom of one model as lines: each choice and the figures behind it."""
    lines = [
        f"{w.model.file} on {w.machine.describe()}, KV {w.kv}, measured {w.measured_at} in {w.seconds:.0f}s",
        f"  build              {w.machine.build}",
    ]
    if w.busy >= BUSY_SHOWN:
        lines.append(f"  machine load       other processes took {w.busy:.0%} of the CPUs while it measured")
    for phase, why in w.unmeasured.items():
        lines.append(f"  {PHASE_LABELS.get(phase, phase):<18} not measured ({why}): llama.cpp's default stands")
    if w.threads is not None:
        lines.append(f"  threads            {_choice(w.threads, 'physical cores')}")
        lines.append(f"                     {_figures(w.threads)}")
    if w.n_ubatch is not None:
        lines.append(f"  prompt batch       {_choice(w.n_ubatch, '512')}")
        lines.append(f"                     {_figures(w.n_ubatch, '{:.2f}')}")
    lines += _attention(w) + _verify(w)
    if w.parallel is not None:
        lines.append(f"  --batch parallel   {_choice(w.parallel, '4')}")
        rates = ", ".join(f"{k}: {1000 / v:.1f}" for k, v in w.parallel.figures.items() if v > 0)
        lines.append(f"                     {rates} tokens/s in all")
    lines += _rates(w)
    if w.kv_cost is not None and w.rates is None:  # before the rates: the KV types raced with flash attention on
        best = w.kv_cost.value or "none faster than another"
        lines.append(f"  KV cache types     at depth {w.kv_depth}: fastest {best}")
        lines.append(f"                     {_figures(w.kv_cost)}")
    if w.bench:
        advice = ", ".join(f"{k} = {v}" for k, v in w.bench.items())
        lines.append(f"  localrun bench     {advice}")
    return "\n".join(lines)


def _attention(w: Wisdom) -> list[str]:
    fa = w.flash_attn
    if fa is None:
        return []
    choice = fa.choice()
    cross = fa.crossover
    summary = "a tie: llama.cpp's auto kept" if choice is None else f"{choice} over the depths measured"
    if w.rates is not None:  # a run picks from the rates, for its own prompt and answer
        summary = "decode steps with f16 (each run picks from the rates below)"
    if cross is not None and cross < 64 * max(fa.depths):
        summary += f"; the two cross near depth {cross}"
    lines = [f"  flash attention    {summary}"]
    for depth, off, on in zip(fa.depths, fa.off_ms, fa.on_ms, strict=True):
        lines.append(f"                     depth {depth}: off {off:.1f} ms, on {on:.1f} ms per token")
    return lines


def _verify(w: Wisdom) -> list[str]:
    curve = w.verify_curve
    if not curve:
        return []
    steps = " ".join(f"{r}:{c:.1f}" for r, c in enumerate(curve, 1))
    lines = [f"  verify batch       rows:cost in plain steps  {steps}"]
    slow = [r for r in range(1, len(curve)) if any(curve[m] <= curve[r - 1] for m in range(r, len(curve)))]
    if slow:
        lines.append(f"                     slower than a larger batch: {', '.join(map(str, slow))} rows")
    return lines


def _rates(w: Wisdom) -> list[str]:
    """Each KV and flash-attention setting's prompt and decode rates, and what
    they pick for a few shapes of run."""
    from localrun.tune.apply import examples, pick_text

    r = w.rates
    if r is None:
        if w.kv_cost is None and w.flash_attn is None:
            return []
        return ["  KV, flash attn     no prompt rates (an older `localrun tune`): `localrun tune` again to weigh them"]
    fill_at = " / ".join(map(str, r.fill_depths))
    decode_at = " / ".join(map(str, r.decode_depths))
    lines = [
        f"  KV, flash attn     prompt tok/s at depth {fill_at} (batches of {r.chunk}); decode ms/token at {decode_at}"
    ]
    for label in r.settings:
        fill = " / ".join(f"{t:.1f}" for t in r.fill_tps[label])
        decode = " / ".join(f"{ms:.1f}" for ms in r.decode_ms[label])
        lines.append(f"                     {label:<16} {fill} tok/s, {decode} ms")
    for run, pick in examples(w):
        lines.append(f"                     {run.describe()}: {pick_text(pick)}")
    return lines
