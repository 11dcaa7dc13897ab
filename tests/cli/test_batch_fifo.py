"""`generate --batch` reads a FIFO as it reads a file: `--batch <(...)`,
`--batch /dev/stdin`, as `-f`, `--load` and `--messages` do."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path

from tests.helpers import cli, cli_process

PROMPTS = "alpha\nthe cat sat\n"


def _write_when_opened(fifo: Path, text: str) -> threading.Thread:
    def write() -> None:
        with contextlib.suppress(BrokenPipeError), fifo.open("w") as f:  # open waits for a reader
            f.write(text)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    return writer


def _ids_and_lengths(stdout: str) -> list[tuple[object, object]]:
    return [(r["id"], r["generated_tokens"]) for r in map(json.loads, stdout.splitlines())]


def _texts(stdout: str) -> list[str]:
    return [r["text"] for r in map(json.loads, stdout.splitlines())]


def test_a_fifo_is_read_as_a_file_is(tiny_model: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "prompts"
    os.mkfifo(fifo)
    writer = _write_when_opened(fifo, PROMPTS)
    try:
        res = cli("generate", "-m", str(tiny_model), "-t", "0", "-n", "3", "--batch", str(fifo))
    finally:
        if writer.is_alive():  # the command never opened it: let the writer go
            os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        writer.join(10)
    assert res.returncode == 0, res.stderr
    assert _ids_and_lengths(res.stdout) == [(1, 3), (2, 3)]
    file = tmp_path / "prompts.txt"
    file.write_text(PROMPTS)
    same = cli("generate", "-m", str(tiny_model), "-t", "0", "-n", "3", "--batch", str(file))
    assert _texts(same.stdout) == _texts(res.stdout)  # as from a file of the same lines


def test_dev_stdin_is_the_piped_input(tiny_model: Path, tmp_path: Path) -> None:
    res = cli_process("generate", "-m", str(tiny_model), "-t", "0", "-n", "3", "--batch", "/dev/stdin", input=PROMPTS)
    assert res.returncode == 0, res.stderr
    assert _ids_and_lengths(res.stdout) == [(1, 3), (2, 3)]
    missing = cli("generate", "-m", str(tiny_model), "--batch", str(tmp_path / "none.txt"))
    assert missing.returncode == 2 and "no such file" in missing.stderr
