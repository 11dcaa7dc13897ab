"""MCP tools in `chat` and `generate` (docs/tools.md): the options, the
servers opened for a command and closed after it, the approval prompt on a
terminal, the tool loop's events shown by each renderer, and `localrun tools`,
which lists the tools the servers offer."""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TextIO, cast

import typer

from localrun.cli._env import current
from localrun.cli._errors import ExitCode
from localrun.cli._output import out
from localrun.errors import UsageError
from localrun.mcp.loop import asks_for_a_call

if TYPE_CHECKING:
    from rich.console import Console

    from localrun.cli._options import PlannedRun
    from localrun.events import Event, Stats, ToolEvent
    from localrun.history.record import Recorder
    from localrun.mcp.host import Tool, ToolHost
    from localrun.mcp.loop import Answer, ToolLoop
    from localrun.mcp.servers import ServerList
    from localrun.runtime.chat import ChatSession, TurnPlan
    from localrun.runtime.sampling import SamplingParams
    from localrun.ui.stream import Renderer

Mcp = Annotated[
    list[Path] | None,
    typer.Option(
        "--mcp",
        help="MCP servers whose tools the model may call: an mcpServers JSON file, as Claude Desktop "
        "and Cursor read (repeatable; config.toml's [mcp.servers] are used too). See docs/tools.md.",
        metavar="FILE",
        show_default=False,
    ),
]
NoMcp = Annotated[bool, typer.Option("--no-mcp", help="Start no MCP server, not even config.toml's.")]
AllowTool = Annotated[
    list[str] | None,
    typer.Option(
        "--allow-tool",
        help="Run this tool's calls without asking (SERVER_TOOL, a server's name for all its tools, or all). "
        "In a pipe, only these run (repeatable).",
        metavar="NAME",
        show_default=False,
    ),
]
MaxToolSteps = Annotated[
    int, typer.Option("--max-tool-steps", help="Rounds of tool calls in one reply before the model must answer.")
]
ToolChoice = Annotated[
    str,
    typer.Option(
        "--tool-choice",
        help="How each turn is offered the tools: auto (the model decides), required (it must call one), "
        "a tool's name (it must call that one), or none.",
        metavar="CHOICE",
    ),
]
ToolTimeout = Annotated[
    float, typer.Option("--tool-timeout", help="Seconds a tool call may take; then the model is told it timed out.")
]


@dataclass(frozen=True)
class ToolOptions:
    files: list[Path]
    no_mcp: bool = False
    allow: tuple[str, ...] = ()
    max_steps: int = 8
    timeout: float = 60.0
    choice: str = "auto"  # each turn's tool choice (a tool's name is checked once the servers list their tools)
    servers: ServerList | None = None  # the servers the run uses (`_used`)
    temperature: float | None = None  # chat: the temperature its turns sample at, where nobody chose one


def tool_options(
    mcp: list[Path] | None,
    no_mcp: bool,
    allow: list[str] | None,
    max_steps: int,
    timeout: float,
    choice: str = "auto",
) -> ToolOptions:
    """The tool options, checked."""
    if not choice:
        raise UsageError("--tool-choice is empty", hint="auto, required, none or a tool's name")
    if max_steps < 1:
        raise UsageError("--max-tool-steps must be at least 1")
    if not timeout > 0:
        raise UsageError("--tool-timeout must be more than 0 seconds")
    if no_mcp and mcp:
        raise UsageError("--mcp and --no-mcp both given", hint="drop one")
    return ToolOptions(list(mcp or []), no_mcp, tuple(allow or ()), max_steps, timeout, choice)


def server_list(options: ToolOptions) -> ServerList | None:
    """The servers a command uses (its --mcp files, then config.toml's), None when there are none."""
    from localrun.config import config_file
    from localrun.mcp.servers import server_list as listed

    if options.no_mcp:
        return None
    configured = current().config.mcp_servers
    if not options.files and not configured:
        return None
    return listed(options.files, configured, str(config_file()))


