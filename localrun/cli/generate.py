"""`localrun generate`: parse, call the core, pick a renderer."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer
from rich.console import Console

from localrun.cli import _options as opt
from localrun.cli._draft import Draft, open_draft
from localrun.cli._errors import ExitCode, error_boundary
from localrun.config import load as load_config
from localrun.runtime.decode import generate as run_generation
from localrun.runtime.engine import Engine
from localrun.errors import UsageError
from localrun.runtime.prompt import build_prompt, compose
from localrun.runtime.promptcache import checkpoint_for
from localrun.ui.stream import JsonRenderer, LiveRenderer, PlainRenderer, Renderer


def read_prompt(argument: str | None) -> tuple[str | None, str | None]:
    """(instruction, material): PROMPT from the argument, or stdin when it is
    `-` or stdin is piped; with both, the argument is the instruction and stdin
    the material."""
    if argument == "-":
        return None, sys.stdin.read()
    material = None if sys.stdin is None or sys.stdin.isatty() else sys.stdin.read()
    compose(argument, material)  # an empty prompt fails here, before a model loads
    return argument, material


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
    model: opt.Model = None,
    offline: opt.Offline = False,
    max_tokens: opt.MaxTokens = None,
    temperature: opt.Temperature = 0.8,
    top_p: opt.TopP = 0.95,
    top_k: opt.TopK = 40,
    min_p: opt.MinP = 0.05,
    repeat_penalty: opt.RepeatPenalty = 1.0,
    seed: opt.Seed = None,
    stop: Annotated[list[str] | None, typer.Option("--stop", help="Stop at this text (repeatable).")] = None,
    system: opt.System = None,
    ctx: opt.Ctx = None,
    threads: opt.Threads = None,
    kv: opt.Kv = None,
    kv_k: opt.KvK = None,
    kv_v: opt.KvV = None,
    flash_attn: opt.FlashAttn = None,
    draft: Draft = None,
    raw: Annotated[bool, typer.Option("--raw", help="Send the prompt as is, without the chat template.")] = False,
    prompt_cache: Annotated[
        bool | None,
        typer.Option(
            "--prompt-cache/--no-prompt-cache",
            help="Keep the prompt's KV state on disk for the next run with the same start "
            "(default: when the system prompt or piped material is long).",
            show_default=False,
        ),
    ] = None,
    as_json: opt.Json = False,
    stats: Annotated[bool, typer.Option("--stats", help="A one-line summary on stderr.")] = False,
    verbose: opt.Verbose = False,
    debug: opt.Debug = False,
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
        sampling = opt.sampling_params(temperature, top_k, top_p, min_p, repeat_penalty, seed)
        choice = opt.EngineChoice(model, offline, ctx, threads, kv, kv_k, kv_v, flash_attn, verbose)
        if batch is not None:  # many prompts: localrun/cli/batch.py
            from localrun.cli import batch as batch_cli

            resolved = opt.resolve_engine(choice, system=system)
            settings = batch_cli.BatchSettings(
                source=batch,
                instruction=prompt,
                system=resolved.system,
                raw=raw,
                sampling=sampling,
                max_tokens=max_tokens,
                stop=tuple(stop or ()),
                seq_ctx=opt.parse_ctx(ctx) if ctx is not None else None,
                parallel=parallel if parallel is not None else load_config().parallel,
                unordered=unordered,
                resume=resume,
                show_stats=stats,
            )
            raise typer.Exit(batch_cli.run(settings, replace(resolved.config, n_ctx=None), resolved.info))
        instruction, material = read_prompt(prompt)
        opened = opt.open_engine(choice, system=system)
        with opened.engine as engine:
            built = build_prompt(engine, instruction, material, system=opened.system, raw=raw)
            checkpoint = checkpoint_for(built, engine, prompt_cache)
            renderer = pick_renderer(as_json, stats, engine.info.name)
            with ctrl_c_stops(engine), open_draft(draft, engine, opened.target, offline=offline) as speculation:
                run = speculation.generate if speculation else run_generation
                events = run(
                    engine, built.tokens, sampling, max_tokens=max_tokens, stop=stop or (), checkpoint=checkpoint
                )
                final = renderer.render(events)
            for warning in checkpoint.warnings if checkpoint else ():
                sys.stderr.write(f"warning: {warning}\n")
        if final.stop_reason == "interrupted":
            raise typer.Exit(int(ExitCode.INTERRUPTED))
