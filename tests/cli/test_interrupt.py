"""Ctrl-C at every stage of every command, with a real SIGINT.

Each run is `localrun` in a subprocess, started through a wrapper that
patches the stage's function so that its N-th call sends SIGINT to its own
process (before or after the call, or twice: the second Ctrl-C), then goes
on; or that does it from llama.cpp's log callback on its N-th line, which is
where a Ctrl-C pressed while llama.cpp works in C is handled. Then: exit 130,
a short message, no traceback, and what was done is kept.

The rule the commands follow: Ctrl-C that cuts work short exits 130.
A server (`serve`) and a chat session at its prompt run until the user stops
them: there Ctrl-C is the way to end, and the exit status is 0 (a server's
second Ctrl-C, which cuts the requests in flight short, is 130).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import pytest

from tests.fakehub import HubState, serve
from tests.helpers import cli, cli_process

# argv[1]: "TARGET@N[@WHEN],..." where TARGET is module:qualified.name, or
# "log" for llama.cpp's N-th log line; WHEN is before (default), after or twice.
WRAPPER = """
import importlib, os, signal, sys

from localrun.runtime import load
load.runnable_others = lambda: 0  # the machine reads idle: tune and bench keep what they measure

def ctrl_c(times):
    for _ in range(times):
        os.kill(os.getpid(), signal.SIGINT)

