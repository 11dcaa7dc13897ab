"""Help in the usual words: `--model TEXT`, `PROMPT`, not `<str>` or `{name}`."""

from __future__ import annotations

import re

import pytest

from localrun.cli._help import plain_type
from tests.helpers import cli

COMMANDS = [
    ("generate",),
    ("chat",),
    ("serve",),
    ("pull",),
    ("list",),
    ("rm",),
    ("show",),
    ("bench",),
    ("tune",),
    ("quantize",),
    ("cache", "clear"),
    ("logs",),
    ("logs", "show"),
    ("logs", "stats"),
    ("logs", "rm"),
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_names_values_as_the_usual_command_line_does(command: tuple[str, ...]) -> None:
    res = cli(*command, "--help")
    assert res.returncode == 0, res.stderr
    assert not re.search(r"<[a-z]+[\[,> ]|\{[a-z_]+\}", res.stdout), res.stdout


def test_arguments_and_options_read_plainly() -> None:
    shown = cli("show", "--help").stdout
    assert "Usage: localrun show [OPTIONS] NAME" in shown and "  NAME  Alias" in shown
    assert "Usage: localrun generate [OPTIONS] [PROMPT]" in cli("generate", "--help").stdout
    assert "-n, --max-tokens INTEGER" in cli("generate", "--help").stdout
    assert "--compare TEXT TEXT" in cli("logs", "stats", "--help").stdout


def test_plain_type() -> None:
    assert [plain_type(x) for x in ("<str>", "<list[str]>", "<float range>", "<int>", "<path>")] == [
        "TEXT",
        "TEXT",
        "FLOAT",
        "INTEGER",
        "PATH",
    ]
    assert plain_type("<str,str>...") == "TEXT TEXT" and plain_type("[SHELL]") == "[SHELL]"
