"""Settle a run's automatic settings from this machine's wisdom.

After `localrun.settings.resolve` (option, model, config), every setting
still at its default is taken from the wisdom when `localrun tune` measured
it, with the source "wisdom"; without wisdom it stays llama.cpp's default.
`--kv auto` and `--flash-attn auto` are settled here too, with a reason.
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
from localrun.tune.wisdom import TIE_MARGIN, Attention, ModelKey, Wisdom, WisdomFile, kv_label

AttentionProbe = Callable[[int], Attention | None]  # a thread count: the curve measured at it, or None


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
    cost = wisdom.kv_cost if wisdom is not None else None
    costs = cost.figures if cost is not None and cost.value is not None else None  # a tie: no cost to weigh
    choice = choose_kv(shape, n, budget, costs, TIE_MARGIN, pairs)
    s.values.update(type_k=choice.type_k, type_v=choice.type_v)
    s.reasons["kv"] = f"{choice.type_k}/{choice.type_v}: {choice.reason}"
    fits = choose_kv(shape, n, budget, None, TIE_MARGIN, pairs) if costs else choice
    if (fits.type_k, fits.type_v) != (choice.type_k, choice.type_v):  # measured faster here, not what fits
        s.sources.update(type_k="wisdom", type_v="wisdom")
    return choice.type_k, choice.type_v


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
) -> RunSettings:
    """``settings`` with its automatic values settled for ``shape``.

    ``need``: the context the run needs (prompt and output; None: the
    --ctx given, else DEFAULT_CTX); ``depth``: the context depth the run will
    mostly decode at (None: unknown), for flash attention; ``budget``: the
    bytes the run's placement has for the model (0: unknown), and
    ``kv_pairs`` the K/V types it may take in order, for `--kv auto`;
    ``attention``: the flash-attention curve of the model's attention shape
    at a thread count, measured here when first asked for (None: not
    measured), where the wisdom has no curve of the model's own."""
    s = _Settled(settings)
    if wisdom is not None:
        _measured_counts(s, wisdom)
    if settings.threads is None and "threads" not in s.values:
        s.values["threads"] = default_threads()  # llama.cpp's default, named so that --json shows it
    _flash_attn(s, wisdom, _kv(s, shape, wisdom, need, budget, kv_pairs), depth, attention)
    return s.result()
