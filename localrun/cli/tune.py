"""`localrun tune`: measure this machine's speed settings for a model, or show them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from localrun import paths
from localrun.cli import _options as opt
from localrun.cli._env import current
from localrun.cli._output import out
from localrun.cli._resolve import resolve_model
from localrun.errors import UsageError

if TYPE_CHECKING:
    from localrun.tune.wisdom import Wisdom, WisdomFile

DEFAULT_SECONDS = 60.0
BUSY_WARNING = 0.15  # warn when other processes took this share of the CPUs during the measurements


def tune_command(
    model: Annotated[
        str | None,
        typer.Argument(
            help="The model to tune (default: config.toml's model, else the registry's default).", show_default=False
        ),
    ] = None,
    show: Annotated[
        bool, typer.Option("--show", help="Print what was measured on this machine; measure nothing.")
    ] = False,
    as_json: opt.Json = False,
    seconds: Annotated[
        float, typer.Option("--seconds", help="The time cap of the measurements.", min=5.0)
    ] = DEFAULT_SECONDS,
    kv: Annotated[
        str | None,
        typer.Option("--kv", help="Tune for this KV cache type (K and V, or K/V): default f16.", show_default=False),
    ] = None,
    offline: opt.Offline = False,
    rpc: opt.Rpc = None,
) -> None:
    """Measure on this machine which threads, flash attention, KV cache type,
    verify batches and parallel sequences are fastest for a model, and keep it
    (the wisdom every default then reads)."""
    if show:
        _show(model, as_json=as_json)
        return
    types = _kv_types(kv)
    opt.use_rpc(rpc)
    found = resolve_model(model, offline=offline, tune_hint=False)
    wisdom = run_tune(found.path, seconds=seconds, kv=types)
    if as_json:
        out().json(wisdom.as_dict())
    else:
        from localrun.ui.tune import describe

        out().result(describe(wisdom))


def keep_wisdom(change: Callable[[WisdomFile], object], what: str) -> Path | None:
    """This machine's wisdom with ``change`` made, written back; where. A file
    that cannot be written costs a warning, not the run: what was measured is
    shown all the same."""
    from localrun.tune.wisdom import WisdomFile

    wisdom_file = WisdomFile.load()
    for problem in wisdom_file.problems:
        out().warn(problem)
    change(wisdom_file)
    written: Path | None = None
    try:
        written = wisdom_file.save()
    except OSError as exc:
        out().warn(f"{what} could not be kept in {exc.filename or wisdom_file.path}: {paths.why_failed(exc)}")
    if wisdom_file.moved_to is not None:  # even when the new file then failed
        out().warn(f"the damaged wisdom file is kept as {wisdom_file.moved_to}")
    return written


def run_tune(path: Path, *, seconds: float = DEFAULT_SECONDS, kv: tuple[str, str] = ("f16", "f16")) -> Wisdom:
    """Measure with a progress bar on stderr, and keep the result."""
    from localrun.tune.measure import tune
    from localrun.ui.tune import TuneBar

    env = current()
    with TuneBar(env.stderr, path.name, terminal=env.stderr_isatty) as progress:
        wisdom = tune(path, seconds=seconds, kv=kv, progress=progress.update, memory_budget=env.config.memory_budget)
    kept = [wisdom]
    written = keep_wisdom(lambda wisdom_file: kept.append(wisdom_file.put(wisdom)), "the measurements")
    if written is not None:
        out().note(f"kept in {written}")
    if wisdom.unmeasured:
        out().warn(
            f"the machine was busy while it measured {', '.join(wisdom.unmeasured)}: those measurements change "
            "no default (what an earlier run measured stands); tune again when it is idle"
        )
    if wisdom.busy >= BUSY_WARNING:
        out().warn(
            f"other processes took {wisdom.busy:.0%} of the CPUs while it measured: the choices fit a busy "
            "machine (threads adapt while generating either way); tune again when it is idle"
        )
    return kept[-1]


def _kv_types(kv: str | None) -> tuple[str, str]:
    from localrun.config import KV_TYPES

    if kv is None:
        return "f16", "f16"
    k, _, v = kv.partition("/")
    v = v or k
    for t in (k, v):
        if t not in KV_TYPES:
            raise UsageError(f"unknown KV cache type {t!r} for --kv", hint=f"use {', '.join(KV_TYPES)}, or K/V")
    return k, v


def _show(model: str | None, *, as_json: bool) -> None:
    from localrun.tune.machine import this_machine
    from localrun.tune.wisdom import ModelKey, WisdomFile
    from localrun.ui.tune import describe

    wisdom_file = WisdomFile.load()
    for problem in wisdom_file.problems:
        out().warn(problem)
    machine = this_machine()
    entries = [w for w in wisdom_file.entries if w.machine == machine]
    if model is not None:
        key = ModelKey.of(resolve_model(model, offline=True).path)
        entries = [w for w in entries if w.model == key]
    others = len([w for w in wisdom_file.entries if w.machine != machine])
    if as_json:
        out().json({"machine": machine.as_dict(), "entries": [w.as_dict() for w in entries]}, indent=2)
        return
    if not entries:
        what = f" for {model}" if model else ""
        out().note(f"nothing measured on this machine{what} yet: `localrun tune MODEL` measures it")
    else:
        out().result("\n\n".join(describe(w) for w in entries))
    if others:
        out().note(f"({others} entr{'ies' if others > 1 else 'y'} from other machines ignored)")
