"""The `localrun` command: wires the command modules together, nothing else."""

from __future__ import annotations

import typer

from localrun.cli import cache, chat, generate, models

app = typer.Typer(
    name="localrun",
    help="Fast local text generation with llama.cpp.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("generate")(generate.generate)
app.command("chat")(chat.chat)
app.command("pull")(models.pull)
app.command("list")(models.list_models)
app.command("rm")(models.rm)
app.command("show")(models.show)
app.add_typer(cache.app, name="cache")


@app.callback()
def _root() -> None:
    """Fast local text generation with llama.cpp."""


def main() -> None:
    app()
