"""Errors the command line itself finds, against the README's rules: one
`error:` line and a hint, Click's and pydantic's wording nowhere, and the exit
code of the README's table."""

from __future__ import annotations

import pytest

from tests.helpers import cli


def _one_error(args: tuple[str, ...]) -> tuple[str, str]:
    res = cli(*args)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), res.stderr
    assert "Usage:" not in res.stderr and "Input should be" not in res.stderr and res.stdout == ""
    return lines[0].removeprefix("error: "), lines[1].removeprefix("hint: ")


@pytest.mark.parametrize(
    ("args", "error", "hint"),
    [
        (("logs", "-n", "abc"), "-n/--limit takes a whole number, not 'abc'", "localrun logs --help"),
        (("generate", "-t", "hot", "hi"), "--temperature/-t takes a number, not 'hot'", "localrun generate --help"),
        (("logs", "show", "x"), "RUN_ID takes a whole number, not 'x'", "localrun logs show --help"),
        (("logs", "show"), "missing RUN_ID", "localrun logs show --help"),
        (("generate", "--schem", "x"), "no such option --schem", "did you mean --schema"),
        (("bogus",), "no such command 'bogus'", "localrun --help"),
        (("list", "extra"), "unexpected extra argument: extra", "localrun list --help"),
    ],
)
def test_parsing_errors_are_one_line_with_a_hint(args: tuple[str, ...], error: str, hint: str) -> None:
    got_error, got_hint = _one_error(args)
    assert got_error == error and hint in got_hint


def test_words_after_the_prompt_get_a_hint_to_quote_it() -> None:
    error, hint = _one_error(("generate", "-n", "4", "hi", "there", "you"))
    assert error == "unexpected extra arguments: there you"
    assert hint == "quote the prompt as one argument: localrun generate 'hi there you'"


def test_a_registry_model_not_downloaded_exits_3() -> None:
    shown = cli("show", "qwen2.5-coder:0.5b")
    assert shown.returncode == 3 and shown.stderr.startswith("error: qwen2.5-coder:0.5b is not downloaded")
    offline = cli("generate", "-m", "qwen2.5-coder:0.5b", "--offline", "hi")
    assert offline.returncode == 3 and "hint: localrun pull qwen2.5-coder:0.5b" in offline.stderr


def test_a_group_alone_still_shows_its_help() -> None:
    res = cli("cache")
    assert "Usage: localrun cache" in res.stdout + res.stderr and "error:" not in res.stderr
