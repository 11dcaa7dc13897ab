"""Settle a run's automatic settings from this machine's wisdom.

After `localrun.settings.resolve` (option, model, config), every setting
still at its default is taken from the wisdom when `localrun tune` measured
it, with the source "wisdom"; without wisdom it stays llama.cpp's default.
`--kv auto` and `--flash-attn auto` are settled here too, with a reason.

The KV types and flash attention are settled together, for the run's shape
(`RunShape`: the prompt it fills and the answer it decodes): among the
settings the tune's `Rates` measured that fit the memory, the one predicted
to finish this run first, when it beats llama.cpp's default (f16, flash
attention auto) beyond the tie margin; so a long prompt and a long answer
may take different settings on the same machine. The shapes each kind of
run is weighed with (`localrun.assemble` makes them):

- generate: its prompt (about 3 characters a token, before the model loads)
  and `--max-tokens`, else `OPEN_ANSWER`;
- chat: a turn at the middle of its context (the conversation held, a
  message of `CHAT_MESSAGE` tokens, an answer of `OPEN_ANSWER`);
- `--batch`: the median prompt of its lines, counted in tokens, and the
  median answer budget (`OPEN_ANSWER` where a line has none);
- serve: a request that fills half its slot's context (a conversation or a
  document re-sent) and an answer of `OPEN_ANSWER`.

Wisdom without rates (a tune before them) settles flash attention from its
curve at the run's depth, as before, and the KV types for capacity alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from localrun.gguf.info import ModelInfo
from localrun.runtime.placement import DEFAULT_CTX, KV_AUTO_ORDER, KvPairs, choose_kv
from localrun.settings import AUTO, RunSettings, Source
from localrun.system import default_threads
from localrun.tune.wisdom import (
    TIE_MARGIN,
    Attention,
    ModelKey,
    Pick,
    RunShape,
    Wisdom,
    WisdomFile,
    kv_label,
    parse_setting,
    setting_label,
)

AttentionProbe = Callable[[int], Attention | None]  # a thread count: the curve measured at it, or None
OPEN_ANSWER = 512  # the answer assumed where no --max-tokens bounds it: a few paragraphs, or a function
CHAT_MESSAGE = 64  # a chat message and its template's tokens
RETUNE = (
    "the KV figures of an older `localrun tune` are not used (it raced every type with flash attention on "
    "and never weighed the prompt); `localrun tune` measures the model again"
)


@dataclass(frozen=True)
class Found:
    """This machine's wisdom for a model (None: none), and what to tell the user."""

    wisdom: Wisdom | None
    warnings: list[str] = field(default_factory=list)
    hint: str | None = None  # said once per model: how to tune it


def find(model: Path, kv: tuple[str, str] | None = None, *, hint_once: bool = True) -> Found:
    """The wisdom for ``model`` with ``kv`` (None or auto: any, f16 first).
    Never raises: an unreadable file is a warning."""
    try:
        key = ModelKey.of(model)
    except OSError:
        return Found(None)
    wisdom_file = WisdomFile.load()
    warnings = list(wisdom_file.problems)
    exact = kv_label(*kv) if kv and AUTO not in kv else None
    wisdom = wisdom_file.find(key, exact) or wisdom_file.find(key)
    if wisdom is not None:
        return Found(wisdom, warnings)
    foreign = wisdom_file.foreign(key)
    if foreign is not None:
        warnings.append(
            f"the speed measurements for {model.name} were made on another machine "
            f"({foreign.machine.describe()}) and are ignored; `localrun tune` measures this one"
        )
    hint = None
    if hint_once and key.file not in wisdom_file.hinted and not wisdom_file.problems:
        hint = (
            f"note: no speed measurements of {model.name} on this machine yet: llama.cpp's defaults apply; "
            f"`localrun tune {model}` measures them (about a minute)"
        )
        wisdom_file.hinted.add(key.file)
        with contextlib.suppress(OSError):  # the hint comes again next time: no harm
            wisdom_file.save()
    return Found(None, warnings, hint)


@dataclass
class _Settled:
    """The values settled so far, their sources and reasons."""

    settings: RunSettings
    values: dict[str, object] = field(default_factory=dict)
    sources: dict[str, Source] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.sources = dict(self.settings.sources)
        self.reasons = dict(self.settings.reasons)

    def open(self, name: str) -> bool:
        """Whether ``name`` is still at its built-in default (nothing the user said, nothing settled)."""
        return self.sources.get(name, "default") == "default" and name not in self.values

    def take(self, name: str, value: object, why: str | None = None) -> None:
        self.values[name] = value
        self.sources[name] = "wisdom"
        if why:
            self.reasons[name] = why

    def result(self) -> RunSettings:
        return dataclasses.replace(self.settings, sources=self.sources, reasons=self.reasons, **self.values)  # type: ignore[arg-type]


