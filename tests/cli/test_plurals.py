"""One count reads as English everywhere: "1 token", "1 entry", "1 ID was";
json's own "starting at" is not followed by another "at"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localrun.events import Stats
from localrun.ui.stream import footer
from localrun.ui.text import stats_line
from localrun.units import count, json_error
from tests.helpers import cli
from tests.history.test_store import record


def test_count() -> None:
    assert [count(n, "token") for n in (0, 1, 2)] == ["0 tokens", "1 token", "2 tokens"]
    assert count(1, "entry", "entries") == "1 entry" and count(3, "entry", "entries") == "3 entries"


def test_one_token_is_singular_in_the_stats_and_the_footer() -> None:
    line = stats_line(Stats(1, 1, 0.1, 10.0, 0.2, "length"))
    assert line.startswith("1 token, ") and "prompt 1 token at" in line
    assert footer(1, 10.0, 0.1, 0.2, "length", None).plain.startswith("1 token  ·")


def test_logs_rm_counts_the_ids_it_did_not_find() -> None:
    record("p")
    one = cli("logs", "rm", "1", "99")
    assert one.stderr == "warning: 1 ID was not in the history\n" and one.stdout == "removed 1 run\n"
    two = cli("logs", "rm", "98", "99")
    assert two.stderr == "warning: 2 IDs were not in the history\n" and two.stdout == "removed 0 runs\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [('{"type": "str', "Unterminated string starting at line 1, column 10"), ("{", "Expecting property name")],
)
def test_json_errors_read_once(text: str, message: str) -> None:
    with pytest.raises(json.JSONDecodeError) as caught:
        json.loads(text)
    assert json_error(caught.value).startswith(message) and " at at " not in json_error(caught.value)


def test_a_schema_file_that_is_not_json_names_where(tmp_path: Path, tiny_model: Path) -> None:
    schema = tmp_path / "s.json"
    schema.write_text('{"type": "str')
    res = cli("generate", "-m", str(tiny_model), "--schema", str(schema), "hi")
    assert res.returncode == 2 and "Unterminated string starting at line 1, column 10" in res.stderr, res.stderr
