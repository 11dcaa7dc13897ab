"""`--draft`: the option, shared by the commands that generate, and the one
way it becomes a `Speculation` (or none)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer

from localrun import store
from localrun.cli._env import current
from localrun.cli._output import out
from localrun.cli._resolve import resolve_model
from localrun.errors import LocalrunError

if TYPE_CHECKING:
    from localrun.runtime.engine import Engine
    from localrun.speculative import Speculation

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
    choice: str, engine: Engine, target: store.Target, *, offline: bool = False
) -> Iterator[Speculation | None]:
    """The speculation for the resolved ``--draft`` choice on ``engine`` (the
    model ``target`` names), closed at the end. `auto` uses the matched draft
    only when it is already on disk (see `store.matched_draft`); an alias or
    path is pulled if need be."""
    from localrun.speculative import open_speculation

    path = None
    if choice == "auto":
        path = store.matched_draft(target, current().registry)
    elif choice not in ("none", "lookup"):
        path = resolve_model(choice, offline=offline).path
    try:
        speculation = open_speculation(engine, choice, path)
    except LocalrunError as exc:
        if choice != "auto":
            raise
        out().warn(f"the matched draft model is not usable ({exc.message}); prompt lookup only")
        speculation = open_speculation(engine, "lookup")
    try:
        yield speculation
    finally:
        if speculation is not None:
            speculation.close()
