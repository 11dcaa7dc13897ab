"""`localrun launch`: a stand-in agent on PATH (named claude, codex or
opencode) records its environment and arguments and, from inside, calls
the server at the URL and with the token it was given, as the real agent
would: Claude Code by Anthropic's /v1/messages, Codex by its provider's
base URL and key variable, opencode by the provider in its configuration."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localrun import paths
from localrun.launch.agents import Endpoint, configure
from localrun.launch.server import free_port, is_localrun, model_contexts
from localrun.launch.write import config_text, write_config
from localrun.store import registry
from tests.helpers import cli, cli_process

STANDIN = """#!{python}
import json, os, signal, sys, time, urllib.request

agent = os.path.basename(sys.argv[0])
args = sys.argv[1:]
env = dict(os.environ)


def call(url, token, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={{"Authorization": "Bearer " + token,
                                                               "Content-Type": "application/json"}})
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.status, json.loads(response.read())


if agent == "claude":
    hello = [{{"role": "user", "content": "hi"}}]
    reply = call(env["ANTHROPIC_BASE_URL"] + "/v1/messages", env["ANTHROPIC_AUTH_TOKEN"],
                 {{"model": env["ANTHROPIC_MODEL"], "max_tokens": 2, "messages": hello}})
elif agent == "codex":
    settings = {{}}
    for i, arg in enumerate(args):
        if arg == "-c":
            key, _, value = args[i + 1].partition("=")
            settings[key] = json.loads(value)
    provider = "model_providers." + settings["model_provider"] + "."
    assert settings[provider + "wire_api"] == "responses"
    base, token = settings[provider + "base_url"], env[settings[provider + "env_key"]]
    model = args[args.index("-m") + 1]
    listed = call(base + "/models", token)
    reply = call(base + "/chat/completions", token,
                 {{"model": model, "max_tokens": 2, "messages": [{{"role": "user", "content": "hi"}}]}})
    reply = (reply[0], {{"model": reply[1]["model"], "listed": [m["id"] for m in listed[1]["data"]]}})
else:
    config = json.loads(env["OPENCODE_CONFIG_CONTENT"])
    provider_id, _, model = config["model"].partition("/")
    provider = config["provider"][provider_id]
    assert provider["npm"] == "@ai-sdk/openai-compatible" and model in provider["models"]
    key = provider["options"]["apiKey"]
    token = env[key[len("{{env:"):-1]] if key.startswith("{{env:") else key
    reply = call(provider["options"]["baseURL"] + "/chat/completions", token,
                 {{"model": model, "max_tokens": 2, "messages": [{{"role": "user", "content": "hi"}}]}})
if env.get("STANDIN_CTRL_C"):  # a Ctrl-C at the terminal reaches launch too
    os.kill(os.getppid(), signal.SIGINT)
with open(env["STANDIN_OUT"], "w") as f:
    json.dump({{"agent": agent, "args": args, "env": env, "status": reply[0], "reply": reply[1]}}, f)
time.sleep(float(env.get("STANDIN_SLEEP", "0")))  # a session that goes on until ended
sys.exit(int(env.get("STANDIN_EXIT", "0")))
"""

AGENTS = ("claude", "codex", "opencode")


@pytest.fixture
def agents_bin(tmp_path: Path) -> Path:
    """A folder of stand-in agents, one per name."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in AGENTS:
        script = folder / name
        script.write_text(STANDIN.format(python=sys.executable))
        script.chmod(0o755)
    return folder


def _env(agents_bin: Path, out: Path, **extra: str) -> dict[str, str]:
    return {"PATH": f"{agents_bin}{os.pathsep}{os.environ['PATH']}", "STANDIN_OUT": str(out), **extra}


def _record(out: Path) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(out.read_text())
    return record


def _refused(url: str) -> bool:
    try:
        urllib.request.urlopen(f"{url}/health", timeout=2)
    except urllib.error.URLError as exc:
        return isinstance(exc.reason, ConnectionRefusedError)
    return False


def _base_url(record: dict[str, Any]) -> str:
    env = record["env"]
    if record["agent"] == "claude":
        return str(env["ANTHROPIC_BASE_URL"])
    if record["agent"] == "codex":
        base = next(a for a in record["args"] if a.startswith("model_providers.localrun.base_url="))
        return str(json.loads(base.partition("=")[2])).removesuffix("/v1")
    config = json.loads(env["OPENCODE_CONFIG_CONTENT"])
    return str(config["provider"]["localrun"]["options"]["baseURL"]).removesuffix("/v1")