def _measured_counts(s: _Settled, wisdom: Wisdom) -> None:
    for name, decision in (("threads", wisdom.threads), ("parallel", wisdom.parallel), ("n_ubatch", wisdom.n_ubatch)):
        if s.open(name) and decision is not None and isinstance(decision.value, int):
            s.take(name, decision.value)
    advised = wisdom.bench.get("draft")
    if s.open("draft") and isinstance(advised, str) and advised in ("none", "lookup", "auto"):
        s.take("draft", advised, "localrun bench measured it fastest here")
    advised = wisdom.bench.get("parallel")
    if s.open("parallel") and isinstance(advised, int) and advised > 0:
        s.take("parallel", advised, "localrun bench measured it fastest here")


def _kv(
    s: _Settled, shape: ModelInfo, wisdom: Wisdom | None, need: int | None, budget: int, pairs: KvPairs
) -> tuple[str, str]:
    settings = s.settings
    if AUTO not in (settings.type_k, settings.type_v):
        return settings.type_k, settings.type_v
    n = need or settings.n_ctx or min(DEFAULT_CTX, shape.context_length or DEFAULT_CTX)
    choice = choose_kv(shape, n, budget, None, TIE_MARGIN, pairs)  # for capacity: no rates to weigh
    s.values.update(type_k=choice.type_k, type_v=choice.type_v)
    s.reasons["kv"] = f"{choice.type_k}/{choice.type_v}: {choice.reason}"
    old = wisdom.kv_cost if wisdom is not None and wisdom.rates is None else None
    if old is not None and old.value is not None and old.value != kv_label(choice.type_k, choice.type_v):
        s.reasons["kv"] += f"; {RETUNE}"
    return choice.type_k, choice.type_v


def _joint(
    s: _Settled,
    shape: ModelInfo,
    wisdom: Wisdom | None,
    run: RunShape | None,
    need: int | None,
    budget: int,
    pairs: KvPairs,
) -> bool:
    """The KV types and flash attention that are still automatic, settled
    together from the tune's rates for ``run`` (None: a short prompt and an
    open answer); False where there are no rates for them (the caller
    settles them apart, as before)."""
    settings = s.settings
    rates = wisdom.rates if wisdom is not None else None
    kv_auto, fa_auto = AUTO in (settings.type_k, settings.type_v), settings.flash_attn == AUTO
    if rates is None or not (kv_auto or fa_auto):
        return False
    run = run or RunShape(CHAT_MESSAGE, OPEN_ANSWER, what="no shape given")
    fits = None
    if kv_auto:
        n = need or settings.n_ctx or min(DEFAULT_CTX, shape.context_length or DEFAULT_CTX)
        fits = choose_kv(shape, n, budget, None, TIE_MARGIN, pairs)
        first = (fits.type_k, fits.type_v)
        kvs = [kv for kv in pairs if not budget or shape.memory_needed(n, *kv) <= budget]
        if first not in kvs:  # none fits: the smallest is tried, whatever its speed
            return False
    else:
        first = (settings.type_k, settings.type_v)
        kvs = [first]
    modes = ("off", "on") if fa_auto else (settings.flash_attn,)
    allowed = [setting_label(k, v, m) for k, v in kvs for m in modes if v == "f16" or m == "on"]
    default = setting_label(*first, "on" if fa_auto else settings.flash_attn)
    if default not in rates.settings:  # tuned for other KV types: nothing to weigh them against
        return False
    pick = rates.pick(run, default, allowed)
    type_k, type_v, mode = parse_setting(pick.label) if pick.label is not None else (*first, AUTO)
    why = f"{pick.why} ({pick.compared()}; localrun tune's rates)"
    if fits is not None:
        s.values.update(type_k=type_k, type_v=type_v)
        s.reasons["kv"] = f"{type_k}/{type_v}: {fits.reason}; {why}"
        if (type_k, type_v) != first:
            s.sources.update(type_k="wisdom", type_v="wisdom")
    if fa_auto:
        if pick.label is None:
            s.reasons["flash_attn"] = f"auto: {why}"
        else:
            s.take("flash_attn", mode, f"{mode}: {why}")
    return True


