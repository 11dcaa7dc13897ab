"""`generate`, `chat` and `generate --batch` on a remote OpenAI-compatible
server: the model name says which (`-m NAME` of a [remotes.NAME] entry,
`remote:NAME`, a URL, or `--remote URL`), the rest is as for a local model."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from localrun.cli import _history
from localrun.cli._env import current
from localrun.cli._errors import ExitCode, as_user_error, describe
from localrun.cli._input import read_turns
from localrun.cli._output import out, pick_renderer
from localrun.cli._signals import ctrl_c_stops, no_echo, terminal
from localrun.errors import UsageError
from localrun.events import Stats
from localrun.remote.config import Remote, find_remote
from localrun.settings import Options

if TYPE_CHECKING:
    from localrun.history.record import Recorder
    from localrun.remote.backend import RemoteModel
    from localrun.remote.chat import RemoteChat
    from localrun.runtime.batch.plan import BatchSettings
    from localrun.runtime.sampling import SamplingParams
    from localrun.structured.spec import OutputSpec


def find(model: str | None, remote_url: str | None) -> Remote | None:
    """The remote the command runs on, or None for a local model."""
    return find_remote(model, current().registry, remote_url)


# the fields of Options only a local model has, and their options' names
_LOCAL_ONLY = {
    "ctx": "ctx",
    "kv": "kv",
    "kv_k": "kv-k",
    "kv_v": "kv-v",
    "flash_attn": "flash-attn",
    "threads": "threads",
    "draft": "spec",
    "template": "template",
}


def refuse_local_options(options: Options, **given: Any) -> None:
    """Options only a local model has (those of ``options``, and ``given``):
    an error, never silently ignored."""
    named = [(flag, getattr(options, field)) for field, flag in _LOCAL_ONLY.items()]
    for name, value in [*named, *given.items()]:
        if value not in (None, False, "none"):
            raise UsageError(
                f"--{name.replace('_', '-')} applies to local models only",
                hint="the server decides it for a remote; drop the option",
            )


def open_model(remote: Remote) -> RemoteModel:
    from localrun.remote.backend import RemoteModel

    model = RemoteModel(remote)
    try:
        return model.open()
    except BaseException:
        model.close()
        raise


def _settings(remote: Remote, model: RemoteModel) -> dict[str, object]:
    """The run's settings for `--json`, as a local run's: each with its value and source."""
    source = "option" if remote.label == remote.url else "model"
    return {
        "remote": {"value": remote.url, "source": source},
        "model": {"value": model.model_id, "source": source if remote.model else "server"},
    }


def _finish(final: Stats, model: RemoteModel, output: OutputSpec | None) -> ExitCode:
    """The exit code of one reply: a cut stream is an error after its text."""
    if final.stop_reason == "error" and model.failure is not None:
        raise model.failure
    if final.stop_reason == "interrupted":
        return ExitCode.INTERRUPTED
    if final.valid is False:
        cut = " (--max-tokens cut it short)" if final.stop_reason == "length" else ""
        source = output.source if output else "the schema"
        out().warn(f"the output does not follow {source}{cut}: {final.invalid}; the server did not enforce it")
        return ExitCode.INVALID_OUTPUT
    return ExitCode.OK


def generate(
    remote: Remote,
    text: str,
    *,
    system: str | None,
    raw: bool,
    sampling: SamplingParams,
    max_tokens: int | None,
    stop: tuple[str, ...],
    output: OutputSpec | None,
    as_json: bool,
    show_stats: bool,
    no_log: bool = False,
) -> ExitCode:
    from localrun.remote.backend import Request

    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": text})
    common: dict[str, Any] = {"sampling": sampling, "max_tokens": max_tokens, "stop": stop, "output": output}
    if raw:
        request = Request(prompt="\n\n".join(m["content"] for m in messages), **common)
    else:
        request = Request(messages=messages, **common)
    with open_model(remote) as model:
        renderer = pick_renderer(as_json, show_stats, model.title, _settings(remote, model))
        run = _history.remote_context("generate", remote, model.model_id, _settings(remote, model), output, system)
        recorder = _history.recorder(run, no_log=no_log)
        with ctrl_c_stops(model), no_echo(terminal()):
            final = renderer.render(recorder.watch(model.generate(request), text))
        recorder.flush(_history.exit_status(final))
        return _finish(final, model, output)


def chat(
    remote: Remote,
    *,
    system: str | None,
    sampling: SamplingParams,
    max_tokens: int | None,
    output: OutputSpec | None,
    as_json: bool,
    show_stats: bool,
    no_log: bool = False,
    markdown: bool = True,
) -> ExitCode:
    """A pipe: one reply per stdin line, as a local chat. A terminal: a plain
    prompt loop (`/clear`, `/exit`), replies in the live panel (as Markdown, or
    as written)."""
    from localrun.remote.chat import RemoteChat

    env = current()
    with open_model(remote) as model:
        session = RemoteChat(model, sampling, system=system, max_tokens=max_tokens, output=output)
        run = _history.remote_context("chat", remote, model.model_id, _settings(remote, model), output, system)
        recorder = _history.recorder(run, no_log=no_log)
        if env.stdin_isatty and env.stdout_isatty and not as_json:
            return _interactive(session, recorder, markdown=markdown)
        return _piped(session, remote, as_json, show_stats, recorder)


def _piped(session: RemoteChat, remote: Remote, as_json: bool, show_stats: bool, recorder: Recorder) -> ExitCode:
    from localrun.ui.stream import JsonRenderer, PlainRenderer, Renderer

    env = current()
    for turn, (_number, text, _) in enumerate((t.without_tools() for t in read_turns(iter(env.stdin))), 1):
        renderer: Renderer = (
            JsonRenderer(env.stdout, extra={"turn": turn}, settings=_settings(remote, session.model))
            if as_json
            else PlainRenderer(env.stdout, env.stderr, show_stats=show_stats)
        )
        with ctrl_c_stops(session.model):
            final = renderer.render(recorder.watch(session.reply(text), text))
        recorder.flush(_history.exit_status(final))
        code = _finish(final, session.model, session.output)
        if code != ExitCode.OK:
            return code
    return ExitCode.OK


def _interactive(session: RemoteChat, recorder: Recorder, *, markdown: bool = True) -> ExitCode:
    from rich.console import Console

    from localrun.cli.repl import line_editing
    from localrun.ui.stream import LiveRenderer

    line_editing()  # a paste is one message
    env = current()
    console = Console(file=env.stdout, highlight=False)
    console.print(f"[bold]{session.model.title}[/bold] · /clear starts over, /exit or Ctrl-D ends", style="dim")
    while True:
        try:
            text = input(">>> ").rstrip("\n")
        except EOFError:
            console.print()
            return ExitCode.OK
        except KeyboardInterrupt:  # clears the line; the session goes on
            console.print()
            continue
        if text.strip() in ("/exit", "/bye"):
            return ExitCode.OK
        if text.strip() == "/clear":
            session.clear()
            continue
        if not text.strip():
            continue
        session.model.abort_requested = False
        try:
            with ctrl_c_stops(session.model), no_echo(terminal()):
                panel = LiveRenderer(console, title=session.model.title, markdown=markdown)
                final = panel.render(recorder.watch(session.reply(text), text))
            recorder.flush(_history.exit_status(final))
            if final.stop_reason == "error" and session.model.failure is not None:
                raise session.model.failure
        except Exception as exc:  # a failed turn is reported; the session goes on
            error = as_user_error(exc)
            if error is None:
                raise
            env.stderr.write(f"error: {describe(error)}\n")


def batch(
    remote: Remote,
    source: str,
    settings: BatchSettings,
    *,
    parallel: int | None,
    unordered: bool,
    resume: Any,
    show_stats: bool,
    no_log: bool = False,
) -> ExitCode:
    from localrun.cli import batch as batch_cli
    from localrun.remote.batch import DEFAULT_PARALLEL

    with open_model(remote) as model:
        run = _history.remote_context("batch", remote, model.model_id, _settings(remote, model), settings.output)
        return batch_cli.run_remote(
            source,
            settings,
            model,
            parallel=parallel or DEFAULT_PARALLEL,
            unordered=unordered,
            resume=resume,
            show_stats=show_stats,
            recorder=_history.recorder(run, no_log=no_log),
        )
