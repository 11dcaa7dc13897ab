"""Speculative decoding on the command line: `--spec`, `--draft` and
`--draft-model`, shared by the commands that generate, and the one way they
become a `Speculation` (or none).

    --spec auto|lookup|mtp|none   how to speculate (default: config.toml's `draft`, else auto)
    --draft                   also with the model's matched draft model, pulled if need be
    --draft-model NAME        with this draft model only (an alias or a GGUF path)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer

from localrun.cli._output import out
from localrun.errors import LocalrunError, UsageError
from localrun.settings import NO_DRAFT_MODEL, SPEC_MODES

if TYPE_CHECKING:
    from localrun.cli._options import PlannedRun
    from localrun.runtime.engine import Engine
    from localrun.speculative import Speculation


Spec = Annotated[
    str | None,
    typer.Option(
        "--spec",
        help="Speculative decoding: auto (prompt lookup, the model's MTP head if it has one, and the matched "
        "draft model when it is here, each used only while it pays), lookup, mtp (the model's own MTP head "
        "only), or none. Default: config.toml's draft, else auto.",
        show_default=False,
    ),
]
Draft = Annotated[
    bool,
    typer.Option("--draft", help="Speculate with the model's matched draft model too, pulled if need be."),
]
DraftModel = Annotated[
    str | None,
    typer.Option(
        "--draft-model", help="Speculate with this draft model only: an alias or a GGUF path.", show_default=False
    ),
]


def draft_choice(spec: str | None, draft: bool, draft_model: str | None) -> str | None:
    """The speculation the three options ask for, as config.toml's `draft`
    says it (auto, lookup, mtp, none, or a draft model); None when none was given."""
    if spec is not None and spec not in SPEC_MODES:
        modes = f"{', '.join(SPEC_MODES[:-1])} or {SPEC_MODES[-1]}"
        raise UsageError(f"unknown --spec {spec!r}", hint=f"use --spec {modes}")
    if draft_model is not None and (draft or spec is not None):
        raise UsageError("--draft-model names the one drafter", hint="drop --draft and --spec")
    if draft and spec in NO_DRAFT_MODEL:
        raise UsageError(f"--draft speculates with a draft model; --spec {spec} does not", hint="drop one of them")
    return draft_model or spec or ("auto" if draft else None)


@contextmanager
def open_draft(resolved: PlannedRun, engine: Engine) -> Iterator[Speculation | None]:
    """The speculation for the run's resolved draft choice on ``engine`` (the
    model ``resolved.target`` names), with the draft model the plan placed
    (`resolved.draft`), closed at the end, its controller starting from the
    verify-cost curve `localrun tune` measured here. On auto, a matched
    draft that cannot be used leaves prompt lookup, with a warning."""
    from localrun.speculative import open_speculation, speculation_refused

    choice, verify_curve, growth = resolved.settings.draft, resolved.verify_curve, resolved.step_growth
    refused = speculation_refused(engine) if choice == "auto" else None
    if refused is not None:
        out().note(f"speculative decoding is off: {refused}")
    try:
        speculation = open_speculation(engine, choice, resolved.draft, verify_curve=verify_curve, growth=growth)
    except LocalrunError as exc:
        if choice != "auto":
            raise
        out().warn(f"the matched draft model is not usable ({exc.message}); prompt lookup only")
        speculation = open_speculation(engine, "lookup", verify_curve=verify_curve, growth=growth)
    try:
        yield speculation
    finally:
        if speculation is not None:
            speculation.close()
