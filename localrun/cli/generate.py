"""`localrun generate`: parse, call the core, pick a renderer."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from localrun.cli import _history
from localrun.cli import _options as opt
from localrun.cli import tools as tools_cli
from localrun.cli._draft import Draft, DraftModel, Spec, draft_choice, open_draft
from localrun.cli._env import current
from localrun.cli._errors import ExitCode
from localrun.cli._output import out, pick_renderer
from localrun.cli._resolve import model_name
from localrun.errors import UsageError
from localrun.settings import Options, sampling_defaults

if TYPE_CHECKING:
    from localrun.assemble import OneSequence
    from localrun.events import Stats
    from localrun.remote.config import Remote
    from localrun.runtime.sampling import SamplingParams
    from localrun.structured.spec import OutputSpec


def read_prompt(argument: str | None) -> tuple[str | None, str | None]:
    """(instruction, material): PROMPT from the argument, or stdin when it is
    `-` or stdin is piped; with both, the argument is the instruction and stdin
    the material."""
    from localrun.cli._input import checked, read_stdin, stdin_is_piped
    from localrun.runtime.prompt import compose

    env = current()
    if argument == "-":
        if env.stdin_isatty:  # not a pipe: the user types the prompt
            out().note("reading the prompt from the terminal: end it with Ctrl-D on a line of its own")
        return None, read_stdin()
    if argument is not None:
        argument = checked(argument, "the prompt argument")
    material = None if env.stdin is None or env.stdin_isatty else read_stdin()
    if argument is not None and material is not None and not material.strip() and stdin_is_piped():
        # `cat missing.txt | localrun generate "Summarize"`: the instruction alone would get an answer about nothing
        raise UsageError(
            "stdin is empty: the text piped in for this prompt has none",
            hint="check the command before the pipe; to send the prompt alone, do not pipe anything",
        )
    compose(argument, material)  # an empty prompt fails here, before a model loads
    return argument, material


def one_prompt(argument: str | None, option: str | None, file: Path | None) -> str | None:
    """The prompt given as PROMPT, `-p TEXT` or `-f FILE` (llama.cpp's
    spellings): at most one of them."""
    from localrun.cli._input import checked
    from localrun.paths import why_failed

    given = [name for name, value in (("PROMPT", argument), ("-p", option), ("-f", file)) if value is not None]
    if len(given) > 1:
        raise UsageError(f"{' and '.join(given)} both give the prompt", hint="give it once")
    if file is None:
        return option if option is not None else argument
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise UsageError(f"-f {file}: {why_failed(exc)}") from None
    return checked(raw.decode("utf-8", errors="surrogateescape"), f"-f {file}")


def refuse_stats_with_json(stats: bool, as_json: bool) -> None:
    """`--stats` with `--json`: an error, never silently ignored."""
    if stats and as_json:
        raise UsageError("--stats and --json both report the figures", hint="drop --stats: the done event has them")


def _local_batch(
    batch: str,
    settled: opt.Settled,
    instruction: str | None,
    raw: bool,
    sampling: SamplingParams,
    max_tokens: int | None,
    stops: tuple[str, ...],
    output: OutputSpec | None,
    unordered: bool,
    resume: Path | None,
    stats: bool,
    no_log: bool,
    verbose: bool,
) -> ExitCode:
    """`--batch` on this machine: the batch's settings from the settled run."""
    from localrun.cli import batch as batch_cli
    from localrun.runtime.batch.plan import BatchSettings

    settings = BatchSettings(
        instruction=instruction,
        system=settled.settings.system,
        raw=raw,
        sampling=sampling,
        max_tokens=max_tokens,
        stop=stops,
        output=output,
    )
    return batch_cli.run(
        batch,
        settings,
        settled,
        verbose=verbose,
        unordered=unordered,
        resume=resume,
        show_stats=stats,
        output=output,
        no_log=no_log,
    )


def _refuse_with_batch(speculation: str | None, prompt_cache: bool | None, as_json: bool) -> None:
    """Flags `--batch` cannot honour: an error, never silently ignored."""
    if speculation is not None and speculation != "none":
        raise UsageError("--batch does not decode speculatively", hint="drop --spec, --draft and --draft-model")
    if prompt_cache:
        raise UsageError(
            "--batch does not use the prompt cache", hint="drop --prompt-cache: a shared prefix is evaluated once"
        )
    if as_json:
        raise UsageError("--batch always writes JSON lines", hint="drop --json")


