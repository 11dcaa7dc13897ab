"""The MCP client: real servers over stdio and streamable HTTP, started once,
their tools named `<server>_<tool>`, called, and stopped; each way a server
can fail is one line, and the session goes on with the others."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from localrun.mcp.host import ToolHost
from localrun.mcp.servers import ServerSpec
from tests.mcp.conftest import FACTS, RAW, alive, pids, python_server


def test_stdio_server_tools_are_listed_called_and_the_server_stopped(pidfile: Path) -> None:
    host = ToolHost([python_server("facts", FACTS, env={"LOCALRUN_TEST_PIDFILE": str(pidfile)})])
    with host:
        tools = {t.name: t for t in host.start()}
        assert {"facts_badge_number", "facts_add", "facts_slow", "facts_fail", "facts_crash"} <= set(tools)
        badge = tools["facts_badge_number"]
        assert (badge.server, badge.tool) == ("facts", "badge_number")
        assert badge.parameters["properties"]["person"]["type"] == "string"
        assert "badge number" in badge.description
        assert host.problems == []
        result = host.call("facts_badge_number", {"person": "Bob"}, timeout=30)
        assert (result.text, result.status) == ("Z-2208", "ok")
        assert host.call("facts_add", {"a": 2, "b": 40}, timeout=30).text == "42"
        (pid,) = pids(pidfile)
        assert alive(pid)
    assert not alive(pid)


def test_a_tool_error_and_a_timeout_are_results(pidfile: Path) -> None:
    with ToolHost([python_server("facts", FACTS, env={"LOCALRUN_TEST_PIDFILE": str(pidfile)})]) as host:
        host.start()
        failed = host.call("facts_fail", {"reason": "testing"}, timeout=30)
        assert failed.status == "error" and "failed on purpose: testing" in failed.text
        slow = host.call("facts_slow", {"seconds": 30}, timeout=0.5)
        assert slow.status == "timeout" and "did not answer within 0.5 s" in slow.text
        assert host.call("facts_add", {"a": 1, "b": 1}, timeout=30).text == "2"  # the server goes on


def test_a_server_that_exits_mid_call_is_an_error_result_and_the_others_go_on(pidfile: Path) -> None:
    env = {"LOCALRUN_TEST_PIDFILE": str(pidfile)}
    with ToolHost([python_server("facts", FACTS, env=env), python_server("raw", RAW, env=env)]) as host:
        host.start()
        crashed = host.call("facts_crash", {}, timeout=30)
        assert crashed.status == "error"
        again = host.call("facts_add", {"a": 1, "b": 2}, timeout=30)
        assert again.status == "error" and "stopped" in again.text
        assert host.call("raw_echo", {"text": "hi"}, timeout=30).text == "echo: hi"


def test_servers_that_cannot_start_are_one_line_each(pidfile: Path, tmp_path: Path) -> None:
    env = {"LOCALRUN_TEST_PIDFILE": str(pidfile)}
    says = tmp_path / "says.py"
    says.write_text("import sys\nprint('no API key given', file=sys.stderr)\nsys.exit(2)\n")
    specs = [
        ServerSpec("missing", "test", command=str(tmp_path / "no-such-program")),
        python_server("exits", says),
        python_server("raw", RAW, env=env),
    ]
    with ToolHost(specs) as host:
        tools = host.start()
        assert [t.name for t in tools] == ["raw_echo"]
        assert len(host.problems) == 2
        exits, missing = sorted(host.problems)
        assert "MCP server exits: cannot start" in exits and "no API key given" in exits
        assert "MCP server missing: cannot start" in missing and "no such program" in missing


def test_a_server_that_never_answers_is_left_out_after_the_start_timeout(pidfile: Path) -> None:
    env = {"LOCALRUN_TEST_PIDFILE": str(pidfile)}
    with ToolHost([python_server("silent", RAW, "silent", env=env)], start_timeout=3) as host:
        assert host.start() == []
        assert host.problems == ["MCP server silent: did not start within 3 s; left out"]


def test_garbage_lines_from_a_server_are_skipped(pidfile: Path) -> None:
    with ToolHost([python_server("g", RAW, "garbage", env={"LOCALRUN_TEST_PIDFILE": str(pidfile)})]) as host:
        assert [t.name for t in host.start()] == ["g_echo"]
        assert host.call("g_echo", {"text": "x"}, timeout=30).text == "echo: x"


def test_a_tool_with_an_invalid_schema_is_left_out_and_the_rest_offered(pidfile: Path) -> None:
    with ToolHost([python_server("b", RAW, "bad-schema", env={"LOCALRUN_TEST_PIDFILE": str(pidfile)})]) as host:
        tools = host.start()
        assert [t.name for t in tools] == ["b_echo"]
        broken, typo = host.problems
        assert broken.startswith("MCP server b: tool b_broken: not a valid JSON Schema at properties")
        assert typo.startswith("MCP server b: tool b_typo: not a valid JSON Schema at properties/x/type")
        assert broken.endswith("the tool is left out") and typo.endswith("the tool is left out")
        assert host.call("b_echo", {"text": "still here"}, timeout=30).text == "echo: still here"


def test_streamable_http_server(http_server: str) -> None:
    with ToolHost([ServerSpec("web", "test", url=http_server, headers={"X-Test": "1"})]) as host:
        names = [t.name for t in host.start()]
        assert "web_badge_number" in names and host.problems == []
        assert host.call("web_badge_number", {"person": "carol"}, timeout=30).text == "K-4415"


def test_an_http_server_nobody_listens_on_is_one_line() -> None:
    with ToolHost([ServerSpec("web", "test", url="http://127.0.0.1:9/mcp")], start_timeout=20) as host:
        assert host.start() == []
        assert len(host.problems) == 1 and host.problems[0].startswith("MCP server web: cannot start")


def test_ctrl_c_stops_the_servers(tmp_path: Path, pidfile: Path) -> None:
    """A command interrupted while its servers run leaves none of them behind."""
    script = tmp_path / "session.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys, time
        from localrun.mcp.host import ToolHost
        from localrun.mcp.servers import ServerSpec
        env = {{"LOCALRUN_TEST_PIDFILE": {str(pidfile)!r}}}
        specs = [ServerSpec(n, "t", command=sys.executable, args=({str(FACTS)!r},), env=env) for n in ("a", "b")]
        with ToolHost(specs) as host:
            host.start()
            print("ready", flush=True)
            time.sleep(120)
    """)
    )
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=Path.cwd())
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        started = pids(pidfile)
        assert len(started) == 2 and all(alive(pid) for pid in started)
        child.send_signal(signal.SIGINT)
        child.wait(60)
    finally:
        child.kill()
        if child.stdout is not None:
            child.stdout.close()
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in started) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in started)


def test_a_tool_is_declared_to_the_model_without_its_schemas_titles() -> None:
    """The SDK titles every schema ("stock_levelArguments"), which a small model
    writes as the tool's name; a property named title, and values, stay."""
    from localrun.mcp.host import Tool

    schema = {
        "type": "object",
        "title": "lookupArguments",
        "properties": {
            "title": {"type": "string", "title": "Title"},
            "kind": {"enum": ["a", "b"], "default": "a", "title": "Kind"},
        },
        "required": ["title"],
    }
    tool = Tool("srv_lookup", "srv", "lookup", "Find a book.", schema)
    parameters = tool.declared()["function"]["parameters"]
    assert parameters == {
        "type": "object",
        "properties": {"title": {"type": "string"}, "kind": {"enum": ["a", "b"], "default": "a"}},
        "required": ["title"],
    }
    assert tool.parameters["title"] == "lookupArguments"  # what `localrun tools --json` shows is the server's own
