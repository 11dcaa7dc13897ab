"""Which MCP servers a session uses: the ``mcpServers`` JSON that Claude
Desktop, Cursor and llama-server read (``--mcp FILE``), and config.toml's
``[mcp.servers.NAME]`` tables. A server is a command to start (stdio:
``command``, ``args``, ``env``, ``cwd``) or an address (streamable HTTP:
``url``, ``headers``). Nothing here raises on what a file holds: an entry
that cannot be used is one line in ``problems``, and the others go on."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localrun.paths import why_failed

# the name a tool is offered under is `<server>_<tool>`: letters, digits, _ and -
_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_KNOWN = {
    "command",
    "args",
    "env",
    "cwd",
    "url",
    "headers",
    "type",
    "transport",
    "disabled",
    "allow",
    "alwaysAllow",
    "allow_read_only",
    "allowReadOnly",
    "description",
    "timeout",
}


@dataclass(frozen=True)
class ServerSpec:
    """One server: started with ``command`` (stdio), or reached at ``url`` (streamable HTTP)."""

    name: str
    source: str  # where it was declared, for messages
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    allow: tuple[str, ...] = ()  # its tools (their own names) that run without asking
    allow_read_only: bool = False  # its tools marked read-only run without asking

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"


@dataclass
class ServerList:
    servers: list[ServerSpec] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def add(self, spec: ServerSpec) -> None:
        """A later declaration of the same name replaces the earlier one (a file given on the command line wins)."""
        self.servers = [s for s in self.servers if s.name != spec.name] + [spec]


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _string_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def server_spec(name: str, entry: Any, source: str) -> ServerSpec | str | None:
    """One entry of ``mcpServers`` (or one [mcp.servers.NAME] table): its
    spec, None when it is disabled, or why it cannot be used."""
    where = f"{source}: server {name!r}"
    if isinstance(entry, dict) and entry.get("disabled") is True:
        return None
    problem = _shape_problem(name, entry)
    if problem is not None:
        return f"{where}: {problem}"
    allow = tuple(entry.get("allow") or entry.get("alwaysAllow") or [])
    read_only = bool(entry.get("allow_read_only", entry.get("allowReadOnly", False)))
    if entry.get("command") is not None:
        problem = _stdio_problem(entry)
        if problem is not None:
            return f"{where}: {problem}"
        command, args, env, cwd = entry["command"], entry.get("args", []), entry.get("env", {}), entry.get("cwd")
        return ServerSpec(name, source, command=command, args=tuple(args), env=env, cwd=cwd, allow=allow,
                          allow_read_only=read_only)  # fmt: skip
    url, headers = entry["url"], entry.get("headers", {})
    problem = _http_problem(url, headers)
    if problem is not None:
        return f"{where}: {problem}"
    return ServerSpec(name, source, url=url, headers=headers, allow=allow, allow_read_only=read_only)


def _http_problem(url: Any, headers: Any) -> str | None:
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        return "url is an http:// or https:// address"
    if not _string_map(headers):
        return "headers maps names to strings"
    return None


def _shape_problem(name: str, entry: Any) -> str | None:  # noqa: PLR0911 (one reason a line)
    """What is wrong with an entry whatever its transport, if anything."""
    if not _NAME.match(name):
        return "a server's name is letters, digits, _ and - (its tools are named <server>_<tool>)"
    if not isinstance(entry, dict):
        return "an entry is an object with a command or a url"
    unknown = sorted(set(entry) - _KNOWN)
    if unknown:
        return f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}"
    if (entry.get("command") is None) == (entry.get("url") is None):
        return "give a command (a server to start) or a url (one to reach), one of them"
    kind = entry.get("type", entry.get("transport"))
    if kind is not None and kind not in ("stdio", "http", "streamable-http", "streamableHttp"):
        return f"transport {kind!r} is not supported (stdio or streamable HTTP)"
    if not _strings(entry.get("allow", entry.get("alwaysAllow", []))):
        return "allow is a list of tool names"
    if not isinstance(entry.get("allow_read_only", entry.get("allowReadOnly", False)), bool):
        return "allow_read_only is true or false"
    return None


def _stdio_problem(entry: dict[str, Any]) -> str | None:
    command, cwd = entry["command"], entry.get("cwd")
    if not isinstance(command, str) or not command.strip():
        return "command is the program to start"
    if not _strings(entry.get("args", [])):
        return "args is a list of strings"
    if not _string_map(entry.get("env", {})):
        return "env maps names to strings"
    if cwd is not None and not isinstance(cwd, str):
        return "cwd is a folder"
    return None


def _add_all(found: ServerList, servers: Mapping[str, Any], source: str) -> None:
    for name, entry in servers.items():
        spec = server_spec(str(name), entry, source)
        if isinstance(spec, str):
            found.problems.append(spec)
        elif spec is not None:
            found.add(spec)


def read_file(path: Path, found: ServerList) -> None:
    """The servers of an ``mcpServers`` JSON file (a bare map of servers is taken too)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        found.problems.append(f"--mcp {path}: cannot read it: {why_failed(exc)}")
        return
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        found.problems.append(f"--mcp {path}: not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})")
        return
    servers = document.get("mcpServers", document.get("servers")) if isinstance(document, dict) else None
    if not isinstance(servers, dict):
        found.problems.append(f'--mcp {path}: no "mcpServers" object (the format Claude Desktop and Cursor read)')
        return
    _add_all(found, servers, str(path))


def server_list(files: list[Path], configured: Mapping[str, Any] | None, config_source: str) -> ServerList:
    """The config file's servers, then each file's (a name given again replaces the earlier entry)."""
    found = ServerList()
    if configured:
        _add_all(found, configured, f"{config_source} [mcp.servers]")
    for path in files:
        read_file(path, found)
    return found