def _on_remote(
    remote: Remote,
    prompt: str | None,
    batch: str | None,
    system: str | None,
    raw: bool,
    sampling: SamplingParams,
    max_tokens: int | None,
    stops: tuple[str, ...],
    output: OutputSpec | None,
    as_json: bool,
    stats: bool,
    parallel: int | None,
    unordered: bool,
    resume: Path | None,
    no_log: bool = False,
) -> ExitCode:
    from localrun.cli import _remote
    from localrun.runtime.batch.plan import BatchSettings
    from localrun.runtime.prompt import compose

    if batch is not None:
        if as_json:
            raise UsageError("--batch always writes JSON lines", hint="drop --json")
        settings = BatchSettings(
            instruction=prompt,
            system=system,
            raw=raw,
            sampling=sampling,
            max_tokens=max_tokens,
            stop=stops,
            output=output,
        )
        return _remote.batch(
            remote,
            batch,
            settings,
            parallel=parallel,
            unordered=unordered,
            resume=resume,
            show_stats=stats,
            no_log=no_log,
        )
    if parallel is not None or unordered or resume is not None:
        raise UsageError("--parallel, --unordered and --resume apply to --batch only", hint="add --batch FILE")
    instruction, material = read_prompt(prompt)
    return _remote.generate(
        remote,
        compose(instruction, material),
        system=system,
        raw=raw,
        sampling=sampling,
        max_tokens=max_tokens,
        stop=stops,
        output=output,
        as_json=as_json,
        show_stats=stats,
        no_log=no_log,
    )


