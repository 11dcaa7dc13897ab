"""An agent's configuration as text (`--config`) and in the agent's own
file (`--config --write`): Claude Code's settings.json gets the variables
under `env`, Codex's config.toml the provider table and the model,
opencode's opencode.json the provider and the model. What else the file
holds stays; the file as it was is first copied beside it
(NAME.localrun-backup-STAMP); a file that does not parse is refused, never
rewritten."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localrun import paths
from localrun.errors import ConfigError
from localrun.launch.agents import PROVIDER, TOKEN_VAR, AgentConfig, config_file


def env_lines(env: dict[str, str]) -> str:
    """``env`` as shell `export` lines."""
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items())


def _toml_value(value: str | int) -> str:
    return json.dumps(value)  # a JSON string is a TOML basic string, a JSON integer a TOML integer


_CODEX_TOP = ("model", "model_provider", "model_context_window")


def codex_toml(settings: dict[str, Any]) -> str:
    """Codex's settings as config.toml text: the top-level keys, then the provider's table."""
    top = "".join(f"{key} = {_toml_value(settings[key])}\n" for key in _CODEX_TOP if key in settings)
    provider = settings["model_providers"][PROVIDER]
    table = "".join(f"{key} = {_toml_value(value)}\n" for key, value in provider.items())
    return f"{top}\n[model_providers.{PROVIDER}]\n{table}"


def config_text(config: AgentConfig) -> str:
    """What `--config` prints: Claude Code's variables as `export` lines,
    Codex's config.toml text, opencode's opencode.json."""
    if config.agent == "claude":
        return env_lines(config.env)
    if config.agent == "codex":
        return codex_toml(config.settings)
    return json.dumps(config.settings, indent=2) + "\n"


def needs_env(config: AgentConfig) -> bool:
    """Whether the configuration leaves the token to the environment (TOKEN_VAR): Codex's and opencode's do."""
    return TOKEN_VAR in config.env


@dataclass(frozen=True)
class Written:
    """A configuration written: the file, the copy of what it held before
    (None: it was new, or unchanged), and whether it changed at all."""

    path: Path
    backup: Path | None
    changed: bool = True


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {paths.why_failed(exc)}") from exc


def _refuse(path: Path, why: str) -> ConfigError:
    return ConfigError(f"{path}: {why}; not rewritten", hint="fix the file, or add what `--config` prints by hand")


def _merged_json(path: Path, old: str | None, update: dict[str, Any]) -> str:
    try:
        data = json.loads(old) if old is not None and old.strip() else {}
    except json.JSONDecodeError as exc:
        raise _refuse(path, f"not plain JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise _refuse(path, "not a JSON object")
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}  # one level down: env, provider
        else:
            data[key] = value
    return json.dumps(data, indent=2) + "\n"


_HEADER = re.compile(r"^\s*\[")
_OURS = re.compile(rf"^\s*\[\s*model_providers\s*\.\s*\"?{PROVIDER}\"?\s*\]\s*(#.*)?$")
_TOP_KEYS = re.compile(r"^\s*(model|model_provider|model_context_window)\s*=")


def _merged_toml(path: Path, old: str | None, settings: dict[str, Any]) -> str:
    """config.toml with our top-level keys and provider table in place of
    any earlier ones, every other line (comments included) as it was."""
    text = old or ""
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _refuse(path, f"not valid TOML ({exc})") from None
    lines = text.splitlines()
    first_table = next((i for i, line in enumerate(lines) if _HEADER.match(line)), len(lines))
    preamble = [line for line in lines[:first_table] if not _TOP_KEYS.match(line)]
    kept: list[str] = []
    skipping = False
    for line in lines[first_table:]:
        if _HEADER.match(line):
            skipping = bool(_OURS.match(line))
        if not skipping:
            kept.append(line)
    ours = codex_toml(settings)
    top, _, table = ours.partition("\n\n")
    body = "\n".join([*preamble, *kept]).strip("\n")
    merged = f"{top}\n" + (f"{body}\n\n" if body else "\n") + table
    try:
        tomllib.loads(merged)
    except tomllib.TOMLDecodeError as exc:  # the file sets the provider some other way (inline, dotted keys)
        raise _refuse(path, f"it defines model_providers.{PROVIDER} in a way this cannot replace ({exc})") from None
    return merged


def _backup(path: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    backup = path.with_name(f"{path.name}.localrun-backup-{stamp}")
    n = 1
    while backup.exists():
        n += 1
        backup = path.with_name(f"{path.name}.localrun-backup-{stamp}-{n}")
    shutil.copy2(path, backup)
    return backup


def write_config(config: AgentConfig, path: Path | None = None) -> Written:
    """``config`` merged into the agent's configuration file (``path``:
    default where the agent reads it), the old file copied aside first."""
    path = path or config_file(config.agent)
    old = _read(path)
    if config.agent == "codex":
        new = _merged_toml(path, old, config.settings)
    else:
        new = _merged_json(path, old, config.settings)
    if old == new:
        return Written(path, None, changed=False)
    paths.ensure_dir(path.parent)
    backup = _backup(path) if old is not None else None
    paths.atomic_write(path, new)
    return Written(path, backup)