# With tools, the temperature when neither --temperature nor config.toml gives
# one: at llama.cpp's 0.8 small models often decline to call, or write a call
# as their answer (docs/benchmarks.md, "Tools in the terminal"); at 0.2 the
# 1.5B still declines now and then ("I cannot assist with that") where greedy
# calls (a dev set of ten questions: 8/10 at 0.2, 10/10 greedy).
TOOL_TEMPERATURE = 0.0


def _unchosen(asked: float | None) -> float | None:
    """TOOL_TEMPERATURE where nobody chose a temperature, else None."""
    return TOOL_TEMPERATURE if asked is None and current().config.temperature is None else None


def tool_sampling(sampling: SamplingParams, asked: float | None) -> SamplingParams:
    """The sampling of a run with tools: TOOL_TEMPERATURE where nobody chose a temperature."""
    temperature = _unchosen(asked)
    return sampling if temperature is None else replace(sampling, temperature=temperature)


ROOM = "." * 12_000  # the prompt's share of tool declarations and results, for the context's estimate


def generate_options(
    mcp: list[Path] | None,
    no_mcp: bool,
    allow: list[str] | None,
    max_steps: int,
    timeout: float,
    choice: str,
    remote: object,
    batch: object,
    raw: bool,
    output: object,
    prompt_cache: bool | None,
    stops: object = None,
) -> ToolOptions | None:
    """`generate`'s tool options and servers where it uses tools (`_used`)."""
    options = tool_options(mcp, no_mcp, allow, max_steps, timeout, choice)
    return _used(options, [("a remote model", remote is not None), ("--batch", batch is not None), ("--raw", raw),
                           ("--schema or --grammar", output is not None), ("--prompt-cache", bool(prompt_cache)),
                           ("--stop", bool(stops))])  # fmt: skip


def _used(options: ToolOptions, clashes: list[tuple[str, bool]]) -> ToolOptions | None:
    """``options`` with the servers the run uses (its --mcp files, then
    config.toml's); None where it uses none: there are none, or an option
    given in ``clashes`` (its name, whether given) rules tools out (with
    --mcp, an error; config.toml's servers are left out)."""
    clash = next((name for name, given in clashes if given), None)
    if clash is not None and options.files:
        raise UsageError(f"--mcp and {clash} cannot go together", hint=f"drop --mcp or {clash}")
    if clash is not None and asks_for_a_call(options.choice):
        raise UsageError(f"--tool-choice {options.choice} and {clash} cannot go together", hint="drop one of them")
    servers = server_list(options) if clash is None else None
    if servers is None:  # a run without tools: a tool choice that needs one is an error
        if asks_for_a_call(options.choice):
            raise UsageError(
                f"--tool-choice {options.choice} needs tools",
                hint="give --mcp FILE, or add [mcp.servers.NAME] to config.toml",
            )
        return None
    return replace(options, servers=servers)


def _offer_checked(host: ToolHost, options: ToolOptions) -> None:
    """The tool choice checked against the tools the started servers offer
    (a server that offers none said why): a choice that needs a tool where
    none is offered, or that names none of them, is an error."""
    from localrun.mcp.loop import checked_choice

    if host.tools:
        checked_choice(options.choice, host.tools)
    elif asks_for_a_call(options.choice):
        raise UsageError(
            f"--tool-choice {options.choice}: the MCP servers offer no tool", hint="`localrun tools` lists them"
        )


@contextlib.contextmanager
def opened(servers: ServerList) -> Iterator[ToolHost]:
    """The servers started (each one that cannot start, one warning line), stopped on the way out."""
    from localrun.mcp.host import ToolHost

    for problem in servers.problems:
        out().warn(problem)
    host = ToolHost(servers.servers)
    try:
        host.start()
        for problem in host.problems:
            out().warn(problem)
        yield host
    finally:
        host.close()


