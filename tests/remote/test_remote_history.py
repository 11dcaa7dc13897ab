"""Runs on a remote are logged like local ones: the model the server
answered to, its URL, the text and figures; never the API key."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from localrun import paths
from tests.helpers import cli
from tests.remote.conftest import KEY
from tests.serve.conftest import Server

GREEDY = ("-n", "4", "-t", "0")


def logged() -> list[dict[str, Any]]:
    with sqlite3.connect(paths.history_db()) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM runs ORDER BY id")]


def test_remote_generate_chat_and_batch_are_logged(server: Server, tmp_path: Path) -> None:
    url = server.url + "/v1"
    assert cli("generate", "-m", url, *GREEDY, "hello there").returncode == 0
    assert cli("chat", "-m", url, *GREEDY, input="a question\n").returncode == 0
    lines = tmp_path / "lines.txt"
    lines.write_text("one\ntwo\n")
    assert cli("generate", "-m", url, *GREEDY, "--batch", str(lines)).returncode == 0
    assert cli("generate", "-m", url, *GREEDY, "--no-log", "not this").returncode == 0
    runs = logged()
    assert [(r["command"], r["prompt"]) for r in runs[:2]] == [("generate", "hello there"), ("chat", "a question")]
    assert sorted((r["command"], r["prompt"]) for r in runs[2:]) == [("batch", "one"), ("batch", "two")]
    assert all(r["model"] == "tiny" and r["remote"] == url and r["exit_status"] == 0 for r in runs)
    assert all(r["generated_tokens"] == 4 and r["response"] for r in runs)
    assert runs[0]["ttft_s"] > 0 and runs[0]["token_p50_ms"] is not None


def test_the_api_key_is_never_logged(keyed: Server) -> None:
    res = cli("generate", "-m", keyed.url + "/v1", *GREEDY, "hi", env={"LOCALRUN_REMOTE_API_KEY": KEY})
    assert res.returncode == 0, res.stderr
    assert len(logged()) == 1
    for file in paths.history_db().parent.iterdir():
        assert KEY.encode() not in file.read_bytes()
