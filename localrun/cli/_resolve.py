"""Model names to files for the commands: the store's resolver, with a
progress bar and a notice when a model is pulled on first use, and, once,
how to tune a model so pulled; and the draft model's file a run's
speculation asks for (`draft_path`), resolved before the run is planned."""

from __future__ import annotations

from pathlib import Path

from localrun import store
from localrun.cli._env import current
from localrun.cli._output import out
from localrun.settings import NO_DRAFT_MODEL
from localrun.units import human_bytes


def pull_with_progress(target: store.Target, source: store.Source = "auto") -> store.Pulled:
    from localrun.ui.progress import PullProgress

    env = current()
    with PullProgress(env.stderr, target.label, terminal=env.stderr_isatty) as progress:
        pulled = store.pull(target, source=source, progress=progress.update, notice=progress.notice)
        progress.finish(pulled.path, pulled.source)
    return pulled


def _pull_missing(target: store.Target) -> Path:
    size = target.entry.size if target.entry is not None else None
    about = f" ({human_bytes(size)})" if size else ""
    current().stderr.write(f"{target.label} is not downloaded yet: pulling it{about}\n")
    return pull_with_progress(target).path


def model_name(name: str | None) -> str | None:
    """The model named (`-m`, else LOCALRUN_MODEL), else config.toml's `model`;
    None: the registry's default."""
    return name if name is not None else current().config.model


def resolve_model(
    name: str | None, *, offline: bool = False, with_draft: bool = False, tune_hint: bool = True
) -> store.Resolved:
    """`store.resolve` on the current registry (no name: config.toml's `model`,
    else the registry's default), pulling on first use with a progress bar.
    A model so pulled that this machine has not measured gets, once, the
    command that tunes it (``tune_hint``: not for a draft, nor for `tune` itself)."""
    pulled: list[Path] = []

    def pull_missing(target: store.Target) -> Path:
        pulled.append(_pull_missing(target))
        return pulled[-1]

    found = store.resolve(
        model_name(name), current().registry, offline=offline, with_draft=with_draft, pull_missing=pull_missing
    )
    if tune_hint and found.path in pulled:
        _say_how_to_tune(found)
    return found


def _say_how_to_tune(found: store.Resolved) -> None:
    from localrun.tune.apply import find

    label = found.target.label
    if find(found.path, hint_once=True).hint is not None:  # the model is now marked told: no second note
        out().note(
            f"note: {label} runs on llama.cpp's defaults until `localrun tune {label}` measures what is "
            "fastest on this machine (about a minute)"
        )


def draft_path(choice: str | None, target: store.Target, *, offline: bool = False, pull: bool = False) -> Path | None:
    """The draft model's file for the speculation ``choice`` (config.toml's
    `draft`) on the model ``target`` names, before the run is planned, so
    that the plan places it: on auto the matched draft when it is on disk,
    or pulled first with ``pull`` (`--draft`); a draft model named by alias
    or path, pulled if need be; none for lookup, mtp or none."""
    if choice == "auto":
        return _matched(target, offline=offline, pull=pull)
    if choice is None or choice in NO_DRAFT_MODEL:
        return None
    return resolve_model(choice, offline=offline, tune_hint=False).path


def _matched(target: store.Target, *, offline: bool, pull: bool) -> Path | None:
    registry = current().registry
    found = store.matched_draft(target, registry)
    if found is not None or not pull:
        return found
    draft = store.draft_target(target, registry)
    if draft is None:
        out().warn(f"{target.label} has no matched draft model in the registry; prompt lookup only")
        return None
    return resolve_model(draft.label, offline=offline, tune_hint=False).path