def approval(options: ToolOptions, host: ToolHost, ask: Callable[[Tool, dict[str, Any]], Answer] | None) -> Any:
    from localrun.mcp.loop import Approval, allowed_names

    preallowed = set()
    for spec in host.specs:
        for tool in host.tools:
            if tool.server == spec.name and (tool.tool in spec.allow or (spec.allow_read_only and tool.read_only)):
                preallowed.add(tool.name)
    allowed, unknown = allowed_names(list(options.allow), host.tools, preallowed)
    for name in unknown:
        out().warn(f"--allow-tool {name}: no tool or server has that name")
    return Approval(allowed, ask)


def tool_loop(
    session: ChatSession, host: ToolHost, options: ToolOptions, ask: Callable[[Tool, dict[str, Any]], Answer] | None
) -> ToolLoop:
    """The tool loop of a chat or a `generate` over ``host``'s tools, as ``options`` set it."""
    from localrun.mcp.loop import ToolLoop

    allowed = approval(options, host, ask)
    return ToolLoop(session, host, allowed, max_steps=options.max_steps, timeout=options.timeout, choice=options.choice)


def chat_options(
    mcp: list[Path] | None,
    no_mcp: bool,
    allow: list[str] | None,
    max_steps: int,
    timeout: float,
    choice: str,
    remote: object,
    output: object,
    asked_temperature: float | None,
) -> ToolOptions | None:
    """`chat`'s tool options and servers where it uses tools (`_used`): not
    with a remote model, nor with every reply held to a schema."""
    options = tool_options(mcp, no_mcp, allow, max_steps, timeout, choice)
    used = _used(options, [("a remote model", remote is not None), ("--schema or --grammar", output is not None)])
    return replace(used, temperature=_unchosen(asked_temperature)) if used is not None else None


def started(stack: contextlib.ExitStack[bool | None], options: ToolOptions | None) -> ToolHost | None:
    """The run's MCP servers started (and stopped with ``stack``), before its
    model loads: a tool choice that no offered tool can meet is an error
    before that wait. None where the run uses no tools, or no server offers one."""
    if options is None or options.servers is None:
        return None
    host = stack.enter_context(opened(options.servers))
    _offer_checked(host, options)
    if not host.tools:  # none to offer: their servers need not run
        stack.close()
        return None
    return host


def attach(
    host: ToolHost | None, options: ToolOptions | None, session: ChatSession, console: Console | None
) -> ToolLoop | None:
    """The chat's tool loop over ``host``'s tools (`started`); ``console``: a
    terminal to ask on before a call runs."""
    if host is None or options is None:
        return None
    bound: list[ToolLoop] = []

    def abort() -> None:  # the session the loop is bound to now (/model binds another)
        bound[0].session.engine.abort_requested = True

    ask = terminal_ask(console, abort) if console is not None else None
    if options.temperature is not None:
        session.sampling = replace(session.sampling, temperature=options.temperature)
    loop = tool_loop(session, host, options, ask)
    bound.append(loop)
    return loop


def reply(session: ChatSession, plan: TurnPlan, tools: ToolLoop | None) -> Iterator[Event]:
    """A chat turn's events: the reply, or with tools, the tool loop's (its own events pass through)."""
    return session.reply(plan) if tools is None else cast("Iterator[Event]", tools.turn(plan))


def piped(
    events: Iterable[Event],
    as_json_out: bool,
    stream: TextIO,
    extra: dict[str, Any],
    tools: ToolLoop | None,
    recorder: Recorder | None = None,
) -> Iterable[Event]:
    """A turn's events (as ``recorder`` passed them on) for a pipe's renderer: the answer only,
    or with --json the calls and results too."""
    if tools is None:
        return events
    mixed = record_calls(recorder, cast("Iterable[Event | ToolEvent]", events))
    return _then_problems(as_json(mixed, stream, extra) if as_json_out else plain(mixed), tools)


def _then_problems(events: Iterator[Event], loop: ToolLoop) -> Iterator[Event]:
    yield from events
    finish_turn(loop)


