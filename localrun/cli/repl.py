"""`localrun chat` on a terminal: line editing and a persistent history
(readline), `\"\"\"` blocks for multi-line messages, slash commands, replies
streamed in the live panel and shown as Markdown (or raw: /markdown off) when complete. Ctrl-C stops
a reply, or clears the line at the prompt; Ctrl-D or /exit ends the session."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from localrun import paths
from localrun.cli._env import current
from localrun.cli._errors import ExitCode, as_user_error, describe
from localrun.cli._history import exit_status
from localrun.cli._options import checked_sampling
from localrun.cli._signals import ctrl_c_stops, no_echo
from localrun.errors import LocalrunError, UsageError
from localrun.events import Stats
from localrun.history.record import Recorder
from localrun.runtime.chat import ChatSession
from localrun.runtime.generate import finished
from localrun.runtime.sampling import PARAMETERS  # `/set NAME VALUE` and `/set parameter NAME VALUE`
from localrun.ui.stream import LiveRenderer
from localrun.ui.text import oldest_turns, session_line, stats_line
from localrun.units import count

if TYPE_CHECKING:
    from localrun.cli._switch import ModelSwitch
    from localrun.mcp.loop import ToolLoop

MULTILINE = '"""'
QUIT_WORDS = frozenset({"exit", "quit"})  # a line of only one of these ends the session, as in a shell

# the command line's spellings of the same settings (`--max-tokens`, `--top-p`...)
SPELLINGS = {"max_tokens": "num_predict", "temp": "temperature", "n_predict": "num_predict"}
AT_START = {"num_ctx": "--ctx", "num_gpu": "--gpu-layers", "num_thread": "--threads"}  # fixed once loaded
UNSET = frozenset({"none", "random", "off", "default"})  # `/set seed random`, `/set num_predict none`


def line_editing(history: Path | None = None) -> None:
    """Line editing for input(), with ``history`` read in, and a multi-line
    paste taken as one line."""
    try:
        import readline
    except ImportError:  # no line editing on this platform
        return
    readline.set_history_length(2000)
    if "libedit" not in (readline.__doc__ or ""):
        # A paste arrives between ESC[200~ and ESC[201~ and readline takes it
        # whole, newlines included: one message. Python turns this off.
        readline.parse_and_bind("set enable-bracketed-paste on")
    if history is not None:
        with contextlib.suppress(OSError):  # no history yet
            readline.read_history_file(history)


@dataclass(frozen=True)
class Command:
    usage: str
    help: str
    run: Callable[[str], bool]  # returns False to end the session


