"""`localrun generate`: parse, call the core, pick a renderer."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer
from rich.console import Console

from localrun.cli._errors import ExitCode, error_boundary
from localrun.cli.models import resolve_model
from localrun.decode import SamplingParams
from localrun.decode import generate as run_generation
from localrun.engine import Engine, EngineConfig
from localrun.errors import UsageError
from localrun.ggufmeta import read_gguf
from localrun.prompt import compose, prompt_tokens
from localrun.render import JsonRenderer, LiveRenderer, PlainRenderer, Renderer


def read_prompt(argument: str | None) -> str:
    """PROMPT from the argument, or stdin when it is `-` or stdin is piped;
    with both, the argument is the instruction and stdin the material."""
    if argument == "-":
        return compose(None, sys.stdin.read())
    material = None if sys.stdin is None or sys.stdin.isatty() else sys.stdin.read()
    return compose(argument, material)


@contextmanager
def ctrl_c_stops(engine: Engine) -> Iterator[None]:
    """The first Ctrl-C asks the loop to stop (it ends with stop_reason
    'interrupted'); a second one raises KeyboardInterrupt."""

    def handler(signum: int, frame: FrameType | None) -> None:
        if engine.abort_requested:
            raise KeyboardInterrupt
        engine.abort_requested = True

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def parse_ctx(value: str) -> int | None:
    if value == "auto":
        return None
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"--ctx {value!r} is not a number", hint="use --ctx auto or --ctx 8192") from None


def pick_renderer(as_json: bool, show_stats: bool, title: str) -> Renderer:
    if as_json:
        return JsonRenderer(sys.stdout)
    if sys.stdout.isatty():
        return LiveRenderer(Console(file=sys.stdout), title=title)
    return PlainRenderer(sys.stdout, sys.stderr, show_stats=show_stats)


def generate(
    prompt: Annotated[
        str | None, typer.Argument(help="The prompt; '-' or a pipe reads stdin.", show_default=False)
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "-m",
            "--model",
            envvar="LOCALRUN_MODEL",
            help="Alias (family:tag), owner/repo:QUANT, hf://... or a GGUF path. Default: the registry's default.",
            show_default=False,
        ),
    ] = None,
    offline: Annotated[bool, typer.Option("--offline", help="Never download: use only models already here.")] = False,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", "-n", help="Stop after this many tokens.")] = None,
    temperature: Annotated[float, typer.Option("--temperature", "-t", help="0 for greedy decoding.")] = 0.8,
    top_p: Annotated[float, typer.Option("--top-p")] = 0.95,
    top_k: Annotated[int, typer.Option("--top-k")] = 40,
    min_p: Annotated[float, typer.Option("--min-p")] = 0.05,
    repeat_penalty: Annotated[float, typer.Option("--repeat-penalty")] = 1.0,
    seed: Annotated[int | None, typer.Option("--seed", help="Fix the sampling seed.")] = None,
    stop: Annotated[list[str] | None, typer.Option("--stop", help="Stop at this text (repeatable).")] = None,
    system: Annotated[str | None, typer.Option("-s", "--system", help="System prompt.")] = None,
    ctx: Annotated[
        str | None, typer.Option("--ctx", help="Context size in tokens, or auto: the longest that fits in memory.")
    ] = None,
    threads: Annotated[int | None, typer.Option("--threads", help="CPU threads (default: all available).")] = None,
    kv: Annotated[str | None, typer.Option("--kv", help="KV cache type for K and V: f16, q8_0 or q4_0.")] = None,
    kv_k: Annotated[str | None, typer.Option("--kv-k", help="KV cache type for K (overrides --kv).")] = None,
    kv_v: Annotated[str | None, typer.Option("--kv-v", help="KV cache type for V (overrides --kv).")] = None,
    flash_attn: Annotated[
        str, typer.Option("--flash-attn", help="on, off or auto (on whenever V is quantized).")
    ] = "auto",
    raw: Annotated[bool, typer.Option("--raw", help="Send the prompt as is, without the chat template.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Newline-delimited JSON events on stdout.")] = False,
    stats: Annotated[bool, typer.Option("--stats", help="A one-line summary on stderr.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", help="Show llama.cpp's own log.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Tracebacks on errors.")] = False,
    batch: Annotated[
        str | None,
        typer.Option("--batch", help="Many prompts: a file (or - for stdin) of lines or JSONL; JSONL results."),
    ] = None,
    parallel: Annotated[
        int | None, typer.Option("--parallel", help="--batch: sequences decoded together (default: what fits).")
    ] = None,
    unordered: Annotated[bool, typer.Option("--unordered", help="--batch: write results as they finish.")] = False,
    resume: Annotated[
        Path | None, typer.Option("--resume", help="--batch: skip the ids already in this file; append to it.")
    ] = None,
) -> None:
    """Generate text from a prompt, streamed as it is produced."""
    with error_boundary(debug):
        if max_tokens is not None and max_tokens < 1:
            raise UsageError("--max-tokens must be at least 1")
        if threads is not None and threads < 1:
            raise UsageError("--threads must be at least 1")
        text = read_prompt(prompt) if batch is None else ""
        path, target = resolve_model(model, offline=offline, with_draft=True)
        defaults = target.entry.defaults if target.entry else {}
        n_ctx = parse_ctx(ctx) if ctx is not None else defaults.get("ctx")
        system = system if system is not None else defaults.get("system")
        type_k = kv_k or kv or defaults.get("kv_k") or defaults.get("kv") or "f16"
        type_v = kv_v or kv or defaults.get("kv_v") or defaults.get("kv") or "f16"
        info = read_gguf(path)
        sampling = SamplingParams(
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty, seed=seed
        )
        if batch is not None:  # many prompts: localrun/cli/batch.py
            from localrun.cli import batch as batch_cli

            settings = batch_cli.BatchSettings(
                source=batch,
                instruction=prompt,
                system=system,
                raw=raw,
                sampling=sampling,
                max_tokens=max_tokens,
                stop=tuple(stop or ()),
                seq_ctx=parse_ctx(ctx) if ctx is not None else None,
                parallel=parallel,
                unordered=unordered,
                resume=resume,
                show_stats=stats,
            )
            config = EngineConfig(
                model_path=info.path,
                n_threads=threads,
                type_k=type_k,
                type_v=type_v,
                flash_attn=flash_attn,
                verbose=verbose,
            )
            raise typer.Exit(batch_cli.run(settings, config, info))
        with Engine(
            EngineConfig(
                model_path=info.path,
                n_ctx=n_ctx,
                n_threads=threads,
                type_k=type_k,
                type_v=type_v,
                flash_attn=flash_attn,
                verbose=verbose,
            ),
            info,
        ) as engine:
            tokens = prompt_tokens(engine, text, system=system, raw=raw)
            renderer = pick_renderer(as_json, stats, info.name)
            with ctrl_c_stops(engine):
                events = run_generation(engine, tokens, sampling, max_tokens=max_tokens, stop=stop or ())
                final = renderer.render(events)
        if final.stop_reason == "interrupted":
            raise typer.Exit(int(ExitCode.INTERRUPTED))
