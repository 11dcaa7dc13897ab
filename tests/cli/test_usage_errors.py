"""Errors the command line itself finds, against the README's rules: one
`error:` line and a hint, Click's and pydantic's wording nowhere, and the exit
code of the README's table."""

from __future__ import annotations

from pathlib import Path

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
        (("stats",), "no such command 'stats'", "did you mean localrun logs stats? localrun --help"),
        (("clear",), "no such command 'clear'", "did you mean localrun cache clear?"),
        (("lst",), "no such command 'lst'", "did you mean 'list'?"),
        (("list", "extra"), "unexpected extra argument: extra", "localrun list --help"),
    ],
)
def test_parsing_errors_are_one_line_with_a_hint(args: tuple[str, ...], error: str, hint: str) -> None:
    got_error, got_hint = _one_error(args)
    assert got_error == error and hint in got_hint


@pytest.mark.parametrize("command", ["generate", "chat", "serve", "embed"])
def test_an_unknown_option_suggests_only_a_close_one(command: str) -> None:
    """Two long options share their dashes: that alone is no likeness (`--bogus` is not `--verbose`)."""
    error, hint = _one_error((command, "--bogus"))
    assert error == "no such option --bogus" and hint == f"localrun {command} --help shows the usage"
    error, hint = _one_error((command, "--verbos"))
    assert error == "no such option --verbos" and hint.startswith("did you mean --verbose? ")


def test_words_after_the_prompt_get_a_hint_to_quote_it() -> None:
    error, hint = _one_error(("generate", "-n", "4", "hi", "there", "you"))
    assert error == "unexpected extra arguments: there you"
    assert hint == "quote the prompt as one argument: localrun generate 'hi there you'"


def test_a_registry_model_not_downloaded_exits_3() -> None:
    shown = cli("show", "qwen2.5-coder:0.5b")
    assert shown.returncode == 3 and shown.stderr.startswith("error: qwen2.5-coder:0.5b is not downloaded")
    offline = cli("generate", "-m", "qwen2.5-coder:0.5b", "--offline", "hi")
    assert offline.returncode == 3 and "hint: localrun pull qwen2.5-coder:0.5b" in offline.stderr


def test_localrun_alone_still_shows_its_help() -> None:
    res = cli()
    assert "Usage: localrun" in res.stdout + res.stderr and "error:" not in res.stderr


def test_cache_alone_says_what_cache_info_says_as_logs_alone_lists() -> None:
    res = cli("cache")
    assert res.returncode == 0 and "error:" not in res.stderr
    assert res.stdout == cli("cache", "info").stdout and "0 entries" in res.stdout


def test_stats_with_json_is_refused_not_ignored(tiny_model: Path) -> None:
    for command in (("generate", "hi"), ("chat",)):
        res = cli(*command, "-m", str(tiny_model), "--json", "--stats", input="hi\n")
        assert res.returncode == 2
        assert res.stderr.startswith("error: --stats and --json both report the figures"), res.stderr


def test_generate_dash_on_a_terminal_says_it_reads_the_prompt(tiny_model: Path) -> None:
    res = cli("generate", "-m", str(tiny_model), "-n", "2", "-", input="hi", stdin_tty=True)
    assert res.returncode == 0, res.stderr
    assert "reading the prompt from the terminal: end it with Ctrl-D" in res.stderr
    piped = cli("generate", "-m", str(tiny_model), "-n", "2", "-", input="hi")
    assert "reading the prompt" not in piped.stderr


def test_a_context_beyond_the_trained_one_is_said(tiny_model: Path) -> None:
    res = cli("generate", "-m", str(tiny_model), "-n", "2", "--ctx", "1024", "hi")
    assert res.returncode == 0, res.stderr
    assert "warning: --ctx 1024 is beyond the 512 tokens tiny.gguf" in res.stderr  # the fixture's trained context
    for fits in (("--ctx", "512"), ()):
        assert "beyond" not in cli("generate", "-m", str(tiny_model), "-n", "2", *fits, "hi").stderr
    chatted = cli("chat", "-m", str(tiny_model), "-n", "2", "--ctx", "1024", input="hi\n")
    assert chatted.returncode == 0 and "is beyond the 512 tokens" in chatted.stderr
