"""`localrun chat` on a terminal: line editing and a persistent history
(readline), `\"\"\"` blocks for multi-line messages, slash commands, replies
streamed in the live panel and shown as Markdown (or raw: /markdown off) when complete. Ctrl-C stops
a reply, or clears the line at the prompt; Ctrl-D or /exit ends the session."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

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
from localrun.ui.stream import LiveRenderer
from localrun.ui.text import oldest_turns, session_line, stats_line
from localrun.units import count

MULTILINE = '"""'
QUIT_WORDS = frozenset({"exit", "quit"})  # a line of only one of these ends the session, as in a shell

# `/set parameter NAME VALUE` (ollama's names): the sampling field each sets, and its type
PARAMETERS: dict[str, tuple[str, type[int] | type[float]]] = {
    "temperature": ("temperature", float),
    "top_k": ("top_k", int),
    "top_p": ("top_p", float),
    "min_p": ("min_p", float),
    "repeat_penalty": ("repeat_penalty", float),
    "repeat_last_n": ("repeat_last_n", int),
    "seed": ("seed", int),
    "num_predict": ("max_tokens", int),
}
AT_START = {"num_ctx": "--ctx", "num_gpu": "--gpu-layers", "num_thread": "--threads"}  # fixed once loaded


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
    ) -> None:
        self.session = session
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
                "/set parameter NAME VALUE", "a sampling setting (temperature, top_k, ...); /set system TEXT", self._set
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

    def _set(self, arg: str) -> bool:
        """ollama's `/set`: `parameter NAME VALUE` and `system TEXT`; what only a
        start can change names the option that does."""
        what, _, rest = arg.partition(" ")
        if what == "system":
            return self._system(rest.strip())
        if what != "parameter":
            raise UsageError(
                f"/set {what or '...'} is not a setting here", hint="/set parameter NAME VALUE or /set system TEXT"
            )
        name, _, value = rest.strip().partition(" ")
        if name in AT_START:
            raise UsageError(f"{name} is fixed once the model is loaded", hint=f"start chat with {AT_START[name]}")
        if name not in PARAMETERS:
            raise UsageError(f"unknown parameter {name!r}", hint=f"one of {', '.join(PARAMETERS)}")
        field_name, kind = PARAMETERS[name]
        try:
            number = kind(value.strip())
        except ValueError:
            raise UsageError(f"/set parameter {name} takes a number, not {value.strip()!r}") from None
        if field_name == "max_tokens":
            if number < 1:
                raise UsageError("num_predict must be at least 1")
            self.session.max_tokens = int(number)
        else:
            changed: dict[str, Any] = {field_name: number}
            self.session.sampling = checked_sampling(replace(self.session.sampling, **changed))
        self.console.print(f"{name} set to {number}", style="dim")
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
