"""Each request a server answers is logged, from a thread of the server's own."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any


def logged(history: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(history) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM runs ORDER BY id")]


def test_each_server_request_is_logged(tiny_model: Path, tmp_path: Path) -> None:
    from tests.serve.conftest import start

    home = tmp_path / "server"
    for server in start(home, "-m", str(tiny_model), "--parallel", "1"):
        client = server.client()
        for text in ("one", "two"):
            client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": text}], max_tokens=4, temperature=0
            )
        assert server.stop() == 0
    runs = logged(home / "localrun" / "data" / "history.db")
    expected = ("serve", tiny_model.name, 200)  # the model as generate logs it, not the id requests use
    assert [(r["command"], r["model"], r["exit_status"]) for r in runs] == [expected] * 2
    assert all(r["generated_tokens"] == 4 and r["decode_tps"] and r["kv"] and r["parallel"] == 1 for r in runs)
    assert [r["prompt"] for r in runs] == ["one", "two"]  # the text is stored, as for every other command
    assert all(r["response"] for r in runs)
