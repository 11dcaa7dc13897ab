"""Settle a run's automatic settings from this machine's wisdom.

After `localrun.settings.resolve` (option, model, config), every setting
still at its default is taken from the wisdom when `localrun tune` measured
it, with the source "wisdom"; without wisdom it stays llama.cpp's default.
`--kv auto` and `--flash-attn auto` are settled here too, with a reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from localrun.gguf.info import ModelInfo
from localrun.runtime.sizing import DEFAULT_CTX, choose_kv, memory_budget
from localrun.settings import AUTO, RunSettings, Source
from localrun.system import default_threads
from localrun.tune.wisdom import ModelKey, Wisdom, WisdomFile, kv_label


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


def _set(
    values: dict[str, object],
    sources: dict[str, Source],
    reasons: dict[str, str],
    name: str,
    value: object,
    why: str | None = None,
) -> None:
    values[name] = value
    sources[name] = "wisdom"
    if why:
        reasons[name] = why


def apply(
    settings: RunSettings,
    shape: ModelInfo,
    wisdom: Wisdom | None,
    *,
    need: int | None = None,
    depth: int | None = None,
) -> RunSettings:
    """``settings`` with its automatic values settled for ``shape``.

    ``need``: the context the run needs (prompt and output; None: the
    --ctx given, else DEFAULT_CTX); ``depth``: the context depth the run will
    mostly decode at (None: unknown), for flash attention."""
    values: dict[str, object] = {}
    sources: dict[str, Source] = dict(settings.sources)
    reasons: dict[str, str] = dict(settings.reasons)
    default = {name for name, source in sources.items() if source == "default"} | {
        n for n in ("threads", "parallel", "n_ubatch") if n not in sources
    }
    if wisdom is not None:
        if "threads" in default and wisdom.threads is not None and isinstance(wisdom.threads.value, int):
            _set(values, sources, reasons, "threads", wisdom.threads.value)
        if "parallel" in default and wisdom.parallel is not None and isinstance(wisdom.parallel.value, int):
            _set(values, sources, reasons, "parallel", wisdom.parallel.value)
        if "n_ubatch" in default and wisdom.n_ubatch is not None and isinstance(wisdom.n_ubatch.value, int):
            _set(values, sources, reasons, "n_ubatch", wisdom.n_ubatch.value)
        advised = wisdom.bench.get("draft")
        if "draft" in default and isinstance(advised, str) and advised in ("none", "lookup", "auto"):
            _set(values, sources, reasons, "draft", advised, "localrun bench measured it fastest here")
        advised = wisdom.bench.get("parallel")
        if "parallel" in default and "parallel" not in values and isinstance(advised, int) and advised > 0:
            _set(values, sources, reasons, "parallel", advised, "localrun bench measured it fastest here")

    if settings.threads is None and "threads" not in values:
        values["threads"] = default_threads()  # llama.cpp's default, named so that --json shows it
    type_k, type_v = settings.type_k, settings.type_v
    if AUTO in (type_k, type_v):
        n = need or settings.n_ctx or min(DEFAULT_CTX, shape.context_length or DEFAULT_CTX)
        cost = wisdom.kv_cost if wisdom is not None else None
        costs = cost.figures if cost is not None and cost.value is not None else None  # a tie: no cost to weigh
        choice = choose_kv(shape, n, memory_budget(settings.memory_budget), costs)
        type_k, type_v = choice.type_k, choice.type_v
        values.update(type_k=type_k, type_v=type_v)
        reasons["kv"] = f"{type_k}/{type_v}: {choice.reason}"

    curve = wisdom.flash_attn if wisdom is not None and wisdom.kv == kv_label(type_k, type_v) else None
    if settings.flash_attn == AUTO and type_v == "f16" and curve is not None:
        mode = curve.choice(depth)
        at = f"at depth {depth}" if depth is not None else "over the depths measured"
        if mode is None:
            reasons["flash_attn"] = f"auto: on and off measured alike {at}"
        else:
            cross = curve.crossover
            where = f"; the two cross near depth {cross}" if cross is not None else ""
            _set(values, sources, reasons, "flash_attn", mode, f"{mode}: faster {at}{where} (localrun tune)")
    return dataclasses.replace(settings, sources=sources, reasons=reasons, **values)  # type: ignore[arg-type]
