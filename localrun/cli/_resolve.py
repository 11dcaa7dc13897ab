"""Model names to files for the commands: the store's resolver, with a
progress bar and a notice when a model is pulled on first use."""

from __future__ import annotations

from pathlib import Path

from localrun import store
from localrun.cli._env import current


def pull_with_progress(target: store.Target, source: store.Source = "auto") -> store.Pulled:
    from localrun.ui.progress import PullProgress

    env = current()
    with PullProgress(env.stderr, target.label, terminal=env.stderr_isatty) as progress:
        pulled = store.pull(target, source=source, progress=progress.update, notice=progress.notice)
        progress.finish(pulled.path, pulled.source)
    return pulled


def _pull_missing(target: store.Target) -> Path:
    current().stderr.write(f"{target.label} is not downloaded yet: pulling it\n")
    return pull_with_progress(target).path


def model_name(name: str | None) -> str | None:
    """The model named (`-m`, else LOCALRUN_MODEL), else config.toml's `model`;
    None: the registry's default."""
    return name if name is not None else current().config.model


def resolve_model(name: str | None, *, offline: bool = False, with_draft: bool = False) -> store.Resolved:
    """`store.resolve` on the current registry (no name: config.toml's `model`,
    else the registry's default), pulling on first use with a progress bar."""
    return store.resolve(
        model_name(name), current().registry, offline=offline, with_draft=with_draft, pull_missing=_pull_missing
    )
