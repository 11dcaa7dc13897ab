"""The `localrun` command: wires the command modules together, nothing else.

Command modules import the runtime (and llama.cpp) inside their functions,
so `localrun --help` and `localrun list` never load libllama.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from localrun import __version__
from localrun.cli import (
    _completion,
    _env,
    bench,
    cache,
    chat,
    doctor,
    embed,
    generate,
    launch,
    logs,
    models,
    ps,
    quantize,
    rpc_server,
    run,
    serve,
    tools,
    tune,
)
from localrun.cli import template as template_cli
from localrun.cli._errors import ExitCode, bounded, parsing_error, report, set_debug
from localrun.cli._help import plain_help

app = typer.Typer(
    name="localrun",
    help="Fast local text generation with llama.cpp.",
    no_args_is_help=True,
    add_completion=False,  # localrun's own options (_completion) honour the shell named
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's plain help: flags without a type after them, descriptions at full width
)
app.command("generate")(bounded(generate.generate))
app.command("chat")(bounded(chat.chat))
app.command("run", context_settings=run.CONTEXT)(bounded(run.run_command))
app.command("serve")(bounded(serve.serve_command))
app.command("ps")(bounded(ps.ps_command))
app.command("embed")(bounded(embed.embed_command))
app.command("pull")(bounded(models.pull))
app.command("list")(bounded(models.list_models))
app.command("rm")(bounded(models.rm))
app.command("show")(bounded(models.show))
app.add_typer(cache.app, name="cache")
app.add_typer(logs.app, name="logs")
app.command("bench")(bounded(bench.bench_command))
app.command("tune")(bounded(tune.tune_command))
app.command("quantize")(bounded(quantize.quantize_command))
app.command("doctor")(bounded(doctor.doctor_command))
app.command("rpc-server")(bounded(rpc_server.rpc_server_command))
app.command("template")(bounded(template_cli.template_command))
app.command("launch")(bounded(launch.launch_command))
app.command("tools")(bounded(tools.tools_command))


def _print_version(value: bool) -> None:
    if value:
        _env.current().stdout.write(f"localrun {__version__}\n")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
    debug: Annotated[
        bool, typer.Option("--debug", help="Tracebacks on errors (also LOCALRUN_DEBUG=1).", show_default=False)
    ] = False,
    install_completion: Annotated[
        str | None,
        typer.Option(
            "--install-completion",
            metavar="[SHELL]",
            callback=_completion.option_callback,
            is_eager=True,
            help="Install completion for SHELL (bash, zsh, fish, powershell; default: this shell), then exit.",
            show_default=False,
        ),
    ] = None,
    show_completion: Annotated[
        str | None,
        typer.Option(
            "--show-completion",
            metavar="[SHELL]",
            callback=_completion.option_callback,
            is_eager=True,
            help="Print the completion script for SHELL (default: this shell), to install it yourself.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Fast local text generation with llama.cpp."""
    set_debug(debug)


def main(argv: list[str] | None = None, env: _env.Environment | None = None) -> int:
    """Run the command line (``argv``: default sys.argv) in ``env`` (default:
    the process's streams); returns the exit status."""
    _env.use(env)
    set_debug(False)
    _completion.init()
    args = _completion.with_shell_named(sys.argv[1:] if argv is None else list(argv))
    try:
        command = plain_help(typer.main.get_command(app))
        code = command.main(args=args, prog_name="localrun", standalone_mode=False)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except typer.Abort:  # a confirmation ended by Ctrl-D
        _env.current().stderr.write("aborted\n")
        return int(ExitCode.ERROR)
    except typer.TyperException as exc:  # Click could not parse the command line
        from typer._click.exceptions import NoArgsIsHelpError

        if isinstance(exc, NoArgsIsHelpError):  # a group alone: its help
            exc.show()
            return exc.exit_code
        return int(report(parsing_error(exc)))
    finally:
        _env.use(None)
    return code if isinstance(code, int) else 0
