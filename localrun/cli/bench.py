"""`localrun bench`: parse, call the core, render."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from localrun import paths
from localrun.cli import _options as opt
from localrun.cli._env import current
from localrun.cli._errors import ExitCode
from localrun.cli._output import out
from localrun.cli._resolve import resolve_model
from localrun.errors import UsageError
from localrun.settings import Options, resolve
from localrun.units import parse_size


def bench_command(
    model: opt.Model = None,
    quick: Annotated[bool, typer.Option("--quick", help="One row per technique, one prompt.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="The raw figures as one JSON object on stdout.")] = False,
    chart: Annotated[
        Path | None, typer.Option("--chart", help="Also write an SVG bar chart to this file.", show_default=False)
    ] = None,
    save: Annotated[
        bool,
        typer.Option(
            "--save-defaults",
            help="Also write the advised settings to the user's config.toml (they are always kept, "
            "for this machine only, with the model's wisdom; see localrun tune --show).",
        ),
    ] = False,
    compare: Annotated[
        Path | None,
        typer.Option(
            "--compare",
            help="Another quantization of the model for the weights row (default: a sibling 8-bit/4-bit file).",
            show_default=False,
        ),
    ] = None,
    rounds: Annotated[int | None, typer.Option("--rounds", help="Repeats of every row.", show_default=False)] = None,
    max_tokens: Annotated[
        int | None, typer.Option("--max-tokens", "-n", help="Tokens generated per prompt.", show_default=False)
    ] = None,
    threads: opt.Threads = None,
    gpu_layers: opt.GpuLayers = None,
    device: opt.Device = None,
    rpc: opt.Rpc = None,
    budget: Annotated[
        str | None, typer.Option("--budget", help="Memory budget for the KV fits column, e.g. 4GiB.")
    ] = None,
    offline: opt.Offline = False,
    verbose: opt.Verbose = False,
    draft_model: Annotated[
        str | None,
        typer.Option(
            "--draft-model",
            help="Draft model for the speculative rows (default: the model's matched draft).",
            show_default=False,
        ),
    ] = None,
) -> ExitCode:
    """Measure each technique on this machine: a table with the speedup against the baseline."""
    from localrun import bench as core
    from localrun import store
    from localrun.config import save_defaults
    from localrun.runtime import devices
    from localrun.ui import bench as benchview

    if rounds is not None and rounds < 1:
        raise UsageError("--rounds must be at least 1")
    if max_tokens is not None and max_tokens < 2:
        raise UsageError("--max-tokens must be at least 2")
    opt.check_positive(threads=threads)
    try:
        budget_bytes = parse_size(budget) if budget else None
    except ValueError as exc:
        raise UsageError(str(exc), hint="--budget 4GiB") from None
    if chart is not None:  # before the run, not after it
        opt.check_output_file("--chart", chart)
    env = current()
    opt.use_rpc(rpc)
    found = resolve_model(model, offline=offline)
    entry = found.target.entry
    settings = resolve(
        Options(threads=threads, memory_budget=budget_bytes, gpu_layers=gpu_layers, device=device),
        entry.defaults if entry else None,
        env.config,
    )
    settings = opt.without_a_gpu(settings, devices.probe()) if settings.gpu_layers != "auto" else settings
    draft_path = (
        resolve_model(draft_model, offline=offline).path
        if draft_model
        else store.matched_draft(found.target, env.registry)
    )
    plan = core.Plan.make(
        quick,
        rounds=rounds,
        max_tokens=max_tokens,
        threads=settings.threads,
        memory_budget=settings.memory_budget,
        gpu_layers=settings.gpu_layers,
        device=settings.device,
        flash_attn=settings.flash_attn,
        verbose=verbose or None,
    )
    with benchview.BenchProgress(env.stderr, terminal=env.stderr_isatty) as progress:
        result = core.run(core.Bench(found.path, plan, compare=compare, draft=draft_path), progress=progress.update)
    if as_json:
        out().json(result.as_dict())
    else:
        from rich.text import Text

        advice = [] if result.interrupted else [Text(f"advice: {result.advice.text}")]
        out().table(benchview.table(result), *advice)
    if result.interrupted:  # a partial ladder: shown, but neither kept nor charted
        measured = sum(row.measured for row in result.rows)
        out().note(f"interrupted: {measured} of {len(result.rows)} rows measured; the advice is not kept")
        return ExitCode.INTERRUPTED
    if chart is not None:
        paths.atomic_write(chart, benchview.chart(result))
        out().note(f"chart: {chart}")
    if result.busy is not None:  # what a busy machine measured changes no default
        out().warn(f"the advice is not kept ({result.busy})")
        return ExitCode.OK
    _keep_advice(found.path, result.advice.defaults)
    if save:
        written = save_defaults(result.advice.defaults)
        pairs = ", ".join(f"{k} = {v}" for k, v in result.advice.defaults.items())
        out().note(f"saved defaults to {written}: {pairs}")
    return ExitCode.OK


def _keep_advice(model: Path, advice: dict[str, object]) -> None:
    """The advice joins this machine's wisdom for the model: one home for what was measured here."""
    from datetime import UTC, datetime

    from localrun.cli.tune import keep_wisdom
    from localrun.tune.wisdom import ModelKey

    now = datetime.now(UTC).isoformat(timespec="seconds")
    key = ModelKey.of(model)
    written = keep_wisdom(lambda wisdom_file: wisdom_file.merge_bench(key, "f16/f16", advice, now), "the advice")
    if written is not None:
        out().note(f"advice kept with this machine's wisdom in {written}")
