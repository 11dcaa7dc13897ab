"""`localrun quantize`: parse, call llama.cpp's quantizer, report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from localrun.cli import _options as opt
from localrun.cli._env import current
from localrun.cli._output import out
from localrun.units import human_bytes


def quantize_command(
    source: Annotated[Path, typer.Argument(help="The GGUF model to quantize (ideally f16 or f32).")],
    output: Annotated[Path, typer.Argument(help="The GGUF file to write.")],
    qtype: Annotated[
        str, typer.Option("--type", help="A llama.cpp quantization: q8_0, q4_k_m, q4_0, ... (a wrong one lists them).")
    ],
    force: Annotated[bool, typer.Option("--force", help="Overwrite OUTPUT if it exists.")] = False,
    allow_requantize: Annotated[
        bool, typer.Option("--allow-requantize", help="Quantize weights that are already quantized.")
    ] = False,
    threads: opt.Threads = None,
    verbose: opt.Verbose = False,
) -> None:
    """Quantize a GGUF model with llama.cpp's quantizer; prints the output path."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from localrun.runtime.quantize import quantize

    opt.check_positive(threads=threads)
    env = current()
    bar = Progress(
        SpinnerColumn(),
        TextColumn(f"quantizing to {qtype}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("tensors"),
        TimeElapsedColumn(),
        console=Console(file=env.stderr),
        transient=True,
        disable=not env.stderr_isatty or verbose,
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
    out().note(
        f"{done.type}: {human_bytes(done.input_bytes)} -> {human_bytes(done.output_bytes)} "
        f"in {done.seconds:.1f}s, checked: loads, file type {done.type}"
    )
    out().result(str(done.path))
