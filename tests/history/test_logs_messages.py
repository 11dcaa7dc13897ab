"""What `logs` says when it shows nothing: an empty history, filters that match
no run, a command name no command logs under, an empty side of a comparison."""

from __future__ import annotations

from localrun.cli.logs import Command
from localrun.history.query import COMMANDS
from tests.helpers import cli
from tests.history.test_store import record


def test_an_empty_history_and_filters_that_match_nothing_are_told_apart() -> None:
    assert cli("logs").stderr == "no runs logged\n"
    record("rename the variable foo")
    for args in (("-q", "zzz"), ("--command", "serve"), ("--model", "other"), ("--since", "2099-01-01")):
        res = cli("logs", *args)
        assert res.returncode == 0 and res.stdout == "" and res.stderr == "no runs match\n", args
    assert "rename the variable foo" in cli("logs", "-q", "foo").stdout


def test_a_command_name_no_command_logs_under_is_refused() -> None:
    record("p")
    for args in (("logs", "--command", "chatt"), ("logs", "stats", "--command", "chatt")):
        res = cli(*args)
        assert res.returncode == 2
        assert res.stderr.splitlines() == [
            "error: no command 'chatt' logs runs",
            "hint: did you mean chat? use one of: generate, chat, batch, serve",
        ]
    assert all(name in str(Command.__metadata__[0].help) for name in COMMANDS)  # type: ignore[attr-defined]


def test_a_comparison_with_an_empty_side_says_so() -> None:
    record("p", kv="f16")
    res = cli("logs", "stats", "--compare", "kv=q9", "kv=f16")
    assert res.returncode == 0, res.stderr
    assert res.stderr == "no runs match kv=q9: nothing to compare on that side\n"
    both = cli("logs", "stats", "--compare", "kv=f16", "kv=f16")
    assert both.stderr == ""
