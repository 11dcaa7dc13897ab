"""generate, chat and --batch on a remote: a real `localrun serve` with the
tiny model, directly and through a proxy that injects faults. Greedy results
through the API equal local ones; the API key appears nowhere."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import pexpect
import pytest

from localrun.store.registry import user_file
from tests.helpers import Result, cli, on_terminal
from tests.remote.conftest import KEY
from tests.remote.proxy import FaultProxy
from tests.serve.conftest import Server

PROMPTS = ["hello there", "the cat sat on the mat", "x", "in the beginning was", "on the", "a b c d e f"]
GREEDY = ("-t", "0", "-n", "12")


def remotes(**entries: dict[str, Any]) -> None:
    """[remotes.NAME] tables in the user's models.toml."""
    lines = []
    for name, fields in entries.items():
        lines.append(f"[remotes.{name}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in fields.items()]
    path = user_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def events(res: Result) -> tuple[str, dict[str, Any]]:
    """The text and the done event of `generate --json`."""
    parsed = [json.loads(line) for line in res.stdout.splitlines()]
    assert parsed[-1]["type"] == "done", res.stdout
    return "".join(e["text"] for e in parsed if e["type"] == "token"), parsed[-1]


def records(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def local_batch(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[Any, str]:
    """Local `--batch` greedy results: id -> text."""
    src = tmp_path_factory.mktemp("local") / "prompts.txt"
    src.write_text("\n".join(PROMPTS) + "\n")
    res = cli("generate", "-m", str(tiny_model), *GREEDY, "--batch", str(src))
    assert res.returncode == 0, res.stderr
    return {r["id"]: r["text"] for r in records(res.stdout)}


# ------------------------------------------------------------ generate --


def test_generate_equals_local(server: Server, tiny_model: Path) -> None:
    local = cli("generate", "-m", str(tiny_model), *GREEDY, "--spec", "none", "--json", "hello there")
    remote = cli("generate", "-m", server.url + "/v1", *GREEDY, "--json", "hello there")
    assert remote.returncode == 0, remote.stderr
    (text, done), (local_text, local_done) = events(remote), events(local)
    assert text == local_text and text
    for key in ("prompt_tokens", "generated_tokens", "stop_reason"):
        assert done[key] == local_done[key], key
    assert len(remote.stdout.splitlines()) > 2  # streamed: token events before the done event
    assert 0 < done["ttft_s"] <= done["elapsed_s"]
    assert "threads" not in done and "draft" not in done  # what a remote cannot tell is not invented
    assert done["settings"]["model"] == {"value": "tiny", "source": "server"}


def test_raw_prompt_goes_to_completions(server: Server, tiny_model: Path, proxy: FaultProxy) -> None:
    local = cli("generate", "-m", str(tiny_model), *GREEDY, "--spec", "none", "--raw", "once upon a time")
    remote = cli("generate", "-m", proxy.url, *GREEDY, "--raw", "once upon a time")
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout == local.stdout != ""
    assert [path for method, path, _, _ in proxy.seen if method == "POST"] == ["/v1/completions"]


def test_plain_output_and_stats(server: Server) -> None:
    res = cli("generate", "--remote", server.url + "/v1", "-m", "tiny", *GREEDY, "--stats", "hello")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() and "tokens" in res.stderr and "stop:" in res.stderr


def test_named_remote_and_list(server: Server) -> None:
    remotes(box={"url": server.url + "/v1", "model": "tiny"}, gone={"url": f"http://127.0.0.1:{closed_port()}/v1"})
    by_name = cli("generate", "-m", "box", *GREEDY, "hello")
    prefixed = cli("generate", "-m", "remote:box", *GREEDY, "hello")
    assert by_name.returncode == prefixed.returncode == 0, by_name.stderr + prefixed.stderr
    assert by_name.stdout == prefixed.stdout != ""
    listed = cli("list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {r["name"]: r for r in json.loads(listed.stdout)["remotes"]}
    assert rows["box"]["answers"] and rows["box"]["models"] == ["tiny"]
    assert not rows["gone"]["answers"] and rows["gone"]["error"]
    table = cli("list")
    assert "remote:box" in table.stdout and "remote:gone" in table.stdout


def test_errors_are_one_line_with_their_codes(server: Server) -> None:
    unknown = cli("generate", "--remote", server.url + "/v1", "-m", "nope", "hello")
    assert unknown.returncode == 3 and "nope" in unknown.stderr
    gone = cli("generate", "-m", f"http://127.0.0.1:{closed_port()}/v1", "hello")
    assert gone.returncode == 10 and "cannot reach" in gone.stderr
    too_long = cli("generate", "-m", server.url + "/v1", "word " * 2000)
    assert too_long.returncode == 5 and "512" in too_long.stderr
    no_such = cli("generate", "-m", "remote:nowhere", "hello")
    assert no_such.returncode == 3 and "nowhere" in no_such.stderr
    local_only = cli("generate", "-m", server.url + "/v1", "--ctx", "1024", "hello")
    assert local_only.returncode == 2 and "--ctx" in local_only.stderr
    for res in (unknown, gone, too_long, no_such, local_only):
        assert "Traceback" not in res.stderr and res.stderr.startswith("error: ")


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer", "maximum": 99}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_schema_sent_and_validated(server: Server, proxy: FaultProxy, tmp_path: Path) -> None:
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    sampled = ("-t", "1", "--seed", "3", "-n", "80", "--schema", str(schema), "--json", "a person")
    enforced = cli("generate", "-m", proxy.url, *sampled)
    assert proxy.posts()[0]["response_format"]["json_schema"]["schema"] == PERSON
    text, done = events(enforced)
    assert enforced.returncode == 0, enforced.stderr
    assert done["valid"] is True and json.loads(text).keys() == {"name", "age"}
    proxy.faults = ["plain"]  # a server that ignores response_format
    ignored = cli("generate", "-m", proxy.url, *GREEDY, "--schema", str(schema), "--json", "hi")
    _, done = events(ignored)
    assert ignored.returncode == 9 and done["valid"] is False and done["invalid"]
    assert "did not enforce" in ignored.stderr


# ---------------------------------------------------------------- faults --


def test_busy_server_is_asked_again_after_retry_after(server: Server, proxy: FaultProxy) -> None:
    proxy.faults = ["429", "503"]
    res = cli("generate", "-m", proxy.url, *GREEDY, "hello there")
    assert res.returncode == 0, res.stderr
    assert len(proxy.posts()) == 3
    proxy.faults = ["429"] * 5
    busy = cli("generate", "-m", proxy.url, *GREEDY, "hello there")
    assert busy.returncode == 10 and "busy (429)" in busy.stderr


def test_a_reset_before_the_answer_is_retried(server: Server, proxy: FaultProxy) -> None:
    proxy.faults = ["reset"]
    res = cli("generate", "-m", proxy.url, *GREEDY, "hello there")
    assert res.returncode == 0, res.stderr
    assert len(proxy.posts()) == 2


@pytest.mark.parametrize("fault", ["cut:3", "end:3"])
def test_a_stream_cut_keeps_its_text(server: Server, proxy: FaultProxy, fault: str) -> None:
    whole = cli("generate", "-m", proxy.url, *GREEDY, "--json", "hello there")
    full_text, _ = events(whole)
    proxy.faults = [fault]
    cut = cli("generate", "-m", proxy.url, *GREEDY, "--json", "hello there")
    text, done = events(cut)
    assert cut.returncode == 11, cut.stderr
    assert done["stop_reason"] == "error"
    assert text and full_text.startswith(text) and text != full_text
    assert cut.stderr.startswith("error: the answer from") and "Traceback" not in cut.stderr
    plain = cli("generate", "-m", proxy.url, *GREEDY, "hello there")  # the faults are used up: whole again
    assert plain.stdout.strip() == full_text.strip()


def test_a_stalled_server_times_out(server: Server, proxy: FaultProxy) -> None:
    remotes(slow={"url": proxy.url, "timeout": 3})  # seconds of silence: room for a loaded machine
    proxy.faults = ["stall"]
    silent = cli("generate", "-m", "slow", *GREEDY, "hello there")
    assert silent.returncode == 10 and "sent nothing for 3s" in silent.stderr
    proxy.faults = ["stall:3"]
    stalled = cli("generate", "-m", "slow", *GREEDY, "hello there")
    assert stalled.returncode == 11 and stalled.stdout.strip()


# ----------------------------------------------------------------- batch --


def test_batch_equals_local(server: Server, tmp_path: Path, local_batch: dict[Any, str]) -> None:
    src = tmp_path / "prompts.txt"
    src.write_text("\n".join(PROMPTS) + "\n")
    res = cli("generate", "-m", server.url + "/v1", *GREEDY, "--batch", str(src))
    assert res.returncode == 0, res.stderr
    out = records(res.stdout)
    assert [r["id"] for r in out] == list(range(1, len(PROMPTS) + 1))  # in input order
    assert {r["id"]: r["text"] for r in out} == local_batch
    assert all(r["prompt_tokens"] > 0 and r["generated_tokens"] > 0 for r in out)
    unordered = cli("generate", "-m", server.url + "/v1", *GREEDY, "--batch", str(src), "--unordered")
    assert {r["id"]: r["text"] for r in records(unordered.stdout)} == local_batch


def openai_lines(prompts: list[str]) -> str:
    return "".join(
        json.dumps(
            {
                "custom_id": f"req-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "any", "messages": [{"role": "user", "content": p}], "max_tokens": 12},
            }
        )
        + "\n"
        for i, p in enumerate(prompts, 1)
    )


def test_openai_batch_format_in_and_out(
    server: Server, tiny_model: Path, tmp_path: Path, local_batch: dict[Any, str]
) -> None:
    src = tmp_path / "batch.jsonl"
    src.write_text(openai_lines(PROMPTS) + '{"custom_id": "bad", "url": "/v1/embeddings", "body": {}}\n')
    expected = {f"req-{i}": local_batch[i] for i in range(1, len(PROMPTS) + 1)}
    for model in (server.url + "/v1", str(tiny_model)):  # remote and local: the same format out
        res = cli("generate", "-m", model, "-t", "0", "--batch", str(src))
        assert res.returncode == 8, res.stderr  # the bad line
        out = records(res.stdout)
        good = [r for r in out if r["error"] is None]
        assert {r["custom_id"]: r["response"]["body"]["choices"][0]["message"]["content"] for r in good} == expected
        assert all(r["response"]["status_code"] == 200 and r["response"]["body"]["usage"] for r in good)
        (bad,) = [r for r in out if r["error"] is not None]
        assert bad["custom_id"] == "bad" and bad["response"] is None and "url" in bad["error"]["message"]


def test_batch_retries_cut_answers(
    server: Server, proxy: FaultProxy, tmp_path: Path, local_batch: dict[Any, str]
) -> None:
    src = tmp_path / "prompts.txt"
    src.write_text("\n".join(PROMPTS) + "\n")
    proxy.faults = ["cut:2", "reset", "429", "end:1"]
    res = cli("generate", "-m", proxy.url, *GREEDY, "--batch", str(src), "--parallel", "3")
    assert res.returncode == 0, res.stderr
    assert {r["id"]: r["text"] for r in records(res.stdout)} == local_batch
    assert len(proxy.posts()) == len(PROMPTS) + 4


def test_batch_resumes_after_the_server_refuses(
    server: Server, proxy: FaultProxy, tmp_path: Path, local_batch: dict[Any, str]
) -> None:
    src = tmp_path / "prompts.txt"
    src.write_text("\n".join(PROMPTS) + "\n")
    out = tmp_path / "out.jsonl"
    proxy.faults = ["pass", "pass", *["401"] * 10]
    first = cli("generate", "-m", proxy.url, *GREEDY, "--batch", str(src), "--parallel", "1", "--resume", str(out))
    assert first.returncode == 10 and "401" in first.stderr
    done_first = records(out.read_text())
    assert 2 <= len(done_first) < len(PROMPTS)
    proxy.faults = []
    second = cli("generate", "-m", proxy.url, *GREEDY, "--batch", str(src), "--resume", str(out))
    assert second.returncode == 0, second.stderr
    assert {r["id"]: r["text"] for r in records(out.read_text())} == local_batch


# ------------------------------------------------------------------ chat --


def test_chat_piped_equals_local(server: Server, tiny_model: Path) -> None:
    turns = "hello there\nand then?\n"
    local = cli("chat", "-m", str(tiny_model), *GREEDY, "--spec", "none", "--json", input=turns)
    remote = cli("chat", "-m", server.url + "/v1", *GREEDY, "--json", input=turns)
    assert remote.returncode == 0, remote.stderr

    def replies(res: Result) -> dict[int, str]:
        by_turn: dict[int, str] = {}
        for e in records(res.stdout):
            if e["type"] == "token":
                by_turn[e["turn"]] = by_turn.get(e["turn"], "") + e["text"]
        return by_turn

    first, second = replies(remote)[1], replies(remote)[2]
    assert first == replies(local)[1]
    # the second turn sends the whole conversation: the server's answer to it, asked directly
    # (a local chat keeps the first reply's tokens, which the tiny model's invalid UTF-8 does not survive as text)
    messages: Any = [
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": first},
        {"role": "user", "content": "and then?"},
    ]
    direct = server.client().chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=12)
    assert second == direct.choices[0].message.content


@pytest.mark.pty
def test_chat_and_panel_on_a_terminal(server: Server) -> None:
    code, screen = on_terminal("generate", "-m", server.url + "/v1", "-t", "0", "-n", "12", "hello model")
    assert code == 0 and "stop: length" in screen and "tiny @ http://127.0.0.1" in screen
    child = pexpect.spawn(
        sys.executable,
        ["-m", "localrun", "chat", "-m", server.url + "/v1", "-n", "12", "-t", "0"],
        env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "100", "LINES": "30"},
        encoding="utf-8",
        timeout=120,
        dimensions=(30, 100),
    )
    child.expect(">>> ")
    child.sendline("hello model")
    child.expect("stop: length")  # the reply's panel footer
    child.expect_exact("\x1b[?2004h")  # paste mode on while reading: a paste is one message
    child.expect(">>> ")
    child.send("\x1b[200~one\rtwo\rthree\x1b[201~\r")
    child.expect("stop: length")
    child.expect(">>> ")
    child.send("half typed")
    child.expect("half typed")
    child.sendintr()  # clears the line, the session goes on
    child.expect(">>> ")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    assert "stop: length" not in child.before  # one reply to the paste, none to the cleared line
    child.close()
    assert child.exitstatus == 0


# ------------------------------------------------------------------- key --


def test_the_key_appears_nowhere(keyed: Server, tmp_path: Path) -> None:
    remotes(
        secure={"url": keyed.url + "/v1", "api_key_env": "TEST_REMOTE_KEY"},
        wrong={"url": keyed.url + "/v1", "api_key_env": "TEST_WRONG_KEY"},
    )
    env = {"TEST_REMOTE_KEY": KEY, "TEST_WRONG_KEY": KEY[::-1]}
    src = tmp_path / "prompts.txt"
    src.write_text(openai_lines(PROMPTS[:3]))
    out = tmp_path / "out.jsonl"
    runs = [
        cli("generate", "-m", "secure", *GREEDY, "--json", "hello", env=env),
        cli("generate", "-m", "secure", *GREEDY, "--batch", str(src), "--resume", str(out), env=env),
        cli("chat", "-m", "secure", *GREEDY, "--json", input="hi\n", env=env),
        cli("list", "--json", env=env),
    ]
    assert [r.returncode for r in runs] == [0, 0, 0, 0], [r.stderr for r in runs]
    refused = [
        cli("--debug", "generate", "-m", "wrong", "hello", env=env),
        cli("generate", "-m", keyed.url + "/v1", "hello", env=env),  # ad hoc, without LOCALRUN_API_KEY
    ]
    assert [r.returncode for r in refused] == [10, 10]
    assert "TEST_WRONG_KEY" in refused[0].stderr and "set LOCALRUN_API_KEY" in refused[1].stderr
    for var in ("LOCALRUN_API_KEY", "LOCALRUN_REMOTE_API_KEY"):  # serve's variable, and the old name
        runs.append(cli("generate", "-m", keyed.url + "/v1", *GREEDY, "hello", env={**env, var: KEY}))
        assert runs[-1].returncode == 0, runs[-1].stderr
    for res in runs + refused:
        assert KEY not in res.stdout + res.stderr and KEY[::-1] not in res.stdout + res.stderr
    assert len(records(out.read_text())) == 3 and KEY not in out.read_text()
    for folder, _, files in os.walk(os.environ["LOCALRUN_HOME"]):  # history, logs, anything written
        for name in files:
            assert KEY.encode() not in (Path(folder) / name).read_bytes(), name
    assert KEY not in keyed.log