def terminal_turn(
    loop: ToolLoop, plan: TurnPlan, console: Console, *, title: str, markdown: bool, recorder: Recorder | None
) -> None:
    """A chat turn with tools on a terminal: each step in its panel, each call shown and asked about."""
    from localrun.cli._history import exit_status
    from localrun.cli._signals import ctrl_c_stops, no_echo
    from localrun.runtime.generate import finished
    from localrun.ui.stream import LiveRenderer

    session = loop.session
    with ctrl_c_stops(session.engine), no_echo(current().stdin), finished(reply(session, plan, loop)) as replies:
        events = watched(recorder, session, cast("Iterator[Event | ToolEvent]", replies))
        final = render_steps(events, lambda: LiveRenderer(console, title=title, markdown=markdown), show_on(console))
    if recorder is not None:
        recorder.flush(exit_status(final))
    finish_turn(loop)
    if final.stop_reason == "interrupted":
        console.print("reply interrupted; it stays in the conversation (/retry to redo it)", style="yellow")


def show_tools(loop: ToolLoop | None, console: Console) -> None:
    """/tools: the tools the model may call, and whether each runs without asking."""
    from localrun.ui.tools import tools_table

    if loop is None:
        console.print("no tools: start chat with --mcp FILE, or add [mcp.servers.NAME] to config.toml", style="dim")
        return
    console.print(tools_table(loop.tools, allowed=loop.approval.allowed))
    console.print(
        "each call is shown and asked about unless its tool is allowed (always, or --allow-tool); "
        f"tool choice: {loop.choice} (/tools auto|required|none|TOOL)",
        style="dim",
    )


def choose_tools(loop: ToolLoop | None, choice: str, console: Console) -> None:
    """/tools CHOICE: how the next turns are offered the tools (`--tool-choice`'s values)."""
    from localrun.mcp.loop import checked_choice

    if loop is None:
        show_tools(loop, console)
        return
    loop.choice = checked_choice(choice, loop.tools, "/tools")
    loop.offer()
    console.print(f"tool choice: {loop.choice}", style="dim")


# ---------------------------------------------------------- the terminal --


@contextlib.contextmanager
def _echoing(stream: TextIO | None) -> Iterator[None]:
    """Keys echo and Ctrl-C interrupts while the user answers (the turn turned both off)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    saved = None
    try:
        import termios

        fd = stream.fileno() if stream is not None else -1
        saved = termios.tcgetattr(fd)
        loud = list(saved)
        loud[3] |= termios.ECHO
        termios.tcsetattr(fd, termios.TCSANOW, loud)
    except Exception:  # no terminal: nothing to change
        saved = None
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if saved is not None:
            import termios

            with contextlib.suppress(Exception):
                termios.tcsetattr(fd, termios.TCSANOW, saved)


def terminal_ask(console: Console, abort: Callable[[], None]) -> Callable[[Tool, dict[str, Any]], Answer]:
    """The approval prompt, under the call just shown: yes, no, or always for this tool.
    Ctrl-C is no, and stops the reply."""

    from rich.markup import escape

    def ask(tool: Tool, arguments: dict[str, Any]) -> Answer:
        while True:
            try:
                with _echoing(current().stdin):
                    answer = console.input(f"[dim]run {escape(tool.name)}?[/dim] [bold]y[/bold]es / [bold]n[/bold]o / "
                                           "[bold]a[/bold]lways for this tool: ").strip().lower()  # fmt: skip
            except (KeyboardInterrupt, EOFError):
                console.print()
                abort()
                return "no"
            if answer in ("y", "yes"):
                return "yes"
            if answer in ("n", "no"):
                return "no"
            if answer in ("a", "always"):
                return "always"

    return ask


def render_steps(
    events: Iterable[Event | ToolEvent], renderer: Callable[[], Renderer], show: Callable[[Event | ToolEvent], None]
) -> Stats:
    """A terminal: each step of the reply in its own live panel; the calls and
    results shown between them, and the approval asked there, with no panel drawn."""
    steps = _Steps(iter(events), show)
    while True:
        final = renderer().render(steps.step())
        if not steps.more:
            return final
        steps.between()


class _Steps:
    """A tool loop's events cut into steps (each ends with a DoneEvent for its panel)."""

    def __init__(self, source: Iterator[Event | ToolEvent], show: Callable[[Event | ToolEvent], None]) -> None:
        self.source, self.show = source, show
        self.pending: list[Event] = []
        self.more = False  # the last step ended in calls: another follows

    def step(self) -> Iterator[Event]:
        from localrun.events import DoneEvent, ToolStepDone

        self.more = False
        yield from self.pending
        self.pending.clear()
        for event in self.source:
            if isinstance(event, ToolStepDone):
                self.more = True
                yield DoneEvent(event.stats)
                return
            if not self._shown(event):
                yield cast("Event", event)
                if isinstance(event, DoneEvent):
                    return

    def between(self) -> None:
        """The calls and their results, up to the next step's first event (kept for it)."""
        for event in self.source:
            if not self._shown(event):
                self.pending.append(cast("Event", event))
                return

    def _shown(self, event: Event | ToolEvent) -> bool:
        from localrun.events import ToolCallEvent, ToolResultEvent

        if isinstance(event, ToolCallEvent | ToolResultEvent):
            self.show(event)
            return True
        return False


