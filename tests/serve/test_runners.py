"""Each served model in a runner process of its own (issue 56): a runner
killed mid-stream costs only its own requests and loads again; one that
hangs is found by its heartbeat and replaced; an unload and the server's
exit leave no process behind, and the unload gives the memory back."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2 as httpx
import openai
import pytest
from openai.types.chat import ChatCompletionFunctionToolParam

from scripts.bench_router import register_pulled
from tests.serve.conftest import Server, start
from tests.tinymodel import write_tiny_model

ALPHA, BETA = "alpha:test", "beta:test"


def status(server: Server) -> dict[str, dict[str, object]]:
    body = httpx.get(server.url + "/v1/models", timeout=30).json()
    return {m["id"]: m["status"] for m in body["data"]}


def runner_of(server: Server, model: str) -> int:
    pid = status(server)[model]["pid"]
    assert isinstance(pid, int) and pid != server.proc.pid  # a process of its own
    return pid


def alive(pid: int) -> bool:
    """Running (a zombie, ended but not yet reaped, is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def ask(client: openai.OpenAI, model: str) -> str:
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0
    )
    return reply.model


@pytest.fixture(scope="module")
def two(long_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Two pulled models on demand, each in its runner; a runner quiet for 3 s is replaced."""
    models = tmp_path_factory.mktemp("models")
    beta = write_tiny_model(models / "beta.gguf", seed=7, n_ctx_train=32768)  # long replies, as alpha's
    home = tmp_path_factory.mktemp("home")
    register_pulled(home, {ALPHA: long_model, BETA: beta})
    yield from start(home, "--parallel", "2", "--runner-timeout", "3s", "--idle-unload", "0", "--no-log")


def _stream_until_cut(client: openai.OpenAI, model: str, started: threading.Event) -> tuple[int, str]:
    """Stream a long reply; how many chunks came, and the error that ended it (empty: none)."""
    chunks = 0
    try:
        stream = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "go on"}],
            max_tokens=30000,
            stream=True,
        )
        for _ in stream:
            chunks += 1
            if chunks == 5:
                started.set()
    except openai.APIError as exc:
        return chunks, str(exc)
    finally:
        started.set()
    return chunks, ""


def test_a_killed_runner_costs_only_its_own_requests_and_loads_again(two: Server) -> None:
    client = two.client()
    assert ask(client, ALPHA) == ALPHA and ask(client, BETA) == BETA
    alpha, beta = runner_of(two, ALPHA), runner_of(two, BETA)
    assert alpha != beta
    started = threading.Event()
    with ThreadPoolExecutor(4) as pool:
        cut = pool.submit(_stream_until_cut, client, ALPHA, started)
        assert started.wait(60)
        others = [pool.submit(ask, client, BETA) for _ in range(6)]  # the other model's, meanwhile
        os.kill(alpha, signal.SIGKILL)
        chunks, error = cut.result(120)
        answered = [f.result(120) for f in others]
    assert chunks >= 5 and ALPHA in error and "killed by SIGKILL" in error, (chunks, error)
    assert answered == [BETA] * 6  # the other runner never noticed
    assert runner_of(two, BETA) == beta
    assert ask(client, ALPHA) == ALPHA  # loaded again, in a new runner
    assert runner_of(two, ALPHA) != alpha and not alive(alpha)
    assert f"warning: {ALPHA}: its runner was killed by SIGKILL; it loads again on its next request" in two.log


def test_a_runner_that_hangs_is_replaced(two: Server) -> None:
    client = two.client()
    assert ask(client, BETA) == BETA
    beta = runner_of(two, BETA)
    started = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        cut = pool.submit(_stream_until_cut, client, BETA, started)
        assert started.wait(60)
        os.kill(beta, signal.SIGSTOP)  # alive, but it neither answers nor moves
        t0 = time.monotonic()
        try:
            _, error = cut.result(120)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):  # never left stopped by a failing test
                os.kill(beta, signal.SIGKILL)
            raise
    waited = time.monotonic() - t0
    assert BETA in error and "was replaced" in error, error
    assert waited >= 1.5  # not before its 3 s were up (counted from its last heartbeat, a second apart at most)
    assert not alive(beta)  # killed, not left stopped
    assert ask(client, BETA) == BETA and runner_of(two, BETA) != beta


def test_constraints_are_built_in_the_runner_not_the_server(two: Server) -> None:
    """The grammar library is code the server would keep resident after every
    unload: a tool call's grammar and a response_format's are built in the runner."""
    client = two.client()
    weather: ChatCompletionFunctionToolParam = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 8}},
                "required": ["city"],
            },
        },
    }  # a call of bounded length: the tiny model's ends within max_tokens
    called = client.chat.completions.create(
        model=ALPHA,
        messages=[{"role": "user", "content": "weather?"}],
        tools=[weather],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=200,
        temperature=0,
    )
    calls = called.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls if c.type == "function"] == ["get_weather"], called.choices[0]
    shaped = client.chat.completions.create(
        model=ALPHA,
        messages=[{"role": "user", "content": "a number"}],
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}}},
        max_tokens=8,
    )
    assert (shaped.choices[0].message.content or "").strip().lstrip("-").isdigit()
    runner = runner_of(two, ALPHA)
    assert "llguidance" in Path(f"/proc/{runner}/maps").read_text()
    assert "llguidance" not in Path(f"/proc/{two.proc.pid}/maps").read_text()


def test_an_unload_ends_the_runner(two: Server) -> None:
    client = two.client()
    assert ask(client, ALPHA) == ALPHA
    pid = runner_of(two, ALPHA)
    unloaded = httpx.post(two.url + "/models/unload", json={"model": ALPHA}, timeout=60)
    assert unloaded.status_code == 200 and unloaded.json()["unloaded"] is True
    deadline = time.monotonic() + 30
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid)


def test_the_servers_exit_leaves_no_runner(long_model: Path, tmp_path: Path) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):  # stopped, or gone without a word
        for server in start(tmp_path / sig.name, "-m", str(long_model), "--no-log"):
            pid = runner_of(server, "tiny-long")
            assert alive(pid)
            server.stop(sig)
            deadline = time.monotonic() + 30
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not alive(pid), server.log


def test_a_model_that_fails_to_load_in_its_runner_is_an_error_naming_it(tmp_path: Path, long_model: Path) -> None:
    broken = tmp_path / "models" / "broken.gguf"
    broken.parent.mkdir()
    data = long_model.read_bytes()
    broken.write_bytes(data[: len(data) // 2])  # a header that reads, tensors cut short
    home = tmp_path / "home"
    register_pulled(home, {"broken:test": broken, ALPHA: long_model})
    for server in start(home, "--no-log"):
        client = server.client()
        with pytest.raises(openai.APIStatusError) as failed:
            ask(client, "broken:test")
        assert "broken" in str(failed.value)
        assert ask(client, ALPHA) == ALPHA  # the server goes on
        assert not re.search(r"Traceback", server.log), server.log
