"""The user's config file: defaults that apply when neither an option nor the
model's registry entry says otherwise.

    # ~/.config/localrun/config.toml (or $LOCALRUN_HOME/config/config.toml)
    [defaults]
    model = "qwen2.5-coder:0.5b"  # the model when -m is not given
    temperature = 0.2        # sampling temperature, 0 for greedy decoding
    max_tokens = 512         # stop a reply after this many tokens
    system = "Be brief."     # the system prompt
    kv_k = "q8_0"            # KV cache type for K: auto, f16, q8_0, q4_0
    kv_v = "q8_0"            # and for V
    flash_attn = "auto"      # auto, on, off
    threads = 2              # CPU threads
    draft = "auto"           # speculative decoding: a draft model, or a mode
    parallel = 4             # sequences decoded together in batch work
    memory_budget = "6GiB"   # weights + KV cache + compute (bytes or a size)
    markdown = false         # chat: replies as written, not rendered as Markdown

    [mcp.servers.files]      # an MCP server whose tools chat and generate offer (docs/tools.md)
    command = "npx"
    args = ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"]

Precedence everywhere: a command-line option (for the model, then
LOCALRUN_MODEL), then the model's registry defaults, then this file, then
localrun's built-in default. The file is
validated on load (the file, the key and the reason on error) and written
atomically (`localrun bench --save-defaults` writes it).
"""

from __future__ import annotations

import difflib
import json
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localrun import paths
from localrun.errors import ConfigError
from localrun.gguf.info import KV_BYTES_PER_ELEMENT
from localrun.units import parse_size

FLASH_ATTN_MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class UserConfig:
    """[defaults] of config.toml; None where the file says nothing."""

    model: str | None = None  # the model when -m is not given
    temperature: float | None = None
    max_tokens: int | None = None
    system: str | None = None  # the system prompt
    kv_k: str | None = None
    kv_v: str | None = None
    flash_attn: str | None = None
    threads: int | None = None
    draft: str | None = None
    parallel: int | None = None
    memory_budget: int | None = None  # bytes
    markdown: bool | None = None  # chat renders replies as Markdown
    mcp_servers: Mapping[str, Any] | None = None  # [mcp.servers.NAME] tables, as written (localrun.mcp reads them)


def config_file() -> Path:
    return paths.config_dir() / "config.toml"


def _fail(path: Path, key: str | None, reason: str, hint: str | None = None) -> ConfigError:
    where = f"{path}: [defaults] {key}" if key else str(path)
    return ConfigError(f"{where}: {reason}", hint=hint or "fix or remove the config file named above")


