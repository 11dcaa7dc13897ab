"""Each command logs its runs: generate, chat (and chat --continue), --batch
(serve: test_serve_log.py); --no-log and LOCALRUN_NO_LOG write nothing; a history that cannot
be written costs one warning and the run still succeeds."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

from localrun import paths
from tests.helpers import cli


def logged(history: Path | None = None) -> list[dict[str, Any]]:
    history = history or paths.history_db()
    if not history.exists():
        return []
    with sqlite3.connect(history) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM runs ORDER BY id")]


def test_generate_logs_the_run_with_its_settings_and_figures(tiny_model: Path) -> None:
    res = cli("generate", "-m", str(tiny_model), "-n", "5", "-t", "0", "--ctx", "256", "say hi")
    assert res.returncode == 0, res.stderr
    (run,) = logged()
    assert (run["command"], run["model"], run["model_file"]) == ("generate", tiny_model.name, str(tiny_model))
    assert run["prompt"] == "say hi" and run["response"] and res.stdout.startswith(run["response"])
    assert (run["generated_tokens"], run["stop_reason"], run["exit_status"]) == (5, "length", 0)
    assert run["prompt_tokens"] > 0 and run["ttft_s"] > 0 and run["decode_tps"] > 0
    assert run["token_p50_ms"] is not None and run["token_p95_ms"] >= run["token_p50_ms"]
    assert run["kv"] and run["flash_attn"] and run["draft"] and run["threads"] and run["cpu"]
    assert run["ctx"] == 256
    settings = json.loads(run["settings"])
    assert settings["ctx"] == {"value": 256, "source": "option"}


def test_no_log_and_the_environment_variable_write_nothing(tiny_model: Path) -> None:
    assert cli("generate", "-m", str(tiny_model), "-n", "2", "--no-log", "hi").returncode == 0
    assert cli("generate", "-m", str(tiny_model), "-n", "2", "hi", env={"LOCALRUN_NO_LOG": "1"}).returncode == 0
    assert logged() == []


def test_chat_turns_are_one_conversation_and_continue_resumes_it(tiny_model: Path) -> None:
    res = cli("chat", "-m", str(tiny_model), "-n", "3", "-t", "0", input="first\nsecond\n")
    assert res.returncode == 0, res.stderr
    turns = logged()
    assert [(t["command"], t["prompt"]) for t in turns] == [("chat", "first"), ("chat", "second")]
    assert turns[0]["conversation_id"] is not None and turns[0]["conversation_id"] == turns[1]["conversation_id"]
    assert all(t["response"] for t in turns)

    resumed = cli("chat", "-n", "3", "-t", "0", "-c", "--json", input="third\n")  # no -m: the conversation's model
    assert resumed.returncode == 0, resumed.stderr
    done = [json.loads(line) for line in resumed.stdout.splitlines() if '"done"' in line]
    assert done[-1]["turn"] == 3  # the two logged turns came back
    third = logged()[-1]
    assert third["prompt"] == "third" and third["conversation_id"] == turns[0]["conversation_id"]
    assert third["model_file"] == str(tiny_model)
    assert third["prompt_tokens"] > turns[1]["prompt_tokens"]  # the earlier turns are in its prompt

    fresh = cli("chat", "-m", str(tiny_model), "-n", "3", "-t", "0", input="new\n")
    assert fresh.returncode == 0 and logged()[-1]["conversation_id"] != turns[0]["conversation_id"]


def test_continue_after_load_keeps_the_loaded_turns(tiny_model: Path, tmp_path: Path) -> None:
    """`chat --load FILE`, then `chat -c`: the turns loaded from the file are part of the conversation continued."""
    saved = tmp_path / "saved.json"
    messages = [
        {"role": "system", "content": "you are terse"},
        {"role": "user", "content": "loaded question"},
        {"role": "assistant", "content": "loaded answer"},
    ]
    saved.write_text(json.dumps({"model": str(tiny_model), "messages": messages}))
    loaded = cli("chat", "--load", str(saved), "-n", "3", "-t", "0", "--json", input="after loading\n")
    assert loaded.returncode == 0, loaded.stderr
    first = logged()[-1]
    resumed = cli("chat", "-n", "3", "-t", "0", "-c", "--json", input="continued\n")
    assert resumed.returncode == 0, resumed.stderr
    done = [json.loads(line) for line in resumed.stdout.splitlines() if '"done"' in line]
    assert done[-1]["turn"] == 3  # the loaded turn, the one after it, this one
    last = logged()[-1]
    assert last["conversation_id"] == first["conversation_id"] and last["system"] == "you are terse"
    assert last["prompt_tokens"] > first["prompt_tokens"]  # the loaded turn is in its prompt too


def test_continue_without_a_logged_conversation_is_refused(tiny_model: Path) -> None:
    res = cli("chat", "-m", str(tiny_model), "-c", input="hi\n")
    assert res.returncode == 2 and "no conversation" in res.stderr


def test_each_batch_line_is_logged(tiny_model: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("one\ntwo\nthree\n")
    res = cli("generate", "-m", str(tiny_model), "-n", "3", "-t", "0", "--batch", str(prompts))
    assert res.returncode == 0, res.stderr
    results = [json.loads(line) for line in res.stdout.splitlines()]
    runs = logged()
    assert sorted(r["prompt"] for r in runs) == ["one", "three", "two"]
    assert {r["command"] for r in runs} == {"batch"} and all(r["parallel"] for r in runs)
    by_prompt = {r["prompt"]: r for r in runs}
    assert [by_prompt[p]["response"] for p in ("one", "two", "three")] == [r["text"] for r in results]
    assert all(r["generated_tokens"] == 3 and r["exit_status"] == 0 for r in runs)


def test_a_history_that_cannot_be_written_warns_once_and_the_run_succeeds(tiny_model: Path) -> None:
    data = paths.data_dir()
    if os.geteuid() == 0:  # root ignores permissions: a file where the folder should be
        data.parent.mkdir(parents=True, exist_ok=True)
        data.write_text("not a folder")
    else:
        data.mkdir(parents=True)
        data.chmod(0o555)
    res = cli("generate", "-m", str(tiny_model), "-n", "3", "-t", "0", "hi")
    assert res.returncode == 0 and res.stdout.strip()
    assert res.stderr.count("warning: this run was not logged") == 1, res.stderr


@pytest.mark.pty
def test_interactive_chat_logs_turns_retries_and_new_conversations(tiny_model: Path) -> None:
    import pexpect

    child = pexpect.spawn(
        sys.executable,
        ["-m", "localrun", "chat", "-m", str(tiny_model), "-n", "4", "-t", "0"],
        env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "100", "LINES": "30"},
        encoding="utf-8",
        timeout=180,
        dimensions=(30, 100),
    )
    for line in ("first", "second", "/retry", "/clear", "fresh"):
        child.expect(">>> ")
        child.sendline(line)
        if line != "/clear":
            child.expect("stop: length")
    child.expect(">>> ")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    runs = logged()
    assert [(r["prompt"], r["retry"]) for r in runs] == [("first", 0), ("second", 0), ("second", 1), ("fresh", 0)]
    first, second, retried, fresh = (r["conversation_id"] for r in runs)
    assert first == second == retried != fresh
    resumed = cli("logs", "--json", "-n", "0")
    assert resumed.returncode == 0 and len(json.loads(resumed.stdout)) == 4
