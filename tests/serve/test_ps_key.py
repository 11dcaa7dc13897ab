"""`localrun ps` against a server started with an API key: the key it reads,
and a one-line error naming where when the server refuses it."""

from __future__ import annotations

import json

import pytest

from tests.helpers import cli
from tests.serve.conftest import Server


def test_ps_says_where_it_reads_the_key_a_server_wants(keyed: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCALRUN_API_KEY", raising=False)
    port = keyed.url.rsplit(":", 1)[1]
    missing = cli("ps", "--port", port)
    assert missing.returncode == 10 and not missing.stdout
    error, hint = missing.stderr.splitlines()
    server = f"http://127.0.0.1:{port}"
    assert error == f"error: the server at {server} needs its API key: ps reads it from --api-key or LOCALRUN_API_KEY"
    assert hint == "hint: export LOCALRUN_API_KEY=KEY, the key `localrun serve` was started with"
    wrong = cli("ps", "--port", port, env={"LOCALRUN_API_KEY": "not-the-key"})
    assert wrong.returncode == 10 and "refused the API key given" in wrong.stderr
    said = (missing.stderr + wrong.stderr).replace(server, "the server")  # its port may hold the digits 401
    assert "401" not in said and "not-the-key" not in wrong.stderr  # no raw answer
    for args, env in ((["--api-key", keyed.key], {}), ([], {"LOCALRUN_API_KEY": keyed.key})):
        shown = cli("ps", "--port", port, "--json", *args, env=env)
        assert shown.returncode == 0, shown.stderr
        assert [m["id"] for m in json.loads(shown.stdout)["models"]] == ["tiny"]
