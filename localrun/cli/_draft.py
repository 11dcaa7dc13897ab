"""`--draft`: the option, shared by the commands that generate, and the one
way it becomes a `Speculation` (or none)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer

from localrun import store
from localrun.store import registry
from localrun.cli.models import resolve_model
from localrun.config import load as load_config
from localrun.runtime.engine import Engine
from localrun.errors import LocalrunError
from localrun.speculative import Speculation, open_speculation

Draft = Annotated[
    str | None,
    typer.Option(
        "--draft",
        help="Speculative decoding: auto (the model's matched draft model and prompt lookup, each used only "
        "while it pays), lookup, none, or a draft model's alias or GGUF path. Default: config.toml's, else auto.",
        show_default=False,
    ),
]


@contextmanager
def open_draft(
    option: str | None, engine: Engine, target: store.Target, *, offline: bool = False
) -> Iterator[Speculation | None]:
    """The speculation for ``--draft CHOICE`` on ``engine`` (the model
    ``target`` names), closed at the end; without the option, config.toml's
    `draft`, else auto. `auto` uses the matched draft only when it is already
    on disk (see `store.matched_draft`); an alias or path is pulled if need be."""
    choice = option or load_config().draft or "auto"
    path = None
    if choice == "auto":
        path = store.matched_draft(target, registry.load())
    elif choice not in ("none", "lookup"):
        path, _ = resolve_model(choice, offline=offline)
    try:
        speculation = open_speculation(engine, choice, path)
    except LocalrunError as exc:
        if choice != "auto":
            raise
        sys.stderr.write(f"warning: the matched draft model is not usable ({exc.message}); prompt lookup only\n")
        speculation = open_speculation(engine, "lookup")
    try:
        yield speculation
    finally:
        if speculation is not None:
            speculation.close()