@pytest.mark.slow
@pytest.mark.parametrize("agent", AGENTS)
def test_a_started_server_serves_the_agent_then_stops(
    agent: str, agents_bin: Path, tiny_model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "agent.json"
    unused = free_port()
    result = cli_process(
        "launch", agent, "--model", str(tiny_model), "--port", str(unused), "--", "--extra", "arg",
        env=_env(agents_bin, out, STANDIN_EXIT="3"),
    )  # fmt: skip
    assert result.returncode == 3, result.stderr  # the agent's exit status is launch's
    record = _record(out)
    assert record["status"] == 200
    env, args = record["env"], record["args"]
    assert args[-2:] == ["--extra", "arg"]  # the user's arguments, after launch's own
    url = _base_url(record)
    assert url.startswith("http://127.0.0.1:") and not url.endswith(f":{unused}")  # a fresh port, not --port
    if agent == "claude":
        assert record["reply"]["type"] == "message" and record["reply"]["model"] == "tiny"
        token = env["ANTHROPIC_AUTH_TOKEN"]
        for variable in ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL"):
            assert env[variable] == "tiny"
        assert env["ANTHROPIC_API_KEY"] == ""
        assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
        assert env["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0" and env["CLAUDE_CODE_TOTAL_TOKENS_REMINDER"] == "off"
    else:
        token = env["LOCALRUN_API_KEY"]
        assert record["reply"]["model"] == "tiny"
    if agent == "codex":
        assert record["reply"]["listed"] == ["tiny"]
        assert args[args.index("-m") + 1] == "tiny"
        window = next(a for a in args if a.startswith("model_context_window="))
        assert int(window.partition("=")[2]) > 0  # the served model's context
    assert len(token) >= 20 and token != os.environ.get("LOCALRUN_API_KEY")  # a fresh random key
    assert _refused(url)  # the server launch started is gone once the agent has exited
    assert "starting localrun serve" in result.stderr


@pytest.mark.slow
def test_a_ctrl_c_is_the_agents_and_the_server_still_stops(agents_bin: Path, tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "agent.json"
    result = cli_process(
        "launch", "claude", "-m", str(tiny_model), env=_env(agents_bin, out, STANDIN_CTRL_C="1")
    )  # fmt: skip
    assert result.returncode == 0, result.stderr  # launch waited for the agent, which exited 0
    record = _record(out)
    assert record["status"] == 200
    assert _refused(_base_url(record))


@pytest.mark.slow
def test_a_sigterm_ends_the_agent_then_the_server(agents_bin: Path, tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "agent.json"
    launch = subprocess.Popen(
        [sys.executable, "-m", "localrun", "launch", "opencode", "-m", str(tiny_model)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, **_env(agents_bin, out, STANDIN_SLEEP="120")},
    )
    try:
        deadline = time.monotonic() + 120
        while not out.exists() or not out.read_text():  # the agent has run its request and now waits
            assert launch.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(0.2)
        launch.send_signal(signal.SIGTERM)
        _, stderr = launch.communicate(timeout=60)
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.wait()
    assert launch.returncode == 128 + signal.SIGTERM, stderr  # the agent's end, passed on
    assert _refused(_base_url(_record(out)))


@pytest.fixture
def running_server(tiny_model: Path, tmp_path: Path) -> Iterator[tuple[int, str]]:
    """A `localrun serve` started by hand, with a key: (port, key)."""
    port, key = free_port(), "sekrit-key-for-the-test"
    log = (tmp_path / "serve.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "localrun", "serve", "-m", str(tiny_model), "--port", str(port)],
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "LOCALRUN_API_KEY": key},
    )
    try:
        deadline = time.monotonic() + 120
        while not is_localrun(f"http://127.0.0.1:{port}"):
            assert process.poll() is None, (tmp_path / "serve.log").read_text()
            assert time.monotonic() < deadline
            time.sleep(0.2)
        yield port, key
        assert process.poll() is None  # launch left it running
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        log.close()


@pytest.mark.slow
def test_a_running_server_is_used_and_left_running(
    agents_bin: Path, running_server: tuple[int, str], tmp_path: Path, tiny_model: Path
) -> None:
    port, key = running_server
    out = tmp_path / "agent.json"
    env = _env(agents_bin, out, LOCALRUN_API_KEY=key, LOCALRUN_MODEL=str(tiny_model))
    result = cli_process("launch", "codex", "--port", str(port), env=env)
    assert result.returncode == 0, result.stderr
    record = _record(out)
    assert _base_url(record) == f"http://127.0.0.1:{port}"
    assert record["env"]["LOCALRUN_API_KEY"] == key
    assert record["status"] == 200 and record["reply"]["model"] == "tiny"
    assert "starting" not in result.stderr and f"using the localrun server at http://127.0.0.1:{port}" in result.stderr
    assert is_localrun(f"http://127.0.0.1:{port}")


@pytest.mark.slow
def test_a_running_server_without_the_key_is_a_clear_error(
    agents_bin: Path, running_server: tuple[int, str], tmp_path: Path
) -> None:
    port, _key = running_server
    out = tmp_path / "agent.json"
    result = cli("launch", "claude", "-m", "tiny", "--port", str(port), env=_env(agents_bin, out))
    assert result.returncode == 10, result.stderr  # REMOTE_FAILED
    assert "needs an API key" in result.stderr and "LOCALRUN_API_KEY" in result.stderr
    assert not out.exists()  # the agent never ran


def test_a_server_that_cannot_start_is_reported_with_its_words(agents_bin: Path, tmp_path: Path) -> None:
    out = tmp_path / "agent.json"
    result = cli_process("launch", "opencode", "-m", str(tmp_path / "missing.gguf"), env=_env(agents_bin, out))
    assert result.returncode == 1
    assert "localrun serve stopped before it was ready" in result.stderr
    assert "missing.gguf" in result.stderr  # serve's own error, passed on
    assert not out.exists()


@pytest.mark.parametrize("agent", AGENTS)
def test_an_agent_not_installed_is_one_line_and_how_to_install(agent: str, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = cli("launch", agent, "-m", "tiny", env={"PATH": str(empty)})
    assert result.returncode == 127
    first, hint = result.stderr.splitlines()
    assert first.startswith("error: ") and "not installed" in first
    assert hint.startswith("hint: npm install -g ")
    assert "starting" not in result.stderr  # no server was started for nothing


def _exports(stdout: str) -> dict[str, str]:
    return dict(line.removeprefix("export ").split("=", 1) for line in stdout.splitlines())


def test_config_without_a_model_takes_the_default_model_as_every_command_does() -> None:
    default = registry.load().default
    result = cli("launch", "claude", "--config")
    assert result.returncode == 0, result.stderr  # not "no model" (exit 3)
    assert _exports(result.stdout)["ANTHROPIC_MODEL"] == default  # the registry's default
    (paths.config_dir()).mkdir(parents=True, exist_ok=True)
    (paths.config_dir() / "config.toml").write_text('[defaults]\nmodel = "qwen2.5-coder:0.5b"\n')
    chosen = cli("launch", "codex", "--config")
    assert chosen.returncode == 0, chosen.stderr
    assert tomllib.loads(chosen.stdout)["model"] == "qwen2.5-coder:0.5b"  # config.toml's model before it
    env = cli("launch", "opencode", "--config", env={"LOCALRUN_MODEL": "qwen"})
    assert json.loads(env.stdout)["model"] == "localrun/qwen"  # LOCALRUN_MODEL before both


def test_claude_code_keeps_the_prompt_cache_warm() -> None:
    result = cli("launch", "claude", "--config", "-m", "qwen")
    lines = _exports(result.stdout)
    assert lines["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0"
    assert lines["CLAUDE_CODE_TOTAL_TOKENS_REMINDER"] == "off"


def test_codex_is_given_the_models_context_window(tmp_path: Path) -> None:
    endpoint = Endpoint("http://127.0.0.1:8080")
    config = configure("codex", endpoint, "qwen", 4096)
    assert config.args[config.args.index("model_context_window=4096") - 1] == "-c"
    assert tomllib.loads(config_text(config))["model_context_window"] == 4096
    home = tmp_path / "codex"
    home.mkdir()
    (home / "config.toml").write_text('model = "gpt-5"\nmodel_context_window = 400000\n')
    written = write_config(config, home / "config.toml")
    merged = tomllib.loads(written.path.read_text())
    assert merged["model"] == "qwen" and merged["model_context_window"] == 4096  # the old model's dropped
    unknown = configure("codex", endpoint, "qwen")  # not loaded yet: Codex keeps its own guess
    assert "model_context_window" not in config_text(unknown) and not any("context" in a for a in unknown.args)


def test_the_context_window_is_read_from_the_servers_model_list() -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    listing = {"data": [{"id": "a", "meta": {"n_ctx": 8192}}, {"id": "b"}, {"id": "c", "meta": {"n_ctx": True}}]}

    class Models(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(listing).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        contexts = model_contexts(Endpoint(f"http://127.0.0.1:{server.server_address[1]}"))
    finally:
        server.shutdown()
        server.server_close()
    assert contexts == {"a": 8192, "b": None, "c": None}


def test_config_prints_claude_codes_variables() -> None:
    result = cli("launch", "claude", "--config", "-m", "qwen2.5-coder:0.5b", "--port", "8123")
    assert result.returncode == 0, result.stderr
    lines = dict(line.removeprefix("export ").split("=", 1) for line in result.stdout.splitlines())
    assert lines["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8123"
    assert lines["ANTHROPIC_MODEL"] == lines["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == "qwen2.5-coder:0.5b"
    assert lines["ANTHROPIC_AUTH_TOKEN"] == "localrun"  # no key set: any value does, and Claude Code needs one


def test_config_prints_codex_toml_and_opencode_json(tmp_path: Path) -> None:
    model = tmp_path / "my-model.gguf"
    codex = cli("launch", "codex", "--config", "-m", str(model))
    assert codex.returncode == 0, codex.stderr
    toml = tomllib.loads(codex.stdout)
    assert toml["model"] == "my-model" and toml["model_provider"] == "localrun"  # a file: what serve calls it
    provider = toml["model_providers"]["localrun"]
    assert provider["wire_api"] == "responses" and provider["base_url"] == "http://127.0.0.1:8080/v1"
    assert provider["env_key"] == "LOCALRUN_API_KEY"
    assert "config.toml" in codex.stderr and "LOCALRUN_API_KEY" in codex.stderr
    opencode = cli("launch", "opencode", "--config", "-m", "qwen", env={"LOCALRUN_API_KEY": "k"})
    config = json.loads(opencode.stdout)
    assert config["model"] == "localrun/qwen"
    assert config["provider"]["localrun"]["options"] == {
        "baseURL": "http://127.0.0.1:8080/v1",
        "apiKey": "{env:LOCALRUN_API_KEY}",  # the key stays out of the file
    }


def test_config_write_merges_claudes_settings_and_keeps_a_backup(tmp_path: Path) -> None:
    folder = tmp_path / "claude"
    folder.mkdir()
    settings = folder / "settings.json"
    before = {"theme": "dark", "env": {"MY_VAR": "1", "ANTHROPIC_MODEL": "old"}}
    settings.write_text(json.dumps(before))
    result = cli("launch", "claude", "--config", "--write", "-m", "qwen", env={"CLAUDE_CONFIG_DIR": str(folder)})
    assert result.returncode == 0, result.stderr
    after = json.loads(settings.read_text())
    assert after["theme"] == "dark" and after["env"]["MY_VAR"] == "1"
    assert after["env"]["ANTHROPIC_MODEL"] == "qwen" and after["env"]["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8080"
    backups = list(folder.glob("settings.json.localrun-backup-*"))
    assert len(backups) == 1 and json.loads(backups[0].read_text()) == before
    assert str(settings) in result.stderr and str(backups[0]) in result.stderr
    again = cli("launch", "claude", "--config", "--write", "-m", "qwen", env={"CLAUDE_CONFIG_DIR": str(folder)})
    assert "already holds" in again.stderr and len(list(folder.glob("settings.json.localrun-backup-*"))) == 1


def test_config_write_keeps_the_rest_of_codexs_config_toml(tmp_path: Path) -> None:
    home = tmp_path / "codex"
    home.mkdir()
    config = home / "config.toml"
    config.write_text(
        '# my settings\nmodel = "gpt-5"\napproval_policy = "on-request"\n\n'
        '[model_providers.localrun]\nbase_url = "http://old/v1"\n\n'
        '[model_providers.other]\nname = "other"  # keep me\nbase_url = "http://other/v1"\n'
    )
    result = cli("launch", "codex", "--config", "--write", "-m", "qwen", env={"CODEX_HOME": str(home)})
    assert result.returncode == 0, result.stderr
    text = config.read_text()
    toml = tomllib.loads(text)
    assert toml["model"] == "qwen" and toml["model_provider"] == "localrun" and toml["approval_policy"] == "on-request"
    assert toml["model_providers"]["localrun"]["base_url"] == "http://127.0.0.1:8080/v1"
    assert toml["model_providers"]["localrun"]["wire_api"] == "responses"
    assert toml["model_providers"]["other"] == {"name": "other", "base_url": "http://other/v1"}
    assert "# my settings" in text and "# keep me" in text  # comments stay
    assert len(list(home.glob("config.toml.localrun-backup-*"))) == 1


def test_config_write_refuses_a_file_it_cannot_read_as_json(tmp_path: Path) -> None:
    folder = tmp_path / "xdg"
    config = folder / "opencode" / "opencode.json"
    config.parent.mkdir(parents=True)
    text = '{\n  // a comment: JSONC\n  "theme": "x",\n}\n'
    config.write_text(text)
    result = cli("launch", "opencode", "--config", "--write", "-m", "qwen", env={"XDG_CONFIG_HOME": str(folder)})
    assert result.returncode == 6  # BAD_CONFIG
    assert "not rewritten" in result.stderr
    assert config.read_text() == text and list(config.parent.iterdir()) == [config]


def test_config_write_creates_opencodes_file(tmp_path: Path) -> None:
    folder = tmp_path / "xdg"
    result = cli("launch", "opencode", "--config", "--write", "-m", "qwen", env={"XDG_CONFIG_HOME": str(folder)})
    assert result.returncode == 0, result.stderr
    config = json.loads((folder / "opencode" / "opencode.json").read_text())
    assert config["model"] == "localrun/qwen" and "qwen" in config["provider"]["localrun"]["models"]


def test_write_needs_config() -> None:
    result = cli("launch", "claude", "--write", "-m", "qwen")
    assert result.returncode == 2 and "--write goes with --config" in result.stderr


def test_config_write_refuses_a_provider_it_cannot_replace(tmp_path: Path) -> None:
    home = tmp_path / "codex"
    home.mkdir()
    config = home / "config.toml"
    text = 'model_providers = { localrun = { base_url = "http://mine/v1" } }\n'
    config.write_text(text)
    result = cli("launch", "codex", "--config", "--write", "-m", "qwen", env={"CODEX_HOME": str(home)})
    assert result.returncode == 6, result.stderr
    assert "cannot replace" in result.stderr
    assert config.read_text() == text and list(home.iterdir()) == [config]  # untouched, no backup


@pytest.mark.slow
def test_another_server_on_the_port_is_not_taken_for_localrun(
    agents_bin: Path, tiny_model: Path, tmp_path: Path
) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class LlamaServerLike(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"status": "ok"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    other = ThreadingHTTPServer(("127.0.0.1", 0), LlamaServerLike)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        port = other.server_address[1]
        out = tmp_path / "agent.json"
        result = cli_process("launch", "claude", "-m", str(tiny_model), "--port", str(port), env=_env(agents_bin, out))
    finally:
        other.shutdown()
        other.server_close()
    assert result.returncode == 0, result.stderr
    assert "starting localrun serve" in result.stderr
    record = _record(out)
    assert record["status"] == 200 and not _base_url(record).endswith(f":{port}")


def _serving_on(port: str) -> list[str]:
    """The processes whose command line is `localrun serve ... --port PORT`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in args and b"--port" in args and args[args.index(b"--port") + 1] == port.encode():
            found.append(cmdline.parent.name)
    return found


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads the process list from /proc")
def test_a_server_not_ready_in_time_is_an_error_and_is_stopped(
    agents_bin: Path, tiny_model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "agent.json"
    result = cli_process("launch", "codex", "-m", str(tiny_model), "--timeout", "0.3", env=_env(agents_bin, out))
    assert result.returncode == 1, result.stderr
    assert "localrun serve was not ready after 0.3 s" in result.stderr and "--timeout" in result.stderr
    port = result.stderr.split("starting localrun serve on 127.0.0.1:", 1)[1].split()[0]
    assert not _serving_on(port)  # stopped, not left behind
    assert not out.exists()


def test_claude_codes_tool_arguments_keep_the_models_key_order() -> None:
    """Claude Code sends a call back as it got it: the same bytes in the
    same order keep the prompt cache's prefix."""
    from localrun.serve.anthropic import _tool_blocks, chat_request
    from localrun.structured.toolcalls.calls import Call

    arguments = {"zone": "Europe/Paris", "city": "Paris", "units": {"temp": "C", "speed": "km/h"}}
    (block,) = _tool_blocks([Call("get_weather", arguments)])
    assert json.dumps(block["input"]) == json.dumps(arguments)  # as written, not sorted
    use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": arguments}
    body = {
        "model": "m",
        "max_tokens": 8,
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18"}]},
        ],
    }
    request = chat_request(json.dumps(body).encode())
    call = request.model_dump()["messages"][1]["tool_calls"][0]["function"]
    assert list(json.loads(call["arguments"])) == ["zone", "city", "units"]
    assert call["arguments"].index('"zone"') < call["arguments"].index('"city"') < call["arguments"].index('"units"')