class Repl:
    """The interactive loop: read a message or a command, stream the reply."""

    def __init__(
        self,
        session: ChatSession,
        console: Console,
        history: Path | None = None,
        *,
        title: str = "",
        recorder: Recorder | None = None,
        markdown: bool = True,
        report: Callable[[], dict[str, Any]] | None = None,
        switch: ModelSwitch | None = None,
        tools: ToolLoop | None = None,
    ) -> None:
        self.session = session
        self.tools = tools  # MCP tools the model may call (localrun/cli/tools.py)
        self.switch = switch  # loads another model for /model NAME (None: the session keeps its model)
        self.report = report  # the settings a turn's record shows, for the loop it runs (/draft, /schema)
        self.markdown = markdown  # replies shown as Markdown, else as the model wrote them (/markdown)
        self.recorder = recorder  # the run history's: each turn logged after it is shown
        self.title = title or session.engine.info.name
        self.console = console
        self.history = history or paths.data_dir() / "chat_history"
        self.commands: dict[str, Command] = {
            "/help": Command("/help", "this list", self._help),
            "/stats": Command("/stats", "the last turn's figures and the session's totals", self._stats),
            "/clear": Command("/clear", "start a new conversation", self._clear),
            "/system": Command("/system [TEXT]", "show or set the system prompt (new conversation)", self._system),
            "/retry": Command("/retry", "generate the last reply again", self._retry),
            "/draft": Command("/draft on|off", "speculative decoding on or off", self._draft),
            "/schema": Command(
                "/schema SCHEMA|off", "every reply follows a JSON Schema (a file, inline, concise)", self._schema
            ),
            "/markdown": Command("/markdown on|off", "replies shown as Markdown, or as written", self._markdown),
            "/save": Command("/save FILE", "save the conversation as JSON (chat --load FILE resumes it)", self._save),
            "/load": Command("/load FILE", "load a saved conversation", self._load),
            "/set": Command(
                "/set [NAME VALUE]",
                "the settings, or one (temperature, top_p, top_k, min_p, seed, num_predict...); /set system TEXT",
                self._set,
            ),
            "/model": Command("/model [NAME]", "the model; go on with another (the conversation carries)", self._model),
            "/show": Command(
                "/show [info|parameters|system|template]", "the model, its shape and the settings", self._show
            ),
            "/tools": Command(
                "/tools [auto|required|none|TOOL]",
                "the tools the model may call and which run without asking; or how turns are offered them",
                self._tools,
            ),
            "/exit": Command("/exit", "end the session (also /bye, exit, quit or Ctrl-D)", lambda _: False),
        }
        self.aliases = {"/bye": "/exit", "/?": "/help"}  # ollama's spellings

    # -- input --

    def _setup_readline(self) -> None:
        line_editing(self.history)

    def _save_history(self) -> None:
        try:
            import readline

            self.history.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(self.history)
        except (ImportError, OSError):
            pass

    def read_message(self) -> str:
        """One message: a line, a paste (several lines at once), or a block
        between two `\"\"\"` lines. A line of only `exit` or `quit` ends the
        session (EOFError, as Ctrl-D)."""
        line = input(">>> ")
        if "\n" in line:  # a paste: its last line break is not part of the message
            line = line.rstrip("\n")
        if line.strip().lower() in QUIT_WORDS:  # a word to the shell, as Ctrl-D; in a """ block it is a message
            raise EOFError
        if not line.strip().startswith(MULTILINE):
            return line
        first = line.strip()[len(MULTILINE) :]
        if first.endswith(MULTILINE):  # """one line"""
            return first[: -len(MULTILINE)]
        lines = [first] if first else []
        while True:
            try:
                more = input("... ")
            except KeyboardInterrupt:  # drop the unfinished block, stay in the session
                self.console.print("\n(message discarded)", style="dim")
                return ""
            if more.rstrip().endswith(MULTILINE):
                lines.append(more.rstrip()[: -len(MULTILINE)])
                return "\n".join(lines).strip("\n")
            lines.append(more)

    # -- the loop --

    def run(self) -> ExitCode:
        self._setup_readline()
        name = self.title
        self.console.print(
            f"[bold]{name}[/bold] · context {self.session.engine.n_ctx} tokens · "
            f"/help for commands, {MULTILINE} for multi-line messages, Ctrl-D to quit",
            style="dim",
        )
        if self.session.turns:
            self.console.print(f"continuing a conversation of {count(len(self.session.turns), 'turn')}", style="dim")
        told_how_to_quit = False
        try:
            while True:
                try:
                    text = self.read_message()
                except EOFError:
                    self.console.print()
                    break
                except KeyboardInterrupt:  # clears the line, as in a shell; the session goes on
                    self.console.print()
                    if not told_how_to_quit:
                        self.console.print("(Ctrl-D or /exit ends the session)", style="dim")
                        told_how_to_quit = True
                    continue
                if not self._handle(text):
                    break
        finally:
            self._save_history()
        if self.session.totals.turns:  # nothing to sum up when nothing was asked
            current().stderr.write(f"session: {session_line(self.session.totals)}\n")
        return ExitCode.OK

    def _handle(self, text: str) -> bool:
        """A message or a command; False to end the session."""
        if text.startswith("/"):
            return self._command(text)
        if text.strip():
            self._turn(text)
        return True

    def _command(self, text: str) -> bool:
        name, _, arg = text.partition(" ")
        command = self.commands.get(self.aliases.get(name, name))
        if command is None:
            self.console.print(f"unknown command {name}; /help lists the commands", style="yellow")
            return True
        try:
            return command.run(arg.strip())
        except Exception as exc:  # a mistake in a command must not end the session and lose the conversation
            error = as_user_error(exc)
            if error is None:
                raise
            self.console.print(f"error: {describe(error)}", style="red")
            return True

    def _turn(self, text: str, *, retry: bool = False) -> None:
        if self.tools is not None:
            self.tools.bind(self.session)  # the session /model started, where it did
        try:
            plan = self.session.retry() if retry else self.session.plan(text)
        except LocalrunError as exc:
            self.console.print(f"error: {describe(exc)}", style="red")
            return
        if plan.dropped:
            self.console.print(
                f"dropped {oldest_turns(plan.dropped)} to fit the context of {self.session.engine.n_ctx} tokens",
                style="yellow",
            )
        if self.recorder is not None and self.report is not None:
            self.recorder.context.settings = {**(self.recorder.context.settings or {}), **self.report()}
        if self.tools is not None:  # the model may call tools: localrun/cli/tools.py
            from localrun.cli.tools import terminal_turn

            terminal_turn(
                self.tools, plan, self.console, title=self.title, markdown=self.markdown, recorder=self.recorder
            )
            return
        renderer = LiveRenderer(self.console, title=self.title, markdown=self.markdown)
        with (
            ctrl_c_stops(self.session.engine),
            no_echo(current().stdin),
            finished(self.session.reply(plan)) as replies,
        ):
            watched = (
                self.recorder.watch_turn(self.session.turns, replies, system=self.session.system)
                if self.recorder
                else replies
            )
            final = renderer.render(watched)
        if self.recorder is not None:
            self.recorder.flush(exit_status(final))
        if final.stop_reason == "interrupted":
            self.console.print("reply interrupted; it stays in the conversation (/retry to redo it)", style="yellow")

    # -- commands --

    def _tools(self, arg: str) -> bool:
        from localrun.cli.tools import choose_tools, show_tools

        if arg.strip():
            choose_tools(self.tools, arg.strip(), self.console)
        else:
            show_tools(self.tools, self.console)
        return True

    def _help(self, _: str) -> bool:
        rows = [(command.usage, command.help) for command in self.commands.values()]
        rows.append((MULTILINE, "start and end a multi-line message"))
        wide = max(len(usage) for usage, _ in rows)
        for usage, text in rows:  # markup off: "[TEXT]" is part of a usage, not a style
            self.console.print(f"  {usage:<{wide}}  {text}", markup=False, highlight=False)
        return True

    def _stats(self, _: str) -> bool:
        last: Stats | None = next((t.stats for t in reversed(self.session.turns) if t.stats), None)
        self.console.print(f"last turn: {stats_line(last) if last else 'none yet'}", soft_wrap=True)
        self.console.print(f"session:   {session_line(self.session.totals)}", soft_wrap=True)
        return True

    def _clear(self, _: str) -> bool:
        self.session.clear()
        self.console.print("new conversation", style="dim")
        return True

    def _system(self, arg: str) -> bool:
        if not arg:
            self.console.print(f"system prompt: {self.session.system or '(none)'}")
            return True
        self.session.set_system(arg)
        self.session.clear()
        self.console.print("system prompt set; new conversation", style="dim")
        return True

    def settings(self) -> dict[str, str]:
        """The settings `/set` changes, by ollama's names, as they stand."""
        sampling = self.session.sampling
        shown: dict[str, str] = {}
        for name, (field_name, _) in PARAMETERS.items():
            value = self.session.max_tokens if field_name == "max_tokens" else getattr(sampling, field_name)
            shown[name] = "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)
        shown["num_predict"] += "" if self.session.max_tokens else " (until the context is full)"
        shown["seed"] += "" if sampling.seed is not None else " (random)"
        shown["system"] = self.session.system or "(none)"
        return shown

    def _print_rows(self, rows: dict[str, str]) -> None:
        wide = max(len(name) for name in rows)
        for name, value in rows.items():
            self.console.print(f"  {name:<{wide}}  {value}", markup=False, highlight=False, soft_wrap=True)

    def _set(self, arg: str) -> bool:
        """`/set NAME VALUE` (``temperature 0.5``), ollama's `/set parameter
        NAME VALUE` and `/set system TEXT`; a bare `/set` lists the settings.
        What only a start can change names the option that does."""
        what, _, rest = arg.partition(" ")
        if not what or (what == "parameter" and not rest.strip()):
            self._print_rows(self.settings())
            self.console.print("/set NAME VALUE changes one; /set system TEXT the system prompt", style="dim")
            return True
        if what == "system":
            return self._system(rest.strip())
        if what == "parameter":
            what, _, rest = rest.strip().partition(" ")
        name = what.lower().replace("-", "_")
        name = SPELLINGS.get(name, name)
        if name in AT_START:
            raise UsageError(f"{name} is fixed once the model is loaded", hint=f"start chat with {AT_START[name]}")
        if name not in PARAMETERS:
            raise UsageError(
                f"unknown setting {what!r}", hint=f"one of {', '.join(PARAMETERS)}, system; /set lists them"
            )
        field_name = PARAMETERS[name][0]
        number = self._value(name, rest.strip())
        if field_name == "max_tokens":
            if number is not None and number < 1:
                raise UsageError("num_predict must be at least 1")
            self.session.max_tokens = None if number is None else int(number)
        else:
            changed: dict[str, Any] = {field_name: number}
            self.session.sampling = checked_sampling(replace(self.session.sampling, **changed))
        self.console.print(f"{name} set to {self.settings()[name]}", style="dim")
        return True

    def _value(self, name: str, value: str) -> int | float | None:
        """``value`` as the setting ``name`` takes it (None: the seed or the length left to chance or the context)."""
        field_name, kind = PARAMETERS[name]
        if not value:
            raise UsageError(f"/set {name} needs a value", hint=f"it is {self.settings()[name]}")
        if value.lower() in UNSET and field_name in ("seed", "max_tokens"):
            return None
        try:
            return kind(value)
        except ValueError:
            raise UsageError(f"/set {name} takes a number, not {value!r}") from None

    def model_info(self) -> dict[str, str]:
        """The model as `/show info` gives it: its name, file and shape."""
        from localrun.gguf.info import describe as shape_of
        from localrun.units import human_bytes

        engine = self.session.engine
        shape = shape_of(engine.info)
        rows = {
            "model": self.session.model or self.title,
            "file": str(engine.info.path),
            "architecture": shape.architecture,
            "parameters": f"{shape.parameters / 1e9:.2f}B" if shape.parameters >= 1e8 else f"{shape.parameters:,}",
            "quantization": shape.quantization,
            "size": human_bytes(shape.weights_bytes),
            "layers": str(shape.layers),
            "context": f"{engine.n_ctx} tokens (trained on {engine.n_ctx_train})",
            "chat template": "the model's own" if shape.has_chat_template else "a built-in one",
        }
        if self.session.speculation is not None:
            rows["speculation"] = f"{self.session.speculation.label} ({'on' if self.session.use_draft else 'off'})"
        return rows

    def _show(self, arg: str) -> bool:
        """ollama's `/show`: info, parameters, system, template; bare, the model's info and the settings."""
        what = arg.strip().lower()
        if what in ("", "info"):
            self._print_rows(self.model_info())
        if what in ("", "parameters"):
            if not what:
                self.console.print("settings (/set NAME VALUE):", style="dim")
            settings = self.settings()
            settings.pop("system")
            self._print_rows(settings)
        if what == "system":
            self.console.print(self.session.system or "(no system prompt)", markup=False, highlight=False)
        elif what == "template":
            self.console.print(self.session.template, markup=False, highlight=False, soft_wrap=True)
        elif what not in ("", "info", "parameters"):
            raise UsageError(f"/show {what} is not known here", hint="/show info, parameters, system or template")
        return True

    def _model(self, arg: str) -> bool:
        """`/model NAME`: the session goes on with the model named; bare, the model in use."""
        name = arg.strip()
        if not name:
            self.console.print(f"model: {self.session.model or self.title}", markup=False, highlight=False)
            if self.switch is not None:
                self.console.print("/model NAME goes on with another; localrun list shows them", style="dim")
            return True
        if self.switch is None:
            raise UsageError("this session cannot change its model", hint="start another: localrun chat -m NAME")
        from localrun.cli._switch import NoModelLeft

        with self.console.status(f"loading {name}...", spinner="dots"):
            try:
                switched = self.switch(name, self.session)
            except NoModelLeft as exc:  # no model to go on with
                self.console.print(f"error: {describe(exc)}; no model is loaded, the session ends", style="red")
                return False
        self.session, self.title = switched.session, switched.title
        if self.report is not None:
            switch = self.switch
            self.report = lambda: switch.report(self.session)
        if switched.failed is not None:
            self.console.print(f"error: {describe(switched.failed)}", style="red")
            self.console.print(f"going on with {self.title}", style="dim")
            return True
        carried = (
            f"; the conversation of {count(len(self.session.turns), 'turn')} goes on" if self.session.turns else ""
        )
        self.console.print(
            f"[bold]{self.title}[/bold] · context {self.session.engine.n_ctx} tokens{carried}", style="dim"
        )
        return True

    def _retry(self, _: str) -> bool:
        self._turn("", retry=True)
        return True

    def _draft(self, arg: str) -> bool:
        if not arg:
            state = "on" if self.session.use_draft and self.session.speculation else "off"
            self.console.print(f"speculative decoding is {state}; /draft on|off")
            return True
        if arg not in ("on", "off"):
            raise UsageError(f"/draft takes on or off, not {arg!r}")
        if arg == "on" and self.session.speculation is None:
            raise UsageError(
                "no drafter was opened", hint="start chat with --spec auto or lookup, --draft or --draft-model"
            )
        self.session.use_draft = arg != "off"
        label = self.session.speculation.label if self.session.speculation else ""
        self.console.print(f"speculative decoding {'on (' + label + ')' if self.session.use_draft else 'off'}")
        return True

    def _markdown(self, arg: str) -> bool:
        if arg not in ("", "on", "off"):
            raise UsageError(f"/markdown takes on or off, not {arg!r}")
        if arg:
            self.markdown = arg == "on"
        shown = "as Markdown" if self.markdown else "as the model wrote them"
        self.console.print(f"replies are shown {shown}{'' if arg else '; /markdown on|off'}", style="dim")
        return True

    def _schema(self, arg: str) -> bool:
        from localrun.structured.spec import parse_schema

        if not arg:
            source = self.session.output.source if self.session.output else "off"
            self.console.print(f"schema: {source}; /schema SCHEMA|off")
        elif arg == "off":
            self.session.output = None
            self.console.print("replies are free text")
        else:
            self.session.output = parse_schema(arg)
            self.console.print(f"every reply follows {self.session.output.source}", style="dim")
        return True

    def _save(self, arg: str) -> bool:
        if not arg:
            raise UsageError("/save needs a file name")
        path = Path(arg).expanduser()
        self.session.save(path)
        self.console.print(f"saved {count(len(self.session.turns), 'turn')} to {path}", style="dim")
        return True

    def _load(self, arg: str) -> bool:
        if not arg:
            raise UsageError("/load needs a file name")
        path = Path(arg).expanduser()
        saved = self.session.load(path)
        self.console.print(f"loaded {count(len(self.session.turns), 'turn')} from {path}", style="dim")
        if saved.model and saved.model != self.session.model:
            self.console.print(
                f"it was held with {saved.model}; it goes on with {self.session.model} "
                f"(chat --load {path} goes on with its own model)",
                style="dim",
            )
        return True
