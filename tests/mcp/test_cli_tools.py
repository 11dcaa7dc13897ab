"""`--mcp` on the command line: `localrun tools` lists, `generate` and `chat`
run the tool loop, with the calls and results as JSON events, the answer
alone in a pipe, and nothing run there unless --allow-tool allows it. The
tiny model is steered to call (a bias on `<tool_call>`)."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from localrun import paths
from localrun.cli import _options
from localrun.runtime.engine import Engine
from localrun.runtime.sampling import SamplingParams
from tests.helpers import cli, engine_config
from tests.mcp.conftest import FACTS, RAW, alive, pids
from tests.synthmodels import BY_NAME, write_family_model


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A tiny Qwen3-template model, and its `<tool_call>` token."""
    path = write_family_model(BY_NAME["qwen3"], tmp_path_factory.mktemp("qwen3") / "qwen3.gguf")
    with Engine(engine_config(path, n_ctx=256, n_threads=1)) as engine:
        (marker,) = engine.tokenize("<tool_call>", add_special=False, parse_special=True)
    return path, marker


@pytest.fixture
def calling(model: tuple[Path, int], monkeypatch: pytest.MonkeyPatch) -> Path:
    """The model writes `<tool_call>` wherever it may: it calls (the grammar writes the rest)."""
    path, marker = model
    made: Callable[..., SamplingParams] = _options.sampling_params

    def biased(*args: Any, **kwargs: Any) -> SamplingParams:
        return replace(made(*args, **kwargs), logit_bias=((marker, 30.0),))

    monkeypatch.setattr(_options, "sampling_params", biased)
    return path


def servers(tmp_path: Path, pidfile: Path, **entries: dict[str, Any]) -> Path:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": entries}))
    return path


def facts(tmp_path: Path, pidfile: Path, tools: str = "add") -> dict[str, Any]:
    env = {"LOCALRUN_TEST_PIDFILE": str(pidfile), "LOCALRUN_TEST_TOOLS": tools,
           "LOCALRUN_TEST_CALLS": str(tmp_path / "calls.log")}  # fmt: skip
    return {"command": sys.executable, "args": [str(FACTS)], "env": env}


