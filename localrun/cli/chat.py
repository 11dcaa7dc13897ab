"""`localrun chat`: an interactive session on a terminal, a scripted one in a pipe.

On a terminal: line editing and a persistent history (readline), `\"\"\"` blocks
for multi-line messages, slash commands, replies streamed in the live panel
and shown as Markdown when complete. Ctrl-C stops a reply, or clears the line
at the prompt; Ctrl-D or /exit ends the session.

In a pipe: each stdin line is a user turn (plain text, or JSONL
{"role": "user", "content": ...}); each reply goes to stdout, or JSON events
with `--json`.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from localrun.cli import _history
from localrun.cli import _options as opt
from localrun.cli import tools as tools_cli
from localrun.cli._draft import Draft, DraftModel, Spec, draft_choice, open_draft
from localrun.cli._env import current
from localrun.cli._errors import ExitCode
from localrun.cli._input import read_turns
from localrun.cli._output import out
from localrun.cli._resolve import model_name
from localrun.cli.generate import refuse_stats_with_json
from localrun.errors import UsageError
from localrun.settings import Options, RunSettings, sampling_defaults

if TYPE_CHECKING:
    from localrun.history.record import Recorder
    from localrun.mcp.loop import ToolLoop
    from localrun.runtime.chat import ChatSession, Conversation
    from localrun.runtime.placement import Placement
    from localrun.ui.stream import Renderer


def chat(
    model: opt.Model = None,
    remote_url: opt.RemoteUrl = None,
    offline: opt.Offline = False,
    system: opt.System = None,
    load: Annotated[
        Path | None, typer.Option("--load", help="Continue a conversation saved with /save.", show_default=False)
    ] = None,
    continue_last: Annotated[
        bool, typer.Option("--continue", "-c", help="Continue the last conversation in the run history.")
    ] = False,
    template: opt.Template = None,
    max_tokens: opt.MaxTokens = None,
    temperature: opt.Temperature = None,
    top_p: opt.TopP = 0.95,
    top_k: opt.TopK = 40,
    min_p: opt.MinP = 0.05,
    repeat_penalty: opt.RepeatPenalty = 1.0,
    seed: opt.Seed = None,
    ctx: opt.Ctx = None,
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
    schema: opt.Schema = None,
    grammar: opt.GrammarFile = None,
    as_json: opt.Json = False,
    stats: Annotated[bool, typer.Option("--stats", help="In a pipe: a summary per turn on stderr.")] = False,
    think: opt.Think = "auto",
    reasoning_budget: opt.ReasoningBudget = None,
    markdown: Annotated[
        bool | None,
        typer.Option(
            "--markdown/--no-markdown",
            help="On a terminal: show replies as Markdown, or as the model wrote them. Default: on "
            "(config.toml: markdown).",
            show_default=False,
        ),
    ] = None,
    verbose: opt.Verbose = False,
    no_log: _history.NoLog = False,
    mcp: tools_cli.Mcp = None,
    no_mcp: tools_cli.NoMcp = False,
    allow_tool: tools_cli.AllowTool = None,
    max_tool_steps: tools_cli.MaxToolSteps = 8,
    tool_timeout: tools_cli.ToolTimeout = 60.0,
    tool_choice: tools_cli.ToolChoice = "auto",
) -> ExitCode:
    """Chat with a model: interactive on a terminal, one turn per line in a pipe."""
    from rich.console import Console

    from localrun.cli._switch import ModelSwitch
    from localrun.cli.repl import Repl
    from localrun.runtime.chat import read_conversation

    opt.check_positive(max_tokens=max_tokens)
    refuse_stats_with_json(stats, as_json)
    temperature, max_tokens = sampling_defaults(asked := temperature, max_tokens, current().config)
    sampling = opt.sampling_params(temperature, top_k, top_p, min_p, repeat_penalty, seed)
    drafting = draft_choice(spec, draft, draft_model)
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
        draft=drafting,
        template=template,
    )
    from localrun.cli import _remote

    continuing = load is not None or continue_last  # on the conversation's model unless -m is given
    remote = _remote.find(model if remote_url or continuing else model_name(model), remote_url)
    tooling = tools_cli.chat_options(
        mcp, no_mcp, allow_tool, max_tool_steps, tool_timeout, tool_choice, remote, output, asked
    )
    if remote is not None:  # a remote server: localrun/cli/_remote.py
        opt.refuse_thinking(think, reasoning_budget, True)
        _remote.refuse_local_options(options, offline=offline, load=load, grammar=grammar)
        return _remote.chat(
            remote,
            system=system if system is not None else current().config.system,
            sampling=sampling,
            max_tokens=max_tokens,
            output=output,
            as_json=as_json,
            show_stats=stats,
            no_log=no_log,
            markdown=_markdown(markdown),
        )
    if load is not None and continue_last:
        raise UsageError("--load and --continue both name the conversation", hint="give one of them")
    saved = read_conversation(load) if load else None
    resumed = _history.last_conversation() if continue_last else None
    if resumed is not None:
        saved = resumed[1]
    opt.use_rpc(rpc)
    resolved = _resolve(
        model, saved, options, offline=offline, verbose=verbose, pull_draft=draft, constrained=output is not None
    )
    opt.warn_past_training(resolved)
    opt.say_template(resolved, refused=True)
    own = resolved.info.chat_template  # --template's, where it was given (the plan carries it)
    thinking = opt.thinking(think, reasoning_budget, own, opt.title(resolved))
    env = current()
    # the MCP servers, for the whole command; the model and its drafter, which /model NAME puts another in place of
    with contextlib.ExitStack() as servers, contextlib.ExitStack() as loaded:
        host = tools_cli.started(servers, tooling)  # before the model: a tool choice no tool meets fails first
        engine = loaded.enter_context(opt.load(resolved))
        speculation = loaded.enter_context(open_draft(resolved, engine))
        session = opt.chat_session(
            resolved,
            engine,
            speculation,
            sampling,
            thinking,
            system=resolved.settings.system,
            max_tokens=max_tokens,
            output=output,
        )
        if saved is not None:
            session.system = system if system is not None else saved.system
            session.turns = saved.turns
        recorder = _history.recorder(_history.context("chat", resolved, output=output, engine=engine), no_log=no_log)
        if resumed is not None:
            recorder.resume(resumed[0], session.turns)
        interactive = env.stdin_isatty and env.stdout_isatty and not as_json
        if interactive:
            console = Console(file=env.stdout, highlight=False)
            repl = Repl(
                session,
                console,
                title=opt.title(resolved),
                recorder=recorder,
                markdown=_markdown(markdown),
                report=lambda: turn_report(resolved.settings, resolved.config.placement, session),
                switch=ModelSwitch(
                    resolved,
                    loaded,
                    options,
                    resolve=lambda name, options, constrained: _resolve(
                        name, None, options, offline=offline, verbose=verbose, constrained=constrained
                    ),
                    report=turn_report,
                    think=think,
                    reasoning_budget=reasoning_budget,
                    recorder=recorder,
                ),
                tools=tools_cli.attach(host, tooling, session, console),
            )
            return repl.run()
        report = turn_report(resolved.settings, resolved.config.placement, session)  # a pipe keeps its loop
        return run_piped(session, as_json, stats, report, recorder, tools_cli.attach(host, tooling, session, None))


def turn_report(settings: RunSettings, placement: Placement, session: ChatSession) -> dict[str, Any]:
    """The settings a turn's record and `--json` show: where it samples
    settled against the loop the turn runs, as /draft and /schema leave it
    (speculation or a grammar samples on the host, whatever the plan said
    for plain decoding)."""
    from localrun.assemble import OneSequence, report, sample_on
    from localrun.runtime.generate import PLAIN

    loop = OneSequence(speculative=session.decoding is not PLAIN, constrained=session.output is not None)
    return report(sample_on(settings, placement, loop), placement)


def _markdown(option: bool | None) -> bool:
    """Replies as Markdown: the option, else config.toml's `markdown`, else on."""
    return option if option is not None else current().config.markdown is not False