def _choice(path: Path, key: str, value: Any, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise _fail(path, key, f"{value!r} is not one of {', '.join(allowed)}")
    return value


def _positive_int(path: Path, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail(path, key, f"{value!r} must be a whole number of at least 1")
    return value


def _temperature(path: Path, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        raise _fail(path, key, f"{value!r} must be a number, 0 (greedy) or more")
    return float(value)


def _size(path: Path, key: str, value: Any) -> int:
    if isinstance(value, str):
        try:
            value = parse_size(value)
        except ValueError as exc:
            raise _fail(path, key, str(exc)) from None
    return _positive_int(path, key, value)


def _bool(path: Path, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail(path, key, f"{value!r} must be true or false")
    return value


def _text(path: Path, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _fail(path, key, f"{value!r} must be a non-empty string")
    return value


KV_TYPES = tuple(KV_BYTES_PER_ELEMENT)
_PARSERS: dict[str, Callable[[Path, str, Any], Any]] = {
    "model": _text,
    "temperature": _temperature,
    "max_tokens": _positive_int,
    "system": _text,
    "kv_k": lambda p, k, v: _choice(p, k, v, ("auto", *KV_TYPES)),
    "kv_v": lambda p, k, v: _choice(p, k, v, ("auto", *KV_TYPES)),
    "flash_attn": lambda p, k, v: _choice(p, k, v, FLASH_ATTN_MODES),
    "threads": _positive_int,
    "draft": _text,
    "parallel": _positive_int,
    "memory_budget": _size,
    "markdown": _bool,
}
KEYS = tuple(_PARSERS)


def parse(raw: Mapping[str, Any], path: Path) -> UserConfig:
    """Check the file's content (a parsed TOML document) and type it."""
    unknown = sorted(set(raw) - {"defaults", "mcp"})
    if unknown:
        reason = f"unknown top-level key{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}"
        raise _fail(path, None, reason, hint=_top_level_hint(unknown))
    defaults = raw.get("defaults", {})
    if not isinstance(defaults, dict):
        raise _fail(path, None, "'defaults' must be a table ([defaults])")
    values: dict[str, Any] = {}
    for key, value in defaults.items():
        if key not in _PARSERS:
            near = _near_key(key)
            raise _fail(
                path, key, f"unknown key (known: {', '.join(KEYS)})", hint=f"did you mean {near}?" if near else None
            )
        values[key] = _PARSERS[key](path, key, value)
    return UserConfig(**values, mcp_servers=_mcp_servers(raw.get("mcp"), path))


def _mcp_servers(mcp: Any, path: Path) -> dict[str, Any] | None:
    """[mcp.servers.NAME]: each server a table (its keys are checked when tools are used)."""
    if mcp is None:
        return None
    if not isinstance(mcp, dict) or set(mcp) - {"servers"}:
        raise ConfigError(f"{path}: [mcp] holds only [mcp.servers.NAME] tables", hint="see docs/tools.md")
    servers = mcp.get("servers", {})
    if not isinstance(servers, dict) or not all(isinstance(v, dict) for v in servers.values()):
        raise ConfigError(f"{path}: [mcp.servers] holds one table per server", hint="see docs/tools.md")
    return servers


def _near_key(key: str) -> str | None:
    """The key ``key`` was likely meant as: one it begins (`temp`, llama.cpp's
    word, is nearer `system` than `temperature` to difflib), else a close spelling."""
    near = [k for k in KEYS if len(key) >= 3 and k.startswith(key)] or difflib.get_close_matches(key, KEYS, n=1)
    return near[0] if near else None


def _top_level_hint(unknown: list[str]) -> str | None:
    """Keys written above any table (`model = ...` before `[defaults]`, or
    with none) belong in [defaults]; a table named near it was meant as it."""
    misplaced = [key for key in unknown if key in _PARSERS]
    if misplaced:
        verb, them = ("belongs", "it") if len(misplaced) == 1 else ("belong", "them")
        return f"{', '.join(misplaced)} {verb} in [defaults]: move {them} below a [defaults] line"
    if difflib.get_close_matches(unknown[0], ["defaults"], n=1):
        return "did you mean [defaults]?"
    return None


def _read_raw(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as exc:
        raise _fail(path, None, f"not valid TOML: {exc}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(path, None, f"cannot read: {paths.why_failed(exc)}") from exc


def load(path: Path | None = None) -> UserConfig:
    """The user's defaults; all None when there is no file."""
    path = path or config_file()
    return parse(_read_raw(path), path)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value), ensure_ascii=False)  # a JSON string is a TOML basic string


def _toml_any(value: Any) -> str:
    """A TOML value: a scalar, an array, or an inline table."""
    if isinstance(value, list):
        return "[" + ", ".join(_toml_any(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_any(v)}" for k, v in value.items()) + "}"
    return _toml_value(value)


def save_defaults(values: Mapping[str, Any], path: Path | None = None) -> Path:
    """Merge ``values`` into [defaults] (checked as on load) and write the file
    atomically: a temporary file in the same folder, then a rename. Comments in
    an existing file are not kept."""
    path = path or config_file()
    raw = _read_raw(path)
    parse(raw, path)  # refuse to build on a broken file
    merged = {**raw.get("defaults", {}), **values}
    parse({"defaults": merged}, path)
    lines = ["# localrun user defaults (localrun bench --save-defaults); keys: docs/config.md", "[defaults]"]
    lines += [f"{key} = {_toml_value(merged[key])}" for key in KEYS if key in merged]
    for name, server in (raw.get("mcp", {}).get("servers") or {}).items():  # kept as they were
        lines += ["", f"[mcp.servers.{json.dumps(name)}]", *(f"{k} = {_toml_any(v)}" for k, v in server.items())]
    paths.ensure_dir(path.parent)
    paths.atomic_write(path, "\n".join(lines) + "\n")
    return path