def generate(
    prompt: Annotated[
        str | None, typer.Argument(help="The prompt; '-' or a pipe reads stdin.", show_default=False)
    ] = None,
    model: opt.Model = None,
    remote_url: opt.RemoteUrl = None,
    offline: opt.Offline = False,
    max_tokens: opt.MaxTokens = None,
    temperature: opt.Temperature = None,
    top_p: opt.TopP = 0.95,
    top_k: opt.TopK = 40,
    min_p: opt.MinP = 0.05,
    repeat_penalty: opt.RepeatPenalty = 1.0,
    seed: opt.Seed = None,
    stop: Annotated[list[str] | None, typer.Option("--stop", help="Stop at this text (repeatable).")] = None,
    system: opt.System = None,
    prompt_option: Annotated[
        str | None, typer.Option("--prompt", "-p", help="The prompt, in place of PROMPT.", show_default=False)
    ] = None,
    prompt_file: Annotated[
        Path | None, typer.Option("--file", "-f", help="Read the prompt from this file.", show_default=False)
    ] = None,
    ctx: opt.CtxOrC = None,
    threads: opt.Threads = None,
    gpu_layers: opt.GpuLayers = None,
    device: opt.Device = None,
    rpc: opt.Rpc = None,
    sample_on: opt.SampleOn = None,
    kv: opt.Kv = None,
    kv_k: opt.KvK = None,
    kv_v: opt.KvV = None,
    flash_attn: opt.FlashAttn = None,
    spec: Spec = None,
    draft: Draft = False,
    draft_model: DraftModel = None,
    raw: Annotated[bool, typer.Option("--raw", help="Send the prompt as is, without the chat template.")] = False,
    template: opt.Template = None,
    prompt_cache: Annotated[
        bool | None,
        typer.Option(
            "--prompt-cache/--no-prompt-cache",
            help="Keep the prompt's KV state on disk for the next run with the same start "
            "(default: when the system prompt or piped material is long).",
            show_default=False,
        ),
    ] = None,
    schema: opt.Schema = None,
    grammar: opt.GrammarFile = None,
    as_json: opt.Json = False,
    stats: Annotated[bool, typer.Option("--stats", help="A one-line summary on stderr.")] = False,
    think: opt.Think = "auto",
    reasoning_budget: opt.ReasoningBudget = None,
    verbose: opt.Verbose = False,
    no_log: _history.NoLog = False,
    batch: Annotated[
        str | None,
        typer.Option(
            "--batch",
            help="Many prompts: a file (or - for stdin) of lines, JSONL or OpenAI Batch JSONL; "
            "results as JSONL in the same format.",
        ),
    ] = None,
    parallel: Annotated[
        int | None,
        typer.Option(
            "--parallel", help="--batch: sequences decoded together (default: what fits; on a remote, 32 requests)."
        ),
    ] = None,
    unordered: Annotated[bool, typer.Option("--unordered", help="--batch: write results as they finish.")] = False,
    resume: Annotated[
        Path | None, typer.Option("--resume", help="--batch: skip the ids already in this file; append to it.")
    ] = None,
    mcp: tools_cli.Mcp = None,
    no_mcp: tools_cli.NoMcp = False,
    allow_tool: tools_cli.AllowTool = None,
    max_tool_steps: tools_cli.MaxToolSteps = 8,
    tool_timeout: tools_cli.ToolTimeout = 60.0,
    tool_choice: tools_cli.ToolChoice = "auto",
) -> ExitCode:
    """Generate text from a prompt, streamed as it is produced."""
    prompt = one_prompt(prompt, prompt_option, prompt_file)
    opt.check_positive(max_tokens=max_tokens, parallel=parallel)
    refuse_stats_with_json(stats, as_json)
    temperature, max_tokens = sampling_defaults(asked := temperature, max_tokens, current().config)
    sampling = opt.sampling_params(temperature, top_k, top_p, min_p, repeat_penalty, seed)
    stops = opt.check_stops(stop)
    speculation = draft_choice(spec, draft, draft_model)
    output = opt.structured_output(schema, grammar)
    options = Options(
        ctx=ctx,
        kv=kv,
        kv_k=kv_k,
        kv_v=kv_v,
        flash_attn=flash_attn,
        threads=threads,
        gpu_layers=gpu_layers,
        device=device,
        sample_on=sample_on,
        system=system,
        draft=speculation,
        parallel=parallel,
        template=opt.template_unless_raw(template, raw),
    )
    from localrun.cli import _remote

    remote = _remote.find(model if remote_url else model_name(model), remote_url)
    opt.refuse_thinking(think, reasoning_budget, remote is not None or batch is not None)
    if (
        tooling := tools_cli.generate_options(
            mcp,
            no_mcp,
            allow_tool,
            max_tool_steps,
            tool_timeout,
            tool_choice,
            remote,
            batch,
            raw,
            output,
            prompt_cache,
            stops,
        )
    ) is not None:  # the model may call tools: localrun/cli/tools.py
        return _with_tools(prompt, model, options, rpc, tooling, (parallel, unordered, resume), offline=offline,
                           verbose=verbose, draft=draft, sampling=tools_cli.tool_sampling(sampling, asked),
                           max_tokens=max_tokens, stops=stops,
                           as_json=as_json, stats=stats, think=think, reasoning_budget=reasoning_budget,
                           no_log=no_log)  # fmt: skip
    if remote is not None:  # a remote server: localrun/cli/_remote.py
        _remote.refuse_local_options(options, offline=offline, prompt_cache=prompt_cache, grammar=grammar)
        return _on_remote(
            remote,
            prompt,
            batch,
            system if system is not None else current().config.system,
            raw,
            sampling,
            max_tokens,
            stops,
            output,
            as_json,
            stats,
            parallel,
            unordered,
            resume,
            no_log,
        )
    opt.use_rpc(rpc)
    if batch is not None:  # many prompts: localrun/cli/batch.py
        _refuse_with_batch(speculation, prompt_cache, as_json)
        settled = opt.settle(model, options, offline=offline, with_draft=False)
        return _local_batch(
            batch, settled, prompt, raw, sampling, max_tokens, stops, output, unordered, resume, stats, no_log, verbose
        )
    _refuse_batch_options(parallel, unordered, resume)

    from localrun.cli._signals import ctrl_c_stops, no_echo, terminal
    from localrun.runtime.generate import PLAIN, Decoding, finished
    from localrun.runtime.prompt import build_prompt, compose
    from localrun.runtime.promptcache import checkpoint_for
    from localrun.structured.constraint import Constraint

    instruction, material = read_prompt(prompt)
    workload = _one_sequence((instruction, material, system), max_tokens, constrained=output is not None)
    resolved = opt.resolve_engine(model, options, offline=offline, verbose=verbose, pull_draft=draft, workload=workload)
    opt.warn_past_training(resolved)
    opt.say_template(resolved, raw=raw)
    thinking = opt.thinking(think, reasoning_budget, None if raw else resolved.info.chat_template, opt.title(resolved))
    with opt.load(resolved) as engine:
        built = build_prompt(
            engine, instruction, material, system=resolved.settings.system, raw=raw, switches=thinking.switches
        )
        checkpoint = checkpoint_for(built, engine, prompt_cache)
        renderer = pick_renderer(as_json, stats, opt.title(resolved), resolved.report(), show_thinking=thinking.show)
        recorder = _history.recorder(
            _history.context("generate", resolved, output=output, engine=engine), no_log=no_log
        )
        drafting = open_draft(resolved, engine)
        with ctrl_c_stops(engine), no_echo(terminal()), drafting as speculative:
            decoding: Decoding = speculative or PLAIN
            constraint = Constraint(engine, output) if output is not None else None
            events = decoding.generate(
                engine,
                built.tokens,
                sampling,
                max_tokens=max_tokens,
                stop=stops,
                checkpoint=checkpoint,
                constraint=constraint,
                reasoning=thinking.reasoning(built.text),
            )
            with finished(events):
                final = renderer.render(recorder.watch(events, compose(instruction, material)))
        recorder.flush(_history.exit_status(final))  # after the text is shown
        for warning in checkpoint.warnings if checkpoint else ():
            out().warn(warning)
        if final.stop_reason == "length" and (max_tokens is None or final.generated_tokens < max_tokens):
            out().note(f"note: the context of {engine.n_ctx} tokens is full; --ctx N gives a longer one")
    if draft_model is not None and final.draft is not None and not final.draft.proposed:
        out().note(f"note: {draft_model} drafted nothing: plain decoding measured faster at every step")
    return _exit_code(final, output, as_json)