# --------------------------------------------------------------- a pipe --


def plain(events: Iterable[Event | ToolEvent]) -> Iterator[Event]:
    """The answer only; a call refused for want of --allow-tool is said once per tool on stderr."""
    from localrun.events import ToolCallEvent, ToolResultEvent, ToolStepDone

    told: set[str] = set()
    for event in events:
        if isinstance(event, ToolResultEvent):
            if event.status == "refused" and event.name not in told:
                told.add(event.name)
                out().note(f"note: the model called {event.name}; in a pipe a tool runs only with --allow-tool")
            continue
        if isinstance(event, ToolCallEvent | ToolStepDone):
            continue
        yield event


def as_json(
    events: Iterable[Event | ToolEvent], stream: TextIO, extra: dict[str, Any] | None = None
) -> Iterator[Event]:
    """`--json`: each call and result as its own event line, between the text's."""
    from localrun.ui.tools import json_record

    for event in events:
        record = json_record(event, extra or {})
        if record is None:
            yield cast("Event", event)
        elif record:
            stream.write(record + "\n")
            stream.flush()


def record_calls(recorder: Recorder | None, events: Iterable[Event | ToolEvent]) -> Iterator[Event | ToolEvent]:
    """``events`` (as the recorder passed them on), passed through; the reply's calls added to
    its record in the run history: each call's tool, status, result size and time."""
    from localrun.events import DoneEvent, ToolResultEvent

    calls: list[dict[str, Any]] = []
    for event in events:
        if isinstance(event, ToolResultEvent):
            calls.append({"name": event.name, "status": event.status, "chars": len(event.text),
                          "seconds": round(event.seconds, 3)})  # fmt: skip
        elif isinstance(event, DoneEvent) and calls and recorder is not None and recorder.pending:
            recorder.pending[-1]["tool_calls"] = json.dumps(calls)  # the recorder made the row as the event passed
        yield event


def watched(
    recorder: Recorder | None, session: ChatSession, events: Iterator[Event | ToolEvent]
) -> Iterator[Event | ToolEvent]:
    """The run history's record of the turn (it reads the text and the figures; the rest passes through)."""
    if recorder is None:
        return events
    recorded = recorder.watch_turn(session.turns, cast("Iterator[Event]", events), system=session.system)
    return record_calls(recorder, cast("Iterator[Event | ToolEvent]", recorded))


def show_on(console: Console) -> Callable[[Event | ToolEvent], None]:
    from localrun.ui.tools import tool_block

    def show(event: Event | ToolEvent) -> None:
        block = tool_block(event)
        if block is not None:
            console.print(block)

    return show


def finish_turn(loop: ToolLoop) -> None:
    """What the model wrote as calls that could not be read or checked: said, once each."""
    for problem in loop.problems:
        out().warn(problem)
    loop.problems.clear()


# ------------------------------------------------------------ generate --