def _resolve(
    model: str | None,
    saved: Conversation | None,
    options: Options,
    *,
    offline: bool,
    verbose: bool,
    pull_draft: bool = False,
    constrained: bool = False,
) -> opt.PlannedRun:
    """The model named, else the conversation's (as `llm -c` does), else the default."""
    from localrun.assemble import OneSequence
    from localrun.errors import ModelNotFoundError
    from localrun.runtime.placement import conversation_depth
    from localrun.settings import parse_ctx

    depth = conversation_depth(parse_ctx(options.ctx) if options.ctx else None)
    workload = OneSequence(depth=depth, constrained=constrained)
    named = model is not None or saved is None or saved.model is None
    try:
        return opt.resolve_engine(
            model if named else saved.model if saved is not None else None,
            options,
            offline=offline,
            verbose=verbose,
            pull_draft=pull_draft,
            workload=workload,
            grows=True,
        )
    except ModelNotFoundError as exc:
        if not named:  # moved or removed since: say where the name came from
            exc.hint = "it is the conversation's model; to go on with another, name it with -m"
        raise


# ------------------------------------------------------------------- pipe --


def run_piped(
    session: ChatSession,
    as_json: bool,
    show_stats: bool,
    settings: dict[str, object] | None = None,
    recorder: Recorder | None = None,
    tools: ToolLoop | None = None,
) -> ExitCode:
    from localrun.cli._signals import ctrl_c_stops
    from localrun.runtime.generate import finished
    from localrun.ui.stream import JsonRenderer, PlainRenderer
    from localrun.ui.text import oldest_turns

    env = current()
    first = len(session.turns) + 1
    for turn, read in enumerate(read_turns(iter(env.stdin)), first):
        if tools is None:
            read.without_tools()
        else:
            tools.offer(read.tool_choice, where=f"stdin line {read.number}")
        plan = session.plan(read.text)
        if plan.dropped:
            out().note(f"note: dropped {oldest_turns(plan.dropped)} to fit the context")
        if turn > first and not as_json:
            env.stdout.write("\n")  # a blank line between replies, where one reply's lines would run into the next's
        renderer: Renderer = (
            JsonRenderer(env.stdout, extra={"turn": turn}, settings=settings)
            if as_json
            else PlainRenderer(env.stdout, env.stderr, show_stats=show_stats, show_thinking=session.think == "show")
        )
        with ctrl_c_stops(session.engine), finished(tools_cli.reply(session, plan, tools)) as replies:
            watched = recorder.watch_turn(session.turns, replies, system=session.system) if recorder else replies
            final = renderer.render(tools_cli.piped(watched, as_json, env.stdout, {"turn": turn}, tools, recorder))
        if recorder is not None:
            recorder.flush(_history.exit_status(final))  # after the reply is shown
        if final.stop_reason == "interrupted":
            if as_json:  # the plain renderer says it in its stats line
                out().note("interrupted")
            return ExitCode.INTERRUPTED
    return ExitCode.OK
