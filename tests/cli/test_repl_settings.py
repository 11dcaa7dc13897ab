"""Chat's `/set NAME VALUE`, a bare `/set`, `/show` and `/model NAME` (issue 54):
in process on the tiny model, and on a real terminal switching models."""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest
from rich.console import Console

from localrun.cli.repl import Repl
from localrun.runtime.chat import ChatSession
from localrun.runtime.engine import Engine
from localrun.runtime.sampling import SamplingParams
from tests.helpers import engine_config
from tests.tinymodel import CHATML


@pytest.fixture
def repl(tiny_model: Path, tmp_path: Path) -> Iterator[tuple[Repl, io.StringIO]]:
    screen = io.StringIO()
    with Engine(engine_config(tiny_model, n_ctx=512, n_threads=2)) as engine:
        session = ChatSession(engine, CHATML, SamplingParams(), max_tokens=64, model=str(tiny_model))
        yield Repl(session, Console(file=screen, width=200), history=tmp_path / "h", title="tiny.gguf (F32)"), screen


def test_set_name_value_as_the_command_line_spells_them(repl: tuple[Repl, io.StringIO]) -> None:
    shell, screen = repl
    session = shell.session
    for line in ("/set temperature 0.5", "/set top-p 0.9", "/set top_k 12", "/set max_tokens 7", "/set seed 42"):
        assert shell._command(line) is True
    sampling = session.sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.seed) == (0.5, 0.9, 12, 42)
    assert session.max_tokens == 7
    assert "temperature set to 0.5" in screen.getvalue()
    shell._command("/set parameter temperature 0.25")  # ollama's spelling still works
    shell._command("/set seed random")
    assert (session.sampling.temperature, session.sampling.seed) == (0.25, None)
    shell._command("/set temperature hot")
    assert "takes a number, not 'hot'" in screen.getvalue() and session.sampling.temperature == 0.25
    shell._command("/set warmth 3")
    assert "unknown setting 'warmth'" in screen.getvalue()
    shell._command("/set top_p 3")
    assert "--top-p must be" in screen.getvalue() and session.sampling.top_p == 0.9


def test_a_bare_set_lists_every_setting_as_it_stands(repl: tuple[Repl, io.StringIO]) -> None:
    shell, screen = repl
    shell._command("/set temperature 0.3")
    shell._command("/set system be brief")
    screen.seek(0)
    screen.truncate()
    assert shell._command("/set") is True
    listed = {line.split()[0]: line.split(None, 1)[1] for line in screen.getvalue().splitlines() if line[:2] == "  "}
    assert listed["temperature"] == "0.3" and listed["top_k"] == "40" and listed["num_predict"] == "64"
    assert listed["seed"].startswith("none") and listed["system"] == "be brief"
    assert set(listed) >= {"top_p", "min_p", "repeat_penalty", "repeat_last_n"}


def test_show_gives_the_model_its_shape_and_the_settings(repl: tuple[Repl, io.StringIO], tiny_model: Path) -> None:
    shell, screen = repl
    shell._command("/set top_k 9")
    assert shell._command("/show") is True
    shown = screen.getvalue()
    for expected in (str(tiny_model), "architecture", "llama", "quantization", "context", "512 tokens", "top_k"):
        assert expected in shown, expected
    assert "  top_k" in shown and " 9" in shown.split("  top_k", 1)[1].splitlines()[0]
    screen.seek(0)
    screen.truncate()
    shell._command("/show template")
    assert "<|im_start|>" in screen.getvalue()
    shell._command("/show license")
    assert "/show info, parameters, system or template" in screen.getvalue()
    shell._command("/model wide")  # a Repl given no way to load another says so
    assert "cannot change its model" in screen.getvalue()


def chat_on_a_terminal(model: Path, *, columns: int, timeout: int) -> pexpect.spawn:
    """`localrun chat` on ``model`` (4 tokens a turn, greedy) on a pseudo-terminal ``columns`` wide."""
    return pexpect.spawn(
        sys.executable,
        ["-m", "localrun", "chat", "-m", str(model), "-n", "4", "-t", "0"],
        env={**os.environ, "TERM": "xterm-256color", "COLUMNS": str(columns), "LINES": "30"},
        encoding="utf-8",
        timeout=timeout,
        dimensions=(30, columns),
    )


@pytest.mark.pty
def test_model_switches_and_the_conversation_goes_on(tiny_model: Path, wide_model: Path, tmp_path: Path) -> None:
    saved = tmp_path / "saved.json"
    child = chat_on_a_terminal(tiny_model, columns=120, timeout=180)
    child.expect(">>> ")
    child.sendline("/set temperature 0.7")
    child.expect("temperature set to 0.7")
    child.expect(">>> ")
    child.sendline("hello model")
    child.expect("stop: length")
    child.expect(">>> ")
    child.sendline("/model no-such-model:7b")
    child.expect("error")
    child.expect(">>> ")
    child.sendline(f"/model {wide_model}")
    child.expect("wide.gguf")
    child.expect("conversation of 1 turn goes on")
    child.expect(">>> ")
    child.sendline("/show")
    child.expect(str(wide_model))
    child.expect("0.7")  # the settings carried over
    child.expect(">>> ")
    child.sendline("and again")
    child.expect("stop: length")
    child.expect(">>> ")
    child.sendline(f"/save {saved}")
    child.expect("saved 2 turns")
    child.expect(">>> ")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    conversation = json.loads(saved.read_text())
    assert conversation["model"] == str(wide_model)
    assert [m["content"] for m in conversation["messages"] if m["role"] == "user"] == ["hello model", "and again"]


def _unloadable(model: Path, to: Path) -> Path:
    """``model`` with a tensor renamed in its header (the name's length kept):
    it reads and plans as the model does, and llama.cpp does not load it (a tensor is missing)."""
    data = model.read_bytes()
    name = b"blk.0.attn_q.weight"
    assert data.count(name) == 1
    to.write_bytes(data.replace(name, b"blk.0.attn_x.weight"))
    return to


@pytest.mark.pty
def test_model_that_leaves_no_model_loaded_ends_the_session(tiny_model: Path, wide_model: Path, tmp_path: Path) -> None:
    """`/model NAME` where NAME fails to load and the model before it fails to
    load again: the session ends, saying so (no turn on a closed model)."""
    first = tmp_path / "first.gguf"
    first.write_bytes(tiny_model.read_bytes())
    child = chat_on_a_terminal(first, columns=200, timeout=60)
    try:
        child.expect(">>> ")
        # the loaded model's file replaced (its mapping keeps the old one): it cannot load again
        _unloadable(tiny_model, tmp_path / "cut.gguf").replace(first)
        broken = _unloadable(wide_model, tmp_path / "broken.gguf")
        child.sendline(f"/model {broken}")
        child.expect("no model is loaded, the session ends")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    screen = child.before or ""
    assert ">>> " not in screen and "Traceback" not in screen  # no prompt after it, no crash
