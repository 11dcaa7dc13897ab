"""The note on which KV cache type auto chose: at a terminal only when it is
not f16; with --verbose always; in --json always."""

from __future__ import annotations

import io
import json
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from localrun import config, paths
from localrun.cli import main
from localrun.cli._env import Environment
from localrun.gguf.info import describe
from localrun.gguf.reader import read_gguf
from localrun.settings import Options, resolve
from tests.tinymodel import write_tiny_model


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Head size 32: what quantized KV cache blocks need."""
    return write_tiny_model(tmp_path_factory.mktemp("kv") / "wide.gguf", n_embd=128, n_head=4, n_head_kv=2)


def at_terminal(*args: str, stdin: str = "") -> tuple[int, str, str]:
    """`localrun ARGS` with stderr a terminal (stdout a pipe): (code, stdout, stderr)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    code = main(list(args), Environment(io.StringIO(stdin), stdout, stderr, stdin_isatty=False, stderr_isatty=True))
    return code, stdout.getvalue(), stderr.getvalue()


def test_nothing_is_said_when_the_default_fits(wide_model: Path) -> None:
    code, _, err = at_terminal("generate", "-m", str(wide_model), "-n", "2", "hi")
    assert code == 0 and "kv cache" not in err, err


def test_verbose_and_json_give_the_reason(wide_model: Path) -> None:
    code, _, err = at_terminal("generate", "--verbose", "-m", str(wide_model), "-n", "2", "hi")
    assert code == 0 and "kv cache f16/f16: " in err
    code, out, err = at_terminal("generate", "--json", "-m", str(wide_model), "-n", "2", "hi")
    assert code == 0 and "kv cache" not in err
    done = json.loads(out.splitlines()[-1])
    assert done["settings"]["type_k"]["why"].startswith("f16/f16: ")


def test_a_quantized_choice_is_said(wide_model: Path) -> None:
    path = config.config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    shape = describe(read_gguf(wide_model))
    q8_0, smallest = shape.memory_needed(512, "q8_0", "q8_0"), shape.memory_needed(512, "q8_0", "q4_0", "on")
    budget = (q8_0 + smallest) // 2  # too little for 512 tokens of f16 or q8_0 cache, enough for the smallest
    assert smallest <= budget < q8_0
    path.write_text(f"[defaults]\nmemory_budget = {budget}\n")
    code, _, err = at_terminal("generate", "-m", str(wide_model), "--ctx", "512", "-n", "2", "hi")
    assert code == 0 and "kv cache q8_0/q4_0: " in err, err


def test_only_a_chosen_type_other_than_f16_is_news() -> None:
    settled = resolve(Options(), None, config.UserConfig())
    assert not settled.kv_news  # nothing chosen yet
    chosen = replace(settled, type_k="f16", type_v="f16", reasons={"kv": "f16/f16: fits"})
    assert not chosen.kv_news
    assert replace(chosen, type_v="q8_0").kv_news
    assert not replace(settled, type_k="q8_0", type_v="q8_0").kv_news  # given, not chosen: no reason to give


def test_a_type_measured_faster_is_not_said_on_every_run(wide_model: Path) -> None:
    """The wisdom found q8_0 faster here: every run takes it, as it takes the tuned
    thread count, without a note each time; --json says why."""
    from localrun.tune.machine import this_machine
    from localrun.tune.wisdom import ModelKey, Rates, Wisdom, WisdomFile

    wisdom = WisdomFile.load()
    halves = {"f16/f16 fa on": (20.0, 20.0), "f16/f16 fa off": (20.0, 20.0), "q8_0/q8_0 fa on": (10.0, 10.0)}
    rates = Rates((100, 300), {k: (1e3 / ms[0], 1e3 / ms[1]) for k, ms in halves.items()}, (32, 400), halves)
    wisdom.put(Wisdom(this_machine(), ModelKey.of(wide_model), "f16/f16", "2026-12-05T00:00:00+00:00", rates=rates))
    wisdom.save()
    for command in (["generate", "-m", str(wide_model), "-n", "2", "hi"], ["chat", "-m", str(wide_model), "-n", "2"]):
        code, _, err = at_terminal(*command)
        assert code == 0 and "kv cache" not in err, err
    code, out, _ = at_terminal("generate", "--json", "-m", str(wide_model), "-n", "2", "hi")
    settings = json.loads(out.splitlines()[-1])["settings"]
    assert settings["type_k"]["value"] == "q8_0" and settings["type_k"]["source"] == "wisdom"
    assert "predicted 2.00x as fast as f16/f16 fa on" in settings["type_k"]["why"]


def test_chats_kv_note_speaks_of_the_context_it_has(long_wide_model: Path) -> None:
    """A chat grows into its context (the longest that fits, up to the trained
    context): the KV type is chosen for that context, and its note says so."""
    path = config.config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("[defaults]\nmemory_budget = 18000000\n")  # 32k tokens fit at q8_0, not f16
    code, _, err = at_terminal("chat", "-m", str(long_wide_model), "-n", "2", stdin="hi\n")
    assert code == 0, err
    note = next(line for line in err.splitlines() if line.startswith("kv cache"))
    assert note.startswith("kv cache q8_0/q8_0: ") and "about 32768 tokens" in note, note
    with sqlite3.connect(paths.history_db()) as conn:
        (context,) = conn.execute("SELECT ctx FROM runs").fetchone()
    assert context == 32768  # the context the chat had, the one the note speaks of


@pytest.fixture(scope="module")
def long_wide_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(
        tmp_path_factory.mktemp("kv") / "long-wide.gguf", n_embd=128, n_head=4, n_head_kv=2, n_ctx_train=32768
    )
