"""`localrun bench` and `localrun quantize`: parse, call the core, render."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from localrun import bench as core
from localrun import store
from localrun.ui import bench as benchview
from localrun.store import registry
from localrun.cli import _options as opt
from localrun.cli._errors import error_boundary
from localrun.cli.models import resolve_model
from localrun.config import load as load_config
from localrun.config import save_defaults
from localrun.errors import UsageError
from localrun.gguf.info import parse_size
from localrun.runtime.quantize import QUANT_TYPES, quantize
from localrun.ui.stream import human_bytes


def _stdout_console() -> Console:
    """A wide console into a pipe, so the table is not squeezed to 80 columns."""
    return Console(file=sys.stdout, width=None if sys.stdout.isatty() else 180)


def bench_command(
    model: opt.Model = None,
    quick: Annotated[bool, typer.Option("--quick", help="One row per technique, one prompt.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="The raw figures as one JSON object on stdout.")] = False,
    chart: Annotated[
        Path | None, typer.Option("--chart", help="Also write an SVG bar chart to this file.", show_default=False)
    ] = None,
    save: Annotated[
        bool, typer.Option("--save-defaults", help="Write the advised settings to the user's config.toml.")
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
    budget: Annotated[
        str | None, typer.Option("--budget", help="Memory budget for the KV fits column, e.g. 4GiB.")
    ] = None,
    offline: opt.Offline = False,
    verbose: opt.Verbose = False,
    draft: Annotated[
        str | None,
        typer.Option(
            "--draft",
            help="Draft model for the speculative rows (default: the model's matched draft).",
            show_default=False,
        ),
    ] = None,
    debug: opt.Debug = False,
) -> None:
    """Measure each technique on this machine: a table with the speedup against the baseline."""
    with error_boundary(debug):
        if rounds is not None and rounds < 1:
            raise UsageError("--rounds must be at least 1")
        if max_tokens is not None and max_tokens < 2:
            raise UsageError("--max-tokens must be at least 2")
        if threads is not None and threads < 1:
            raise UsageError("--threads must be at least 1")
        try:
            budget_bytes = parse_size(budget) if budget else None
        except ValueError as exc:
            raise UsageError(str(exc), hint="--budget 4GiB") from None
        user = load_config()
        path, target = resolve_model(model, offline=offline)
        draft_path = resolve_model(draft, offline=offline)[0] if draft else store.matched_draft(target, registry.load())
        plan = core.Plan.make(
            quick,
            rounds=rounds,
            max_tokens=max_tokens,
            threads=threads or user.threads,
            memory_budget=budget_bytes or user.memory_budget,
            flash_attn=user.flash_attn,
            verbose=verbose or None,
        )
        with benchview.BenchProgress(sys.stderr) as progress:
            result = core.run(core.Bench(path, plan, compare=compare, draft=draft_path), progress=progress.update)
        if as_json:
            sys.stdout.write(json.dumps(result.as_dict()) + "\n")
        else:
            console = _stdout_console()
            console.print(benchview.table(result))
            console.print(f"advice: {result.advice.text}", highlight=False)
        if chart is not None:
            chart.write_text(benchview.chart(result), encoding="utf-8")
            sys.stderr.write(f"chart: {chart}\n")
        if save:
            written = save_defaults(result.advice.defaults)
            pairs = ", ".join(f"{k} = {v}" for k, v in result.advice.defaults.items())
            sys.stderr.write(f"saved defaults to {written}: {pairs}\n")


def quantize_command(
    source: Annotated[Path, typer.Argument(help="The GGUF model to quantize (ideally f16 or f32).")],
    output: Annotated[Path, typer.Argument(help="The GGUF file to write.")],
    qtype: Annotated[str, typer.Option("--type", help=f"One of: {', '.join(QUANT_TYPES)}.")],
    force: Annotated[bool, typer.Option("--force", help="Overwrite OUTPUT if it exists.")] = False,
    allow_requantize: Annotated[
        bool, typer.Option("--allow-requantize", help="Quantize weights that are already quantized.")
    ] = False,
    threads: opt.Threads = None,
    verbose: opt.Verbose = False,
    debug: opt.Debug = False,
) -> None:
    """Quantize a GGUF model with llama.cpp's quantizer; prints the output path."""
    with error_boundary(debug):
        if threads is not None and threads < 1:
            raise UsageError("--threads must be at least 1")
        bar = Progress(
            SpinnerColumn(),
            TextColumn(f"quantizing to {qtype}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("tensors"),
            TimeElapsedColumn(),
            console=Console(file=sys.stderr),
            transient=True,
            disable=not sys.stderr.isatty() or verbose,
        )
        with bar:
            task = bar.add_task("quantize", total=None)
            done = quantize(
                source,
                output,
                qtype,
                force=force,
                allow_requantize=allow_requantize,
                threads=threads,
                progress=lambda n, total: bar.update(task, completed=n, total=total),
                verbose=verbose,
            )
        sys.stderr.write(
            f"{done.type}: {human_bytes(done.input_bytes)} -> {human_bytes(done.output_bytes)} "
            f"in {done.seconds:.1f}s, checked: loads, file type {done.type}\n"
        )
        sys.stdout.write(f"{done.path}\n")