def generate(
    resolved: PlannedRun,
    instruction: str | None,
    material: str | None,
    options: ToolOptions,
    *,
    sampling: SamplingParams,
    max_tokens: int | None,
    stops: tuple[str, ...],
    as_json_out: bool,
    stats: bool,
    think: str,
    reasoning_budget: int | None,
    no_log: bool,
) -> ExitCode:
    """`generate` with tools: one turn of a chat, calls and all."""
    from rich.console import Console

    from localrun.cli import _history
    from localrun.cli import _options as opt
    from localrun.cli._draft import open_draft
    from localrun.cli._history import exit_status
    from localrun.cli._signals import ctrl_c_stops, no_echo, terminal
    from localrun.runtime.generate import finished
    from localrun.runtime.prompt import compose
    from localrun.ui.stream import JsonRenderer, LiveRenderer, PlainRenderer

    env = current()
    thinking = opt.thinking(think, reasoning_budget, resolved.info.chat_template, opt.title(resolved))
    with contextlib.ExitStack() as servers, contextlib.ExitStack() as stack:
        host = started(servers, options)  # before the model: a choice no tool meets fails first
        engine = stack.enter_context(opt.load(resolved))
        speculation = stack.enter_context(open_draft(resolved, engine))
        session = opt.chat_session(
            resolved,
            engine,
            speculation,
            sampling,
            thinking,
            system=resolved.settings.system,
            max_tokens=max_tokens,
        )
        interactive = env.stdin_isatty and env.stdout_isatty and not as_json_out
        console = Console(file=env.stdout) if env.stdout_isatty and not as_json_out else None

        def abort() -> None:
            engine.abort_requested = True

        ask = terminal_ask(console, abort) if interactive and console is not None else None
        loop = tool_loop(session, host, options, ask) if host is not None else None  # no tool: a plain reply
        recorder = _history.recorder(_history.context("generate", resolved, engine=engine), no_log=no_log)
        user = compose(instruction, material)
        plan = loop.plan(user) if loop is not None else session.plan(user)
        with ctrl_c_stops(engine), no_echo(terminal()), finished(reply(session, plan, loop)) as turn:
            events = watched(recorder, session, cast("Iterator[Event | ToolEvent]", turn))
            if as_json_out:
                final = JsonRenderer(env.stdout, settings=resolved.report()).render(as_json(events, env.stdout))
            elif console is not None:
                title = opt.title(resolved)
                final = render_steps(events, lambda: LiveRenderer(console, title=title), show_on(console))
            else:
                renderer = PlainRenderer(env.stdout, env.stderr, show_stats=stats, show_thinking=thinking.show)
                final = renderer.render(plain(events))
        recorder.flush(exit_status(final))
        if loop is not None:
            finish_turn(loop)
    if final.stop_reason == "interrupted":
        if as_json_out:
            out().note("interrupted")
        return ExitCode.INTERRUPTED
    return ExitCode.OK


# ------------------------------------------------------- localrun tools --


def tools_command(
    mcp: Mcp = None,
    as_json_out: Annotated[bool, typer.Option("--json", help="The tools as JSON.")] = False,
) -> ExitCode:
    """List the tools of the MCP servers (--mcp files and config.toml's [mcp.servers])."""
    options = tool_options(mcp, False, None, 8, 60.0)
    servers = server_list(options)
    if servers is None:
        raise UsageError(
            "no MCP server is configured", hint="give --mcp FILE, or add [mcp.servers.NAME] to config.toml"
        )
    if not servers.servers and servers.problems:  # nothing to list: what stopped it is the error
        *others, last = servers.problems
        for problem in others:
            out().warn(problem)
        raise UsageError(last)
    with opened(servers) as host:
        tools = host.tools
        if as_json_out:
            out().json([{"name": t.name, "server": t.server, "tool": t.tool, "description": t.description,
                         "read_only": t.read_only, "parameters": t.parameters} for t in tools])  # fmt: skip
        else:
            from localrun.ui.tools import tools_table

            out().table(tools_table(tools))
        failed = bool(servers.problems or host.problems)
    if not tools:
        return ExitCode.USAGE if failed else ExitCode.OK
    return ExitCode.OK