def ran(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def test_tools_lists_each_servers_tools_and_says_what_failed(tmp_path: Path, pidfile: Path) -> None:
    file = servers(tmp_path, pidfile, facts=facts(tmp_path, pidfile, "add,today"), gone={"command": "/no/such"},
                   raw={"command": sys.executable, "args": [str(RAW), "bad-schema"],
                        "env": {"LOCALRUN_TEST_PIDFILE": str(pidfile)}})  # fmt: skip
    res = cli("tools", "--mcp", str(file))
    assert res.returncode == 0, res.stderr
    names = [line.split()[0] for line in res.stdout.splitlines()[1:]]
    assert sorted(names) == ["facts_add", "facts_today", "raw_echo"]
    warnings = [line for line in res.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 3  # the server that did not start, and each tool left out
    assert any("MCP server gone: cannot start" in w for w in warnings)
    assert sum("MCP server raw: tool" in w and "left out" in w for w in warnings) == 2
    assert all(not alive(pid) for pid in pids(pidfile))


def test_tools_json(tmp_path: Path, pidfile: Path) -> None:
    res = cli("tools", "--mcp", str(servers(tmp_path, pidfile, facts=facts(tmp_path, pidfile, "add"))), "--json")
    (tool,) = json.loads(res.stdout)
    assert tool["name"] == "facts_add" and tool["parameters"]["required"] == ["a", "b"]


def test_tools_with_no_server_is_a_usage_error() -> None:
    res = cli("tools")
    assert res.returncode == 2 and "no MCP server is configured" in res.stderr


def test_generate_json_has_tool_call_and_result_events(calling: Path, tmp_path: Path, pidfile: Path) -> None:
    file = servers(tmp_path, pidfile, facts=facts(tmp_path, pidfile))
    res = cli("generate", "-m", str(calling), "--mcp", str(file), "--allow-tool", "all", "--json", "-n", "160",
              "--max-tool-steps", "1", "--temperature", "1", "--seed", "3", "Add 2 and 40.")  # fmt: skip
    assert res.returncode == 0, res.stderr
    events = [json.loads(line) for line in res.stdout.splitlines()]
    kinds = [e["type"] for e in events]
    assert kinds.count("tool_call") >= 1 and kinds.count("tool_result") == kinds.count("tool_call")
    assert kinds.count("done") == 1 and kinds[-1] == "done"
    calls = [e for e in events if e["type"] == "tool_call"]
    results = {e["id"]: e for e in events if e["type"] == "tool_result"}
    for call in calls:  # each call names the tool, with the arguments its schema asks for, and ran
        result = results[call["id"]]
        assert call["name"] == "facts_add" and set(call["arguments"]) == {"a", "b"}
        assert result["status"] == "ok" and result["content"] == str(call["arguments"]["a"] + call["arguments"]["b"])
    assert ran(tmp_path) == [f"add {{'a': {c['arguments']['a']}, 'b': {c['arguments']['b']}}}" for c in calls]
    with sqlite3.connect(paths.history_db()) as conn:  # the run history keeps each call
        (recorded,) = conn.execute("SELECT tool_calls FROM runs WHERE command = 'generate'").fetchone()
    logged = json.loads(recorded)
    assert [(c["name"], c["status"], c["chars"]) for c in logged] == [
        ("facts_add", "ok", len(results[c["id"]]["content"])) for c in calls
    ]


def test_generate_in_a_pipe_runs_no_tool_unless_allowed(calling: Path, tmp_path: Path, pidfile: Path) -> None:
    file = servers(tmp_path, pidfile, facts=facts(tmp_path, pidfile))
    res = cli(
        "generate",
        "-m",
        str(calling),
        "--mcp",
        str(file),
        "-n",
        "160",
        "--max-tool-steps",
        "1",
        "--seed",
        "5",
        "--temperature",
        "1",
        "Add 2 and 40.",
    )
    assert res.returncode == 0, res.stderr
    assert ran(tmp_path) == []
    assert "the model called facts_add; in a pipe a tool runs only with --allow-tool" in res.stderr
    assert '"name": "facts_add"' not in res.stdout  # the call itself is never shown in a pipe


def test_allow_tool_naming_nothing_is_said(calling: Path, tmp_path: Path, pidfile: Path) -> None:
    file = servers(tmp_path, pidfile, facts=facts(tmp_path, pidfile))
    res = cli("generate", "-m", str(calling), "--mcp", str(file), "--allow-tool", "facts_sub", "-n", "8", "hi")
    assert "--allow-tool facts_sub: no tool or server has that name" in res.stderr


def test_piped_chat_keeps_each_turns_results_in_its_context(calling: Path, tmp_path: Path, pidfile: Path) -> None:
    file = servers(tmp_path, pidfile, facts=facts(tmp_path, pidfile))
    options = ["--allow-tool", "facts", "--json", "-n", "160", "--max-tool-steps", "1", "--ctx", "4096", "-t", "1"]
    res = cli("chat", "-m", str(calling), "--mcp", str(file), *options, input="Add 2 and 40.\nNow add 1 and 1.\n")
    assert res.returncode == 0, res.stderr
    events = [json.loads(line) for line in res.stdout.splitlines()]
    results = [e for e in events if e["type"] == "tool_result"]
    assert {e["turn"] for e in results} == {1, 2} and all(e["status"] == "ok" for e in results)
    assert [e["turn"] for e in events if e["type"] == "done"] == [1, 2]
    assert len(ran(tmp_path)) == len(results)  # several calls in one reply where the model writes them


def test_piped_jsonl_chat_asks_a_call_in_the_turns_that_need_one(
    model: tuple[Path, int], tmp_path: Path, pidfile: Path
) -> None:
    """The model left to choose (it never calls on its own); turns 1 and 3 ask for a call, turn 2 does not."""
    file = servers(tmp_path, pidfile, facts=facts(tmp_path, pidfile, "add,today"))
    named = {"type": "function", "function": {"name": "facts_today"}}
    turns = [
        {"role": "user", "content": "Add 2 and 40.", "tool_choice": "required"},
        {"role": "user", "content": "Thanks."},
        {"role": "user", "content": "What day is it?", "tool_choice": named},
    ]
    stdin = "".join(json.dumps(t) + "\n" for t in turns)
    options = ["--allow-tool", "all", "--json", "-n", "60", "--ctx", "4096", "-t", "0"]
    res = cli("chat", "-m", str(model[0]), "--mcp", str(file), *options, input=stdin)
    assert res.returncode == 0, res.stderr
    events = [json.loads(line) for line in res.stdout.splitlines()]
    results = [e for e in events if e["type"] == "tool_result"]
    assert [(e["turn"], e["name"]) for e in results][-1] == (3, "facts_today")
    assert {e["turn"] for e in results} == {1, 3} and all(e["status"] == "ok" for e in results)
    assert ran(tmp_path)[-1] == "today {}" and len(ran(tmp_path)) == len(results)
    assert [e["turn"] for e in events if e["type"] == "done"] == [1, 2, 3]


@pytest.mark.parametrize(
    ("args", "stdin", "said"),
    [
        (["--tool-choice", "facts_sub"], "", "--tool-choice: 'facts_sub' is not auto, required, none"),
        ([], '{"content": "hi", "tool_choice": "always"}\n', "stdin line 1: 'always' is not auto, required, none"),
        ([], '{"content": "hi", "tool_choice": 3}\n', "stdin line 1: tool_choice is auto, required, none"),
        ([], '{"content": "hi", "tool_choice": {"function": {"name": "facts_add"}}}\n', "stdin line 1: tool_choice"),
    ],
)
def test_a_tool_choice_naming_nothing_is_a_usage_error(
    model: tuple[Path, int], tmp_path: Path, pidfile: Path, args: list[str], stdin: str, said: str
) -> None:
    file = servers(tmp_path, pidfile, facts=facts(tmp_path, pidfile))
    res = cli("chat", "-m", str(model[0]), "--mcp", str(file), "-n", "4", *args, input=stdin)
    assert res.returncode == 2 and said in res.stderr, res.stderr
    assert ran(tmp_path) == []
    if args:  # generate checks the name as chat does, against the tools the servers listed
        res = cli("generate", "-m", str(model[0]), "--mcp", str(file), "-n", "4", *args, "hi")
        assert res.returncode == 2 and said in res.stderr, res.stderr
        assert ran(tmp_path) == []


def test_a_tool_choice_without_tools_is_a_usage_error(model: tuple[Path, int], tmp_path: Path) -> None:
    res = cli("generate", "-m", str(model[0]), "--no-mcp", "--tool-choice", "required", "hi")
    assert res.returncode == 2 and "--tool-choice required needs tools" in res.stderr
    gone = servers(tmp_path, tmp_path / "pids", gone={"command": "/no/such"})  # configured, and offers no tool
    for command, prompt in (("generate", ["hi"]), ("chat", [])):
        args = ["-m", str(model[0]), "--mcp", str(gone), "--tool-choice", "required", "-n", "4", *prompt]
        res = cli(command, *args, input="hi\n")
        assert res.returncode == 2 and "--tool-choice required: the MCP servers offer no tool" in res.stderr
    res = cli("generate", "-m", str(model[0]), "--tool-choice", "required", "--raw", "hi")
    assert res.returncode == 2 and "--tool-choice required and --raw cannot go together" in res.stderr
    turn = '{"role": "user", "content": "hi", "tool_choice": "required"}\n'
    res = cli("chat", "-m", str(model[0]), "--no-mcp", "-n", "4", input=turn)
    assert res.returncode == 2 and "stdin line 1: tool_choice 'required' needs tools" in res.stderr


def test_generate_tool_choice_none_runs_no_tool(calling: Path, tmp_path: Path, pidfile: Path) -> None:
    file = servers(tmp_path, pidfile, facts=facts(tmp_path, pidfile))
    args = ["--allow-tool", "all", "--tool-choice", "none", "--json", "-n", "16", "--ctx", "2048"]
    res = cli("generate", "-m", str(calling), "--mcp", str(file), *args, "Add 2 and 40.")
    assert res.returncode == 0, res.stderr
    assert not [e for e in map(json.loads, res.stdout.splitlines()) if e["type"] == "tool_call"]
    assert ran(tmp_path) == []


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--raw"], "--mcp and --raw cannot go together"),
        (["--schema", "name"], "--mcp and --schema or --grammar cannot go together"),
        (["--max-tool-steps", "0"], "--max-tool-steps must be at least 1"),
        (["--tool-timeout", "0"], "--tool-timeout must be more than 0"),
    ],
)
def test_generate_refuses_what_tools_cannot_go_with(tmp_path: Path, args: list[str], said: str) -> None:
    file = tmp_path / "mcp.json"
    file.write_text('{"mcpServers": {}}')
    res = cli("generate", "-m", "x.gguf", "--mcp", str(file), *args, "hi")
    assert res.returncode == 2 and said in res.stderr