def on_nth(nth, when, original):
    calls = 0
    def wrapped(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == nth and when != "after":
            ctrl_c(2 if when == "twice" else 1)
        result = original(*args, **kwargs)
        if calls == nth and when == "after":
            ctrl_c(1)
        return result
    return wrapped

for spec in sys.argv[1].split(","):
    target, nth, *rest = spec.split("@")
    when = rest[0] if rest else "before"
    if target == "log":
        from localrun.runtime import llama_log
        llama_log._listeners.append(on_nth(int(nth), when, lambda level, text: None))
        continue
    module, _, qualname = target.partition(":")
    *path, name = qualname.split(".")
    owner = importlib.import_module(module)
    for part in path:
        owner = getattr(owner, part)
    setattr(owner, name, on_nth(int(nth), when, getattr(owner, name)))

from localrun.cli import main
sys.exit(main(sys.argv[2:]))
"""

DECODE = "localrun.runtime.decoder:decode"  # one call per token, the first evaluates the prompt
SHARED_DECODE = "localrun.runtime.llama:Batch.decode"  # --batch: one call per shared step


def interrupted(
    spec: str, *args: str, input: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`localrun ARGS`, with Ctrl-C where ``spec`` says (stdin /dev/null without ``input``)."""
    return subprocess.run(
        [sys.executable, "-c", WRAPPER, spec, *args],
        input=input,
        stdin=subprocess.DEVNULL if input is None else None,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        check=False,
    )


def assert_interrupted(res: subprocess.CompletedProcess[str]) -> None:
    """Exit 130, one short line saying so, and no traceback or ignored exception."""
    assert res.returncode == 130, res.stderr
    assert "interrupted" in res.stderr
    assert "Traceback" not in res.stderr and "Exception ignored" not in res.stderr, res.stderr


def history_rows() -> list[dict[str, object]]:
    res = cli("logs", "--json")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    return rows if isinstance(rows, list) else list(rows.get("runs", []))


# ----------------------------------------------------------------- start-up --

STARTUP = """
import importlib.abc, os, signal, sys

MODULE = sys.argv.pop(1)

class CtrlCAtImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == MODULE:
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, CtrlCAtImport())
from localrun.entry import main
sys.exit(main())
"""


@pytest.mark.parametrize("module", ["typer", "localrun.cli.generate"])
def test_while_the_command_line_is_imported(module: str) -> None:
    """Importing the command line (Typer, the commands) takes a moment: a Ctrl-C there too is 130, not a traceback."""
    res = subprocess.run(
        [sys.executable, "-c", STARTUP, module, "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert_interrupted(res)
    assert res.stdout == ""


# ---------------------------------------------------------------- generate --


@pytest.mark.parametrize("line", [1, 40])
def test_during_the_model_load(tiny_model: Path, line: int) -> None:
    """While llama.cpp loads (it logs as it goes), Ctrl-C ends the run once the load returns."""
    res = interrupted(f"log@{line}", "generate", "-m", str(tiny_model), "-n", "5", "hello")
    assert_interrupted(res)
    assert res.stdout == ""


def test_during_prompt_evaluation(tiny_model: Path) -> None:
    """In the abort check llama.cpp calls while it evaluates the prompt: it stops there."""
    res = interrupted("localrun.runtime.engine:Engine._should_abort@1", "generate", "-m", str(tiny_model), "hello")
    assert_interrupted(res)
    assert "stop: interrupted" in res.stderr


def test_second_ctrl_c_in_the_abort_check_still_ends_the_run(tiny_model: Path) -> None:
    res = interrupted("localrun.runtime.engine:Engine._should_abort@1@twice", "generate", "-m", str(tiny_model), "hi")
    assert_interrupted(res)


def test_during_decode_the_text_so_far_is_kept(tiny_model: Path) -> None:
    full = cli_process("generate", "-m", str(tiny_model), "-t", "0", "-n", "40", "hello")
    assert full.returncode == 0, full.stderr
    res = interrupted(f"{DECODE}@8", "generate", "-m", str(tiny_model), "-t", "0", "-n", "40", "--stats", "hello")
    assert_interrupted(res)
    assert "stop: interrupted" in res.stderr
    assert res.stdout.strip() and full.stdout.startswith(res.stdout.rstrip("\n"))
    assert len(res.stdout.strip()) < len(full.stdout.strip())


def test_second_ctrl_c_during_decode(tiny_model: Path) -> None:
    res = interrupted(f"{DECODE}@8@twice", "generate", "-m", str(tiny_model), "-t", "0", "-n", "40", "hello")
    assert_interrupted(res)
    assert res.stdout.strip()  # the tokens before it were written


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_a_reader_that_leaves_midway_ends_quietly(tiny_model: Path, command: str) -> None:
    """`| head -c 20`: the generation stops with its engine still open (it used to crash once freed)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "localrun", command, "-m", str(tiny_model), "-t", "0", "-n", "200"]
        + (["a b c a b c"] if command == "generate" else []),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write(b"a b c\nd e f\n")
    proc.stdin.close()
    assert len(proc.stdout.read(20)) == 20
    proc.stdout.close()
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=60) == 0, err
    assert b"Traceback" not in err


def test_json_output_stays_valid_and_the_run_is_logged(tiny_model: Path) -> None:
    res = interrupted(f"{DECODE}@8", "generate", "-m", str(tiny_model), "-n", "40", "--json", "hello")
    assert_interrupted(res)
    events = [json.loads(line) for line in res.stdout.splitlines()]
    assert events and events[-1]["stop_reason"] == "interrupted"
    runs = history_rows()
    assert len(runs) == 1 and "interrupted" in json.dumps(runs[0])


# ------------------------------------------------------------------- batch --


@pytest.fixture
def batch_input(tmp_path: Path) -> Path:
    src = tmp_path / "in.jsonl"
    src.write_text(
        '{"id": "quick", "prompt": "a", "max_tokens": 2}\n'
        '{"id": "slow", "prompt": "b", "max_tokens": 60}\n'
        '{"id": "slow too", "prompt": "c", "max_tokens": 60}\n'
    )
    return src


def test_batch_keeps_the_finished_lines(tiny_model: Path, batch_input: Path) -> None:
    args = ("generate", "-m", str(tiny_model), "-t", "0", "--batch", str(batch_input))
    res = interrupted(f"{SHARED_DECODE}@8", *args)
    assert_interrupted(res)
    assert [json.loads(line)["id"] for line in res.stdout.splitlines()] == ["quick"]
    assert [row["prompt"] for row in history_rows()] == ["a"]  # the finished line is logged too


def test_batch_second_ctrl_c_still_writes_and_logs_the_finished_lines(tiny_model: Path, batch_input: Path) -> None:
    args = ("generate", "-m", str(tiny_model), "-t", "0", "--batch", str(batch_input))
    res = interrupted(f"{SHARED_DECODE}@8@twice", *args)
    assert_interrupted(res)
    assert [json.loads(line)["id"] for line in res.stdout.splitlines()] == ["quick"]
    assert [row["prompt"] for row in history_rows()] == ["a"]


def test_batch_resume_runs_only_what_is_missing(tiny_model: Path, batch_input: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    args = ("generate", "-m", str(tiny_model), "-t", "0", "--batch", str(batch_input), "--resume", str(out))
    assert_interrupted(interrupted(f"{SHARED_DECODE}@8", *args))
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["quick"]
    again = cli_process(*args)
    assert again.returncode == 0, again.stderr
    assert sorted(json.loads(line)["id"] for line in out.read_text().splitlines()) == ["quick", "slow", "slow too"]


def test_batch_during_its_load(tiny_model: Path, batch_input: Path) -> None:
    res = interrupted("log@3", "generate", "-m", str(tiny_model), "--batch", str(batch_input))
    assert_interrupted(res)
    assert res.stdout == ""


# -------------------------------------------------------------------- chat --


def test_piped_chat_keeps_the_reply_so_far_and_runs_no_more_turns(tiny_model: Path) -> None:
    res = interrupted(f"{DECODE}@8", "chat", "-m", str(tiny_model), "-t", "0", "-n", "40", input="one\ntwo\n")
    assert_interrupted(res)
    assert res.stdout.strip() and res.stdout.count("\n") <= 1  # part of the first reply, no second
    turns = [json.dumps(r) for r in history_rows()]
    assert len(turns) == 1 and "interrupted" in turns[0]


def test_chat_during_the_load(tiny_model: Path) -> None:
    assert_interrupted(interrupted("log@5", "chat", "-m", str(tiny_model), input="one\n"))


# -------------------------------------------------------------- quantize --


@pytest.mark.parametrize(
    "spec",
    [
        "log@20",  # llama.cpp is writing the tensors
        "localrun.runtime.quantize:_verify@1",  # the output is written, not yet checked
        "localrun.runtime.quantize:_verify@1@after",  # checked, not yet in place
    ],
)
def test_quantize_leaves_no_file_behind(tiny_model: Path, tmp_path: Path, spec: str) -> None:
    dst = tmp_path / "out" / "tiny-q8_0.gguf"
    dst.parent.mkdir()
    res = interrupted(spec, "quantize", str(tiny_model), str(dst), "--type", "q8_0")
    assert_interrupted(res)
    assert list(dst.parent.iterdir()) == []  # no output, no partial file
    assert res.stdout == ""


def test_quantize_keeps_an_existing_output(tiny_model: Path, tmp_path: Path) -> None:
    dst = tmp_path / "tiny-q8_0.gguf"
    dst.write_bytes(b"the user's older file")
    res = interrupted("log@20", "quantize", str(tiny_model), str(dst), "--type", "q8_0", "--force")
    assert_interrupted(res)
    assert dst.read_bytes() == b"the user's older file"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")) == []


# ----------------------------------------------------------- bench, tune --


def wisdom_file() -> Path:
    from localrun.tune.wisdom import WisdomFile

    return WisdomFile.load().path


def test_bench_before_the_baseline_is_measured(tiny_model: Path) -> None:
    res = interrupted("localrun.ui.bench:BenchProgress.update@1", "bench", "-m", str(tiny_model), "--quick", "-n", "4")
    assert_interrupted(res)
    assert res.stdout == "" and not wisdom_file().exists()


@pytest.mark.parametrize("as_json", [False, True])
def test_bench_shows_the_rows_measured_and_keeps_nothing(wide_model: Path, tmp_path: Path, as_json: bool) -> None:
    chart = tmp_path / "chart.svg"
    args = ["bench", "-m", str(wide_model), "--quick", "--rounds", "1", "-n", "4", "--chart", str(chart)]
    res = interrupted("localrun.ui.bench:BenchProgress.update@3", *args, *(["--json"] if as_json else []))
    assert res.returncode == 130, res.stderr
    assert "Traceback" not in res.stderr and "interrupted: 2 of " in res.stderr  # the baseline and one more
    if as_json:
        result = json.loads(res.stdout)
        assert result["interrupted"] is True
        assert [r["technique"] for r in result["rows"] if r["available"]] == ["baseline", "kv-cache q8_0"]
        assert "not measured: interrupted" in {r["note"] for r in result["rows"]}
    else:
        assert "baseline" in res.stdout and "not measured: interrupted" in res.stdout and "advice" not in res.stdout
    assert not chart.exists() and not wisdom_file().exists()


def test_bench_while_keeping_its_advice(tiny_model: Path) -> None:
    """Ctrl-C as the wisdom file is written: the file is whole or absent, never cut."""
    res = interrupted("localrun.paths:atomic_write@1", "bench", "-m", str(tiny_model), "--quick", "-n", "4")
    assert_interrupted(res)
    path = wisdom_file()
    assert not path.exists() or json.loads(path.read_text())["entries"]
    assert not [p for p in path.parent.glob("*") if p != path] if path.parent.exists() else True


def test_tune_while_measuring(tiny_model: Path) -> None:
    res = interrupted(f"{SHARED_DECODE}@5", "tune", str(tiny_model), "--seconds", "5")
    assert_interrupted(res)
    assert not wisdom_file().exists()


def test_tune_during_the_load(tiny_model: Path) -> None:
    assert_interrupted(interrupted("log@3", "tune", str(tiny_model), "--seconds", "5"))
    assert not wisdom_file().exists()


# -------------------------------------------------------------------- pull --


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[HubState]:
    state = HubState()
    with serve(state) as url:
        monkeypatch.setenv("HF_ENDPOINT", url)
        yield state


def test_pull_keeps_what_it_downloaded_and_resumes(hub: HubState) -> None:
    data = os.urandom(3 * 1024 * 1024 + 5)
    hub.add("tester/tiny-GGUF", "big.gguf", data)
    name = "hf://tester/tiny-GGUF/big.gguf"
    res = interrupted("localrun.ui.progress:PullProgress.update@2", "pull", name)  # after the first MiB
    assert_interrupted(res)
    root = Path(os.environ["HF_HOME"]) / "hub"
    partial = list(root.rglob("*.incomplete"))
    assert len(partial) == 1 and 0 < partial[0].stat().st_size < len(data)
    assert [p for p in root.rglob("blobs/*") if not p.name.endswith(".incomplete")] == []  # nothing unchecked
    kept = partial[0].stat().st_size
    again = cli_process("pull", name)
    assert again.returncode == 0, again.stderr
    ranges = [r for method, path, r in hub.requests if method == "GET" and path.startswith("/blobs/")]
    assert ranges[-1] == f"bytes={kept}-"
    assert Path(again.stdout.split("\t")[1].strip()).read_bytes() == data


def test_pull_after_the_download_before_the_hash(hub: HubState) -> None:
    data = os.urandom(2 * 1024 * 1024)
    hub.add("tester/tiny-GGUF", "done.gguf", data)
    res = interrupted("localrun.store.hub:sha256_of@1", "pull", "hf://tester/tiny-GGUF/done.gguf")
    assert_interrupted(res)
    root = Path(os.environ["HF_HOME"]) / "hub"
    assert [p for p in root.rglob("blobs/*") if not p.name.endswith(".incomplete")] == []
    again = cli_process("pull", "hf://tester/tiny-GGUF/done.gguf")
    assert again.returncode == 0, again.stderr
    assert Path(again.stdout.split("\t")[1].strip()).read_bytes() == data


# ------------------------------------------------------------------- serve --


def test_serve_during_its_load(tiny_model: Path) -> None:
    """While llama.cpp loads the model in the server's process (`--in-process`),
    or while the server waits for the model's runner to load it."""
    assert_interrupted(interrupted("log@3", "serve", "-m", str(tiny_model), "--port", "0", "--in-process"))
    assert_interrupted(
        interrupted("localrun.serve.runner:Runner._load@1", "serve", "-m", str(tiny_model), "--port", "0")
    )


@contextmanager
def serving(model: Path, grace: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`localrun serve` on 127.0.0.1, one slot; (the process, its URL) once it listens."""
    args = ("-m", str(model), "--port", "0", "--parallel", "1", "--ctx", "32768", "--grace", grace)
    proc = subprocess.Popen(
        [sys.executable, "-m", "localrun", "serve", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        url = ""
        for line in proc.stderr:
            if found := re.search(r"on (http://127\.0\.0\.1:\d+)/v1", line):
                url = found.group(1)
                break
        assert url, "the server did not start"
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def long_stream(url: str) -> IO[bytes]:
    """A streamed completion that would run for thousands of tokens, its first event read."""
    body = json.dumps({"model": "tiny-long", "prompt": "go", "max_tokens": 30000, "stream": True}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    response: IO[bytes] = urllib.request.urlopen(request, timeout=60)
    assert response.readline().startswith(b"data: ")
    return response


def read_until(stream: IO[str], text: str) -> str:
    seen = ""
    for line in stream:
        seen += line
        if text in line:
            break
    return seen


def test_serve_ctrl_c_with_a_request_in_flight_stops_cleanly(long_model: Path) -> None:
    with serving(long_model, "0.5") as (proc, url), long_stream(url) as stream:
        proc.send_signal(signal.SIGINT)
        rest = stream.read()  # the request goes on through the grace period, then ends with the reason
        assert b"the server is shutting down" in rest.splitlines()[-2]
        assert proc.wait(timeout=60) == 0
        assert proc.stderr is not None
        err = proc.stderr.read()
    assert "Traceback" not in err and "interrupted" not in err, err
    # its log line counts the tokens it streamed before the cut
    cut = re.search(
        r"POST /v1/completions 503 \S+: prompt [1-9]\d*, (\d+) tokens, [\d.]+s, the server is shutting", err
    )
    assert cut is not None and int(cut.group(1)) > 0, err


def test_serve_second_ctrl_c_ends_the_requests_at_once(long_model: Path) -> None:
    with serving(long_model, "600") as (proc, url), long_stream(url) as stream:
        assert proc.stderr is not None
        proc.send_signal(signal.SIGINT)
        seen = read_until(proc.stderr, "get up to 600s to finish")
        proc.send_signal(signal.SIGINT)  # not 600 s: now
        rest = stream.read()
        assert b"the server is shutting down" in rest.splitlines()[-2]  # an answer cut cleanly, not a dropped socket
        assert proc.wait(timeout=60) == 130
        seen += proc.stderr.read()
    assert "interrupted" in seen and "Traceback" not in seen and "ERROR" not in seen, seen
