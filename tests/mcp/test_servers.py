"""Which servers a session uses: mcpServers JSON files and config.toml's
[mcp.servers] tables; each entry that cannot be used is one line, the rest go on."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from localrun.config import parse, save_defaults
from localrun.errors import ConfigError
from localrun.mcp.servers import ServerList, read_file, server_list


def write(tmp_path: Path, document: object, name: str = "mcp.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return path


def test_claude_desktop_file_gives_stdio_and_http_servers(tmp_path: Path) -> None:
    path = write(tmp_path, {"mcpServers": {
        "files": {"command": "npx", "args": ["-y", "server-filesystem", "/tmp"], "env": {"A": "1"}},
        "remote": {"url": "http://127.0.0.1:8000/mcp", "headers": {"Authorization": "Bearer x"}, "type": "http"},
        "off": {"command": "x", "disabled": True},
    }})  # fmt: skip
    found = server_list([path], None, "config.toml")
    assert found.problems == []
    files, remote = found.servers
    assert (files.name, files.transport, files.command, files.args, dict(files.env)) == (
        "files", "stdio", "npx", ("-y", "server-filesystem", "/tmp"), {"A": "1"}
    )  # fmt: skip
    assert (remote.transport, remote.url, dict(remote.headers)) == (
        "http", "http://127.0.0.1:8000/mcp", {"Authorization": "Bearer x"}
    )  # fmt: skip


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ({"args": ["x"]}, "give a command"),
        ({"command": "a", "url": "http://h"}, "one of them"),
        ({"command": "a", "args": "x y"}, "args is a list of strings"),
        ({"command": "a", "env": {"A": 1}}, "env maps names to strings"),
        ({"url": "ftp://h"}, "http:// or https://"),
        ({"url": "http://h", "type": "sse"}, "not supported"),
        ({"command": "a", "colour": "red"}, "unknown key colour"),
        ({"command": "a", "allow": "all"}, "allow is a list"),
        ("npx", "an object"),
    ],
)
def test_each_bad_entry_is_one_line_and_the_others_go_on(tmp_path: Path, entry: object, said: str) -> None:
    path = write(tmp_path, {"mcpServers": {"bad": entry, "good": {"command": "ok"}}})
    found = server_list([path], None, "config.toml")
    assert [s.name for s in found.servers] == ["good"]
    assert len(found.problems) == 1
    assert said in found.problems[0] and "'bad'" in found.problems[0] and str(path) in found.problems[0]


def test_a_server_name_that_cannot_prefix_a_tool_name_is_refused(tmp_path: Path) -> None:
    found = server_list([write(tmp_path, {"mcpServers": {"my server": {"command": "a"}}})], None, "c")
    assert found.servers == [] and "letters, digits" in found.problems[0]


@pytest.mark.parametrize(
    ("text", "said"),
    [("{not json", "not JSON"), (json.dumps({"servers": 3}), 'no "mcpServers"'), (json.dumps([1]), 'no "mcpServers"')],
)
def test_a_file_that_does_not_parse_is_one_line(tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(text)
    found = ServerList()
    read_file(path, found)
    assert found.servers == [] and len(found.problems) == 1 and said in found.problems[0]


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    found = server_list([tmp_path / "nowhere.json"], None, "c")
    assert found.problems == [f"--mcp {tmp_path / 'nowhere.json'}: cannot read it: no such file"]


def test_a_file_on_the_command_line_replaces_the_config_files_server_of_that_name(tmp_path: Path) -> None:
    path = write(tmp_path, {"mcpServers": {"files": {"command": "mine"}}})
    found = server_list([path], {"files": {"command": "theirs"}, "other": {"url": "https://x"}}, "config.toml")
    assert [(s.name, s.command) for s in found.servers] == [("other", None), ("files", "mine")]


def test_config_toml_takes_mcp_servers_tables(tmp_path: Path) -> None:
    raw = tomllib.loads(
        '[defaults]\ntemperature = 0.2\n\n[mcp.servers.files]\ncommand = "npx"\nargs = ["-y", "fs"]\n'
        'allow_read_only = true\n'
    )  # fmt: skip
    config = parse(raw, tmp_path / "config.toml")
    assert config.temperature == 0.2
    found = server_list([], config.mcp_servers, "config.toml")
    assert [(s.name, s.command, s.args, s.allow_read_only) for s in found.servers] == [
        ("files", "npx", ("-y", "fs"), True)
    ]


@pytest.mark.parametrize("text", ["[mcp]\nservers = 3\n", "[mcp.other]\nx = 1\n", '[mcp.servers]\nfiles = "npx"\n'])
def test_config_toml_with_a_broken_mcp_table_names_it(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError, match=r"\[mcp"):
        parse(tomllib.loads(text), tmp_path / "config.toml")


def test_saving_defaults_keeps_the_mcp_servers(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[mcp.servers.files]\ncommand = "npx"\nargs = ["-y", "fs"]\nenv = {TOKEN = "t"}\n')
    save_defaults({"threads": 2}, path)
    raw = tomllib.loads(path.read_text())
    assert raw["defaults"] == {"threads": 2}
    assert raw["mcp"]["servers"]["files"] == {"command": "npx", "args": ["-y", "fs"], "env": {"TOKEN": "t"}}
