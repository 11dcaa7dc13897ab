"""`localrun quantize`: parse, call llama.cpp's quantizer, report."""

from __future__ import annotations

import contextlib
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
    from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn

    from localrun.runtime.quantize import quantize
    from localrun.ui.progress import bar

    opt.check_positive(threads=threads)
    env = current()
    progress = bar(
        env.stderr,
        SpinnerColumn(),
        TextColumn(f"quantizing to {qtype}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("tensors"),
        TimeElapsedColumn(),
        terminal=bool(env.stderr_isatty) and not verbose,  # llama.cpp's log takes the screen with --verbose
    )
    with progress or contextlib.nullcontext():
        task = progress.add_task("quantize", total=None) if progress is not None else None

        def tensors(n: int, total: int) -> None:
            if progress is not None and task is not None:
                progress.update(task, completed=n, total=total)

        done = quantize(
            source,
            output,
            qtype,
            force=force,
            allow_requantize=allow_requantize,
            threads=threads,
            progress=tensors,
            verbose=verbose,
        )
    out().note(
        f"{done.type}: {human_bytes(done.input_bytes)} -> {human_bytes(done.output_bytes)} "
        f"in {done.seconds:.1f}s, checked: loads, file type {done.type}"
    )
    out().result(str(done.path))