def _with_tools(
    prompt: str | None,
    model: str | None,
    options: Options,
    rpc: str | None,
    tooling: tools_cli.ToolOptions,
    for_batch: tuple[int | None, bool, Path | None],
    *,
    offline: bool,
    verbose: bool,
    draft: bool,
    sampling: SamplingParams,
    max_tokens: int | None,
    stops: tuple[str, ...],
    as_json: bool,
    stats: bool,
    think: str,
    reasoning_budget: int | None,
    no_log: bool,
) -> ExitCode:
    """`generate` with MCP tools: the prompt, the model, then one turn of a chat with its tool loop."""
    _refuse_batch_options(*for_batch)
    opt.use_rpc(rpc)
    instruction, material = read_prompt(prompt)
    workload = _one_sequence((instruction, material, options.system, tools_cli.ROOM), max_tokens, constrained=True)
    resolved = opt.resolve_engine(model, options, offline=offline, verbose=verbose, pull_draft=draft, workload=workload)
    opt.warn_past_training(resolved)
    return tools_cli.generate(resolved, instruction, material, tooling, sampling=sampling,
                              max_tokens=max_tokens, stops=stops, as_json_out=as_json, stats=stats, think=think,
                              reasoning_budget=reasoning_budget, no_log=no_log)  # fmt: skip


def _one_sequence(texts: tuple[str | None, ...], max_tokens: int | None, *, constrained: bool) -> OneSequence:
    """The run's workload: one sequence, its context need guessed from the prompt's length."""
    from localrun.assemble import OneSequence
    from localrun.runtime.placement import prompt_estimate, run_extent

    chars = sum(len(text) for text in texts if text)
    need, depth = run_extent(chars, max_tokens)
    return OneSequence(
        need=need, depth=depth, constrained=constrained, prompt=prompt_estimate(chars), answer=max_tokens
    )


def _refuse_batch_options(parallel: int | None, unordered: bool, resume: Path | None) -> None:
    if parallel is not None or unordered or resume is not None:
        raise UsageError("--parallel, --unordered and --resume apply to --batch only", hint="add --batch FILE")


def _exit_code(final: Stats, output: OutputSpec | None, as_json: bool) -> ExitCode:
    """What the run's end means: Ctrl-C is 130, a text that breaks its schema 9."""
    if final.stop_reason == "interrupted":
        if as_json:  # the text renderers say it in their stats line; JSON says it on stdout only
            out().note("interrupted")
        return ExitCode.INTERRUPTED
    if final.valid is False:
        cut = " (--max-tokens cut it short)" if final.stop_reason == "length" else ""
        out().warn(f"the output does not follow {output.source if output else 'the grammar'}{cut}: {final.invalid}")
        return ExitCode.INVALID_OUTPUT
    return ExitCode.OK
