"""`localrun serve` with no `-m`: every pulled model served on demand, over
HTTP with the official `openai` client, and `localrun ps` asking it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import pytest

from scripts.bench_router import register_pulled
from tests.helpers import cli
from tests.serve.conftest import Server, start

ALPHA, BETA = "alpha:test", "beta:test"


@pytest.fixture(scope="module")
def on_demand(tiny_model: Path, wide_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    home = tmp_path_factory.mktemp("home")
    register_pulled(home, {ALPHA: tiny_model, BETA: wide_model})
    yield from start(home, "--models-max", "1", "--parallel", "1", "--ctx", "512", "--idle-unload", "0")


def listed(server: Server) -> dict[str, dict[str, Any]]:
    body = httpx.get(server.url + "/v1/models", timeout=30).json()
    return {m["id"]: m["status"] for m in body["data"]}


def ask(client: openai.OpenAI, model: str, **extra: Any) -> str:
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, extra_body=extra or None
    )
    return reply.model


def test_alternating_requests_are_each_answered_by_the_model_named(on_demand: Server) -> None:
    client = on_demand.client()
    assert {s["value"] for s in listed(on_demand).values()} == {"unloaded"}  # nothing loads before a request
    assert {m.id for m in client.models.list()} == {ALPHA, BETA}  # what can be served
    for name in (ALPHA, BETA, ALPHA, "beta.gguf"):  # an alias, or the file's name
        answered = ask(client, name)
        expected = BETA if name == "beta.gguf" else name
        assert answered == expected
        status = listed(on_demand)
        assert status[expected]["value"] == "loaded"
        assert [m for m, s in status.items() if s["value"] == "loaded"] == [expected]  # --models-max 1
        assert sum(status[expected]["memory"].values()) > 0 and status[expected]["slots"] == 1
    for _ in range(1000):  # the server's log says so at its next status tick
        if "alpha:test: unloaded" in on_demand.log:
            break
        httpx.get(on_demand.url + "/health", timeout=30)
    assert "note: alpha:test: loaded (" in on_demand.log and "note: alpha:test: unloaded" in on_demand.log
    assert "warning: alpha:test" not in on_demand.log  # what the server does of itself is no warning


def test_load_and_unload_by_hand(on_demand: Server) -> None:
    loaded = httpx.post(on_demand.url + "/models/load", json={"model": ALPHA}, timeout=60)
    assert loaded.status_code == 200 and loaded.json()["model"]["status"]["value"] == "loaded"
    unloaded = httpx.post(on_demand.url + "/models/unload", json={"model": ALPHA}, timeout=60)
    assert unloaded.status_code == 200 and unloaded.json()["unloaded"] is True
    assert listed(on_demand)[ALPHA]["value"] == "unloaded"
    missing = httpx.post(on_demand.url + "/models/load", json={"model": "nope:none"}, timeout=60)
    assert missing.status_code == 404 and "nope:none" in missing.json()["error"]["message"]


def test_keep_alive_zero_unloads_once_answered(on_demand: Server) -> None:
    assert ask(on_demand.client(), ALPHA, keep_alive=0) == ALPHA
    for _ in range(500):  # the sweep starts as the request ends; wait for it, however long the machine takes
        if listed(on_demand)[ALPHA]["value"] == "unloaded":
            break
        httpx.get(on_demand.url + "/health", timeout=30)
    assert listed(on_demand)[ALPHA]["value"] == "unloaded"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/messages"])
def test_keep_alive_that_does_not_parse_is_a_400_naming_it(on_demand: Server, path: str) -> None:
    body: dict[str, Any] = {"model": ALPHA, "max_tokens": 2, "keep_alive": "a while"}
    body |= {"prompt": "hi"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]}
    answer = httpx.post(on_demand.url + path, json=body, timeout=60)
    assert answer.status_code == 400
    assert "keep_alive" in json.dumps(answer.json())


def test_requests_for_two_models_past_models_max_wait_their_turn(on_demand: Server) -> None:
    """32 requests alternating between two models from 8 threads under --models-max 1:
    each waits for the other model to go idle, none is refused."""
    from concurrent.futures import ThreadPoolExecutor

    client = on_demand.client()
    names = [ALPHA if i % 2 == 0 else BETA for i in range(32)]
    with ThreadPoolExecutor(8) as pool:
        answered = list(pool.map(lambda name: ask(client, name), names))
    assert answered == names, on_demand.log


def ps(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    port = server.url.rsplit(":", 1)[1]
    env = {k: v for k, v in os.environ.items() if k != "LOCALRUN_API_KEY"}
    return subprocess.run(
        [sys.executable, "-m", "localrun", "ps", "--port", port, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_ps_shows_the_loaded_models(on_demand: Server) -> None:
    ask(on_demand.client(), BETA)
    shown = ps(on_demand, "--json")
    assert shown.returncode == 0, shown.stderr
    (model,) = json.loads(shown.stdout)["models"]
    assert model["id"] == BETA and model["status"]["slots_busy"] == 0 and model["status"]["memory"]
    table = ps(on_demand)
    assert table.returncode == 0 and BETA in table.stdout and "MEMORY" in table.stdout and "0/1" in table.stdout


def test_ps_without_a_server_says_so() -> None:
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        fake = Server.__new__(Server)
        fake.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        shown = ps(fake)
    assert shown.returncode != 0 and "no server answers" in shown.stderr and not shown.stdout


def test_a_model_file_deleted_is_an_error_and_the_server_stays_up(
    tiny_model: Path, wide_model: Path, tmp_path: Path
) -> None:
    files = register_pulled(tmp_path, {ALPHA: tiny_model, BETA: wide_model})
    for server in start(tmp_path, "--parallel", "1", "--ctx", "512"):
        client = server.client()
        files[BETA].unlink()
        with pytest.raises(openai.APIStatusError) as failed:
            ask(client, BETA)
        assert BETA in failed.value.message and failed.value.status_code < 500
        assert ask(client, ALPHA) == ALPHA  # the server stays up, and serves the rest
        assert listed(server)[BETA]["value"] == "unloaded"


def test_eviction_never_takes_the_model_a_stream_runs_on(long_model: Path, wide_model: Path, tmp_path: Path) -> None:
    register_pulled(tmp_path, {ALPHA: long_model, BETA: wide_model})
    for server in start(tmp_path, "--models-max", "1", "--parallel", "1", "--ctx", "32768", "--queue-timeout", "1"):
        client = server.client()
        stream = client.completions.create(model=ALPHA, prompt="Once", max_tokens=30000, stream=True)
        next(iter(stream))  # it runs
        with pytest.raises(openai.APIStatusError) as refused:
            ask(client, BETA)
        assert refused.value.status_code == 503 and "none went idle within 1 s: alpha:test" in refused.value.message
        assert refused.value.response.headers["Retry-After"]
        assert listed(server)[ALPHA]["value"] == "loaded" and listed(server)[ALPHA]["slots_busy"] == 1
        stream.close()  # the stream ends: its model is idle, and goes for the next
        for _ in range(1000):  # the server sees the client go, however long the machine takes
            status = listed(server)[ALPHA]
            if status["slots_busy"] == 0 and status["requests"] == 0:
                break
        assert ask(client, BETA) == BETA
        assert listed(server)[ALPHA]["value"] == "unloaded"


def test_a_bad_idle_unload_offers_what_help_says_never_is() -> None:
    """0 is never, as --help says; keep_alive's -1 (its never, where 0 unloads at once) is not offered."""
    shown = cli("serve", "--port", "0", "--idle-unload", "banana")
    assert shown.returncode == 2
    error = "error: --idle-unload: 'banana' is not a duration"
    assert shown.stderr == error + ' (say "5m", "30s", seconds, or 0: never)\n'
    assert "seconds; 0: never)" in " ".join(cli("serve", "--help").stdout.split())  # the help, unwrapped


@pytest.mark.parametrize(("flag", "value"), [("--idle-unload", "soon"), ("--models-max", "-1")])
def test_bad_flags_are_refused_before_anything_loads(flag: str, value: str, tmp_path: Path) -> None:
    env = {**os.environ, "LOCALRUN_HOME": str(tmp_path)}
    shown = subprocess.run(
        [sys.executable, "-m", "localrun", "serve", "--port", "0", flag, value],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert shown.returncode == 2 and flag in shown.stderr and "Traceback" not in shown.stderr