def _flash_attn(
    s: _Settled, wisdom: Wisdom | None, kv: tuple[str, str], depth: int | None, probed: AttentionProbe | None
) -> None:
    """The mode measured faster at ``depth``: by `localrun tune` on the model,
    else by ``probed`` (`localrun.tune.attention`) on its attention shape."""
    if s.settings.flash_attn != AUTO or kv[1] != "f16":
        return
    at = f"at depth {depth}" if depth is not None else "over the depths measured"
    curve = wisdom.flash_attn if wisdom is not None and wisdom.kv == kv_label(*kv) else None
    if curve is not None:
        mode = curve.choice(depth)
        if mode is None:
            s.reasons["flash_attn"] = f"auto: on and off measured alike {at}"
            return
        cross = curve.crossover
        where = f"; the two cross near depth {cross}" if cross is not None else ""
        s.take("flash_attn", mode, f"{mode}: faster {at}{where} (localrun tune)")
        return
    threads = s.values.get("threads") or s.settings.threads or default_threads()
    shape_curve = probed(threads) if probed is not None and isinstance(threads, int) else None
    if shape_curve is None:
        return
    mode = shape_curve.choice(depth, max_gain=None)  # steps of attention alone: no bound on the ratio
    if mode is None:
        s.reasons["flash_attn"] = f"auto: on and off measured alike {at} for this attention shape"
        return
    s.take("flash_attn", mode, f"{mode}: faster {at} for this model's attention shape (measured here)")


def apply(
    settings: RunSettings,
    shape: ModelInfo,
    wisdom: Wisdom | None,
    *,
    need: int | None = None,
    depth: int | None = None,
    budget: int = 0,
    kv_pairs: KvPairs = KV_AUTO_ORDER,
    attention: AttentionProbe | None = None,
    run: RunShape | None = None,
) -> RunSettings:
    """``settings`` with its automatic values settled for ``shape``.

    ``need``: the context the run needs (prompt and output; None: the
    --ctx given, else DEFAULT_CTX); ``depth``: the context depth the run will
    mostly decode at (None: unknown), for flash attention; ``budget``: the
    bytes the run's placement has for the model (0: unknown), and
    ``kv_pairs`` the K/V types it may take in order, for `--kv auto`;
    ``attention``: the flash-attention curve of the model's attention shape
    at a thread count, measured here when first asked for (None: not
    measured), where the wisdom has no curve of the model's own; ``run``:
    the run's shape, which the KV types and flash attention are chosen for
    where the wisdom has rates (see the module docstring)."""
    s = _Settled(settings)
    if wisdom is not None:
        _measured_counts(s, wisdom)
    if settings.threads is None and "threads" not in s.values:
        s.values["threads"] = default_threads()  # llama.cpp's default, named so that --json shows it
    if not _joint(s, shape, wisdom, run, need, budget, kv_pairs):
        _flash_attn(s, wisdom, _kv(s, shape, wisdom, need, budget, kv_pairs), depth, attention)
    return s.result()


# the shapes `localrun tune --show` and `localrun show` pick for, to show what the rates decide
EXAMPLE_SHAPES = (
    RunShape(1800, 64, what="a long prompt, a short answer"),
    RunShape(1800, OPEN_ANSWER, what="a long prompt, a long answer"),
    RunShape(CHAT_MESSAGE, OPEN_ANSWER, what="a short prompt, a long answer"),
    RunShape(CHAT_MESSAGE, OPEN_ANSWER, DEFAULT_CTX // 2, what="a turn at a chat's middle"),
)


def examples(wisdom: Wisdom | None) -> list[tuple[RunShape, Pick]]:
    """What the wisdom's rates pick for each of `EXAMPLE_SHAPES`, every
    setting measured allowed (memory not weighed); none without rates."""
    rates = wisdom.rates if wisdom is not None else None
    if rates is None or wisdom is None:
        return []
    type_k, _, type_v = wisdom.kv.partition("/")
    default = setting_label(type_k, type_v, "on")
    return [(run, rates.pick(run, default)) for run in EXAMPLE_SHAPES]


def pick_text(pick: Pick) -> str:
    """One pick as a line: the setting taken and why."""
    if pick.label is None:
        return f"{pick.default} kept, llama.cpp's default ({pick.why.split(' for a ')[0]}; {pick.compared()})"
    return f"{pick.label} ({pick.why.split(' for a ')[0]}; {pick.compared()})"