def test_with_tools_a_temperature_nobody_chose_is_low() -> None:
    from localrun.cli.tools import TOOL_TEMPERATURE, tool_sampling

    default = SamplingParams(temperature=0.8)
    assert tool_sampling(default, None).temperature == TOOL_TEMPERATURE
    assert tool_sampling(default, 0.8).temperature == 0.8  # --temperature 0.8 given: kept


# `localrun` with its sampling biased toward `marker` (argv[1]): the model calls wherever it may
BIASED = """
import sys
from dataclasses import replace

from localrun.cli import _options

made, marker = _options.sampling_params, int(sys.argv[1])
_options.sampling_params = lambda *a, **k: replace(made(*a, **k), logit_bias=((marker, 30.0),))
sys.argv = ["localrun", *sys.argv[2:]]
from localrun.entry import main

raise SystemExit(main())
"""
ASKED = r"run facts_add\?"
PROMPT = ">>> "


@pytest.mark.pty
def test_chat_on_a_terminal_asks_before_each_call(model: tuple[Path, int], tmp_path: Path, pidfile: Path) -> None:
    """Issue 53: on a terminal each call is asked about. No: the tool does not
    run; always: it runs, then and for the rest of the session without asking."""
    import pexpect

    path, marker = model
    file = servers(tmp_path, pidfile, facts=facts(tmp_path, pidfile))
    args = ["chat", "-m", str(path), "--mcp", str(file), "-n", "160", "--max-tool-steps", "1", "-t", "1"]
    child = pexpect.spawn(
        sys.executable,
        ["-c", BIASED, str(marker), *args, "--seed", "3", "--ctx", "4096"],
        env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"},
        encoding="utf-8",
        timeout=120,
        dimensions=(40, 120),
    )

    def turn(message: str, answer: str | None) -> int:
        """Send ``message``; answer each approval prompt with ``answer`` until the reply ends; the prompts seen."""
        child.sendline(message)
        asked = 0
        while child.expect([ASKED, PROMPT]) == 0:
            assert answer is not None, "asked about a tool already allowed"
            asked += 1
            child.sendline(answer)
        return asked

    try:
        child.expect(PROMPT)
        assert turn("Add 2 and 40.", "n") >= 1
        assert ran(tmp_path) == []  # refused: nothing ran
        assert turn("Now add 1 and 1.", "a") == 1  # always: the rest of the turn's calls run unasked
        allowed = ran(tmp_path)
        assert allowed and all(line.startswith("add {") for line in allowed)
        assert turn("And 3 and 4?", None) == 0  # no prompt: still allowed
        assert len(ran(tmp_path)) > len(allowed)
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
