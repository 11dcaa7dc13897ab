"""Input that is not UTF-8 names the input and the byte's offset in it, with a
hint, before any model loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import cli, cli_process

HINT = "hint: localrun reads UTF-8 text: convert it first"


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"caf\xe9", "error: stdin is not UTF-8 text (byte 0xe9 at offset 3)"),
        (b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)), "error: stdin is not UTF-8 text (byte 0x80 at offset 136)"),
    ],
)
def test_stdin_bytes_that_are_not_utf8(tiny_model: Path, data: bytes, error: str) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "localrun", "generate", "-m", str(tiny_model), "-"],
        input=data,
        capture_output=True,
        timeout=120,
        env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"},  # the locale's decoding plays no part
        check=False,
    )
    err = res.stderr.decode()
    assert res.returncode == 2 and err.splitlines()[0] == error and err.splitlines()[1].startswith(HINT), err
    assert "codec" not in err and res.stdout == b""


def test_an_argument_or_stdin_read_as_text_names_itself(tiny_model: Path) -> None:
    # Python keeps bytes that are not UTF-8 in arguments and text streams as lone surrogates
    latin1 = b"na\xefve caf\xe9".decode("utf-8", errors="surrogateescape")
    res = cli("generate", "-m", str(tiny_model), latin1)
    assert res.returncode == 2
    assert res.stderr.splitlines() == [
        "error: the prompt argument is not UTF-8 text (byte 0xef at offset 2)",
        "hint: localrun reads UTF-8 text: convert it first (e.g. iconv -f latin1 -t utf-8)",
    ]
    piped = cli("generate", "-m", str(tiny_model), "summarize", input="ok\n" + latin1)
    assert piped.returncode == 2 and piped.stderr.startswith("error: stdin is not UTF-8 text (byte 0xef at offset 5)")
    fine = cli("generate", "-m", str(tiny_model), "-n", "2", "-", input="naïve café")
    assert fine.returncode == 0, fine.stderr


@pytest.mark.parametrize("piped", ["", " \n\n"])
def test_an_empty_pipe_beside_a_prompt_is_refused(tiny_model: Path, piped: str) -> None:
    """`cat missing.txt | localrun generate "Summarize"`: the pipe brought no text; the
    instruction is not sent alone (the model would answer about nothing and exit 0)."""
    res = cli_process("generate", "-m", str(tiny_model), "-n", "2", "Summarize", input=piped)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("error: stdin is empty") and res.stdout == ""


def test_a_prompt_with_stdin_from_nothing_runs(tiny_model: Path, tmp_path: Path) -> None:
    """/dev/null (cron, a service) is not a pipe: the prompt alone runs; an empty file given with < is refused."""
    assert cli_process("generate", "-m", str(tiny_model), "-n", "2", "Summarize").returncode == 0
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with empty.open() as stdin:
        res = subprocess.run(
            [sys.executable, "-m", "localrun", "generate", "-m", str(tiny_model), "-n", "2", "Summarize"],
            stdin=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert res.returncode == 2 and "stdin is empty" in res.stderr
