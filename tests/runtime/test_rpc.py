"""llama.cpp's RPC backend as a real second device: a `localrun rpc-server`
process on 127.0.0.1, started by the tests, and localrun processes that
offload to it with `--rpc`. A process that registers an RPC server keeps its
devices for life, so every client here is a process of its own."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from localrun.errors import RpcError, UsageError
from localrun.runtime import rpc
from tests.serve.conftest import start as start_serve
from tests.tinymodel import write_tiny_model

pytestmark = pytest.mark.timeout(180)  # a client that hangs on a lost server fails instead
RPC_FAILED = 12  # cli/_errors.py ExitCode.RPC_FAILED


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RpcServer:
    proc: subprocess.Popen[str]
    port: int

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"


def _start_server(*args: str) -> RpcServer:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "localrun", "rpc-server", "--port", str(port), "--threads", "1", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while True:  # it listens once llama.cpp's loop starts: greet it until it answers
        try:
            rpc.check(rpc.Endpoint("127.0.0.1", port), timeout=2)
            return RpcServer(proc, port)
        except RpcError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"the RPC server did not start: {proc.communicate()[1]}") from None
            time.sleep(0.2)


def _stop(server: RpcServer) -> None:
    if server.proc.poll() is None:
        server.proc.kill()
    server.proc.communicate(timeout=30)


@pytest.fixture(scope="module")
def server() -> Iterator[RpcServer]:
    started = _start_server()
    yield started
    _stop(started)


def localrun(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "localrun", *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        check=False,
    )


def done_event(stdout: str) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(stdout.splitlines()[-1])
    assert event["type"] == "done"
    return event


def json_text(stdout: str) -> str:
    return "".join(json.loads(line).get("text", "") for line in stdout.splitlines() if '"token"' in line)


def model_buffers(log: str) -> dict[str, float]:
    """MiB of weights per buffer type in llama.cpp's log, summed over every load."""
    found: dict[str, float] = {}
    for name, mib in re.findall(r"load_tensors:\s+(\S+) model buffer size =\s*([\d.]+) MiB", log):
        found[name] = found.get(name, 0.0) + float(mib)
    return found


def cpu_reference(model: Path, prompt: str, n: int) -> str:
    """Greedy text on this process's CPU with weights not repacked, as an RPC
    server's CPU backend keeps them: the kernels agree, so does the text."""
    from localrun.runtime.engine import Engine, EngineConfig
    from localrun.runtime.generate import generate
    from localrun.runtime.placement import ModelPlacement, Placement
    from localrun.runtime.prompt import build_prompt
    from localrun.runtime.sampling import SamplingParams
    from tests.helpers import collect

    placement = Placement(ModelPlacement(repack=False))
    with Engine(EngineConfig(model_path=model, n_ctx=256, n_threads=1, placement=placement)) as engine:
        built = build_prompt(engine, prompt, None, system=None)
        text, _ = collect(generate(engine, built.tokens, SamplingParams(temperature=0.0), max_tokens=n))
    return text


# -- what needs no server --


def test_servers_are_host_port_pairs() -> None:
    assert rpc.parse_servers("10.0.0.2:50052, box:7000") == (
        rpc.Endpoint("10.0.0.2", 50052),
        rpc.Endpoint("box", 7000),
    )
    for bad in ("box", "box:", ":50052", "box:port", "box:70000", "::1:50052"):
        with pytest.raises(UsageError, match="is not HOST:PORT"):
            rpc.parse_servers(bad)


def test_an_rpc_device_offloads_but_is_no_gpu_of_this_machine() -> None:
    from localrun.runtime.devices import Device, local_gpus, offload_targets, setup_hint, unused_gpu

    remote = Device("RPC0", "10.0.0.2:50052", "gpu", 8 * 2**30, 8 * 2**30)
    found = (Device("CPU", "", "cpu", 2**30, 2**30), remote)
    assert remote.remote and offload_targets(found) == (remote,) and local_gpus(found) == ()
    hint = setup_hint("nvidia", local_gpus(found))  # a CPU build on a machine with an NVIDIA GPU still hears of it
    assert hint is not None and "LOCALRUN_BACKEND=cuda" in hint
    assert unused_gpu(found) == unused_gpu(found[:1])


def test_a_server_that_is_not_there_is_a_clear_error_at_once(tiny_model: Path) -> None:
    port = free_port()  # nothing listens on it
    started = time.monotonic()
    done = localrun("generate", "-m", str(tiny_model), "--rpc", f"127.0.0.1:{port}", "-n", "4", "hi")
    assert done.returncode == RPC_FAILED
    assert f"error: cannot reach the RPC server at 127.0.0.1:{port}" in done.stderr
    assert f"localrun rpc-server --port {port}" in done.stderr and "Traceback" not in done.stderr
    assert time.monotonic() - started < 60


def test_a_silent_listener_times_out_instead_of_hanging() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)  # accepts the connection, never answers the greeting
        endpoint = rpc.Endpoint("127.0.0.1", listener.getsockname()[1])
        with pytest.raises(RpcError, match="did not answer within 1 s"):
            rpc.check(endpoint, timeout=1)


def test_another_kind_of_server_is_named_as_such() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        endpoint = rpc.Endpoint("127.0.0.1", listener.getsockname()[1])

        def answer_as_http() -> None:
            connection, _ = listener.accept()
            with connection:
                connection.recv(64)
                connection.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

        thread = threading.Thread(target=answer_as_http)
        thread.start()
        with pytest.raises(RpcError, match=r"does not answer as a llama\.cpp RPC server"):
            rpc.check(endpoint, timeout=5)
        thread.join(5)


def test_a_non_loopback_bind_is_refused_without_the_flag() -> None:
    done = localrun("rpc-server", "--host", "0.0.0.0", "--port", str(free_port()))
    assert done.returncode == 2
    assert "the RPC protocol has no authentication" in done.stderr and "--unauthenticated" in done.stderr
    assert rpc.check_bind("localhost", free_port(), unauthenticated=False) == "127.0.0.1"
    with pytest.raises(UsageError, match="not an IPv4 address"):
        rpc.check_bind("::1", free_port(), unauthenticated=False)


def test_a_port_in_use_is_refused_before_the_server_starts() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        done = localrun("rpc-server", "--port", str(taken.getsockname()[1]))
    assert done.returncode == 2 and "cannot listen on 127.0.0.1:" in done.stderr


def test_a_device_the_server_cannot_offer_is_refused_with_the_list() -> None:
    done = localrun("rpc-server", "--port", str(free_port()), "--device", "CUDA7")
    assert done.returncode == 2
    assert "no device 'CUDA7'" in done.stderr and "devices: CPU" in done.stderr


# -- one server for the module --


@pytest.fixture(scope="module")
def q4_model(models_dir: Path) -> Path:
    """Q4_0 weights, which the CPU backend repacks into its SIMD layouts
    (CPU_REPACK) unless told not to, and an RPC server's CPU backend does not."""
    from localrun.runtime.quantize import quantize

    source = write_tiny_model(models_dir / "tiny-rpc-f32.gguf", n_embd=256, n_ff=512)
    return quantize(source, models_dir / "tiny-rpc-q4_0.gguf", "q4_0", force=True).path


def test_every_layer_on_the_rpc_device_gives_the_cpu_text(q4_model: Path, server: RpcServer) -> None:
    done = localrun(
        "generate", "-m", str(q4_model), "--rpc", server.endpoint, "--gpu-layers", "all",
        "-t", "0", "-n", "32", "--json", "--verbose", "the cat",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    placement = done_event(done.stdout)["settings"]["placement"]
    assert placement["value"] == "RPC0, all 2 layers"
    assert "CPU_REPACK" not in model_buffers(done.stderr)
    assert json_text(done.stdout) == cpu_reference(q4_model, "the cat", 32) != ""


def test_show_and_doctor_list_the_rpc_device_with_its_memory(tiny_model: Path, server: RpcServer) -> None:
    from localrun.system import total_memory

    shown = localrun("show", str(tiny_model), "--json", env={"LOCALRUN_RPC": server.endpoint})
    assert shown.returncode == 0, shown.stderr
    placement = json.loads(shown.stdout)["placement"]
    assert placement["model"] == "RPC0, all 2 layers"
    rpc_device = next(d for d in placement["devices"] if d["name"] == "RPC0")
    assert rpc_device["description"] == server.endpoint and rpc_device["kind"] == "gpu"
    # the server's CPU device: this machine's memory, as the server reports it over the socket
    assert rpc_device["total"] == total_memory()
    doctor = localrun("doctor", "--json", "--rpc", server.endpoint)
    assert doctor.returncode == 0, doctor.stderr
    report = json.loads(doctor.stdout)
    listed = {d["name"]: d for d in report["devices"]}
    assert listed["RPC0"]["rpc"] is True and listed["RPC0"]["total_bytes"] == total_memory()
    assert listed["RPC0"]["free_bytes"] > 0 and listed["CPU"]["rpc"] is False
    assert report["gpu_build"] is False  # a device over TCP is no GPU of this machine's
    text = localrun("doctor", "--rpc", server.endpoint)
    assert "RPC0         rpc" in text.stdout and "slower than the CPU alone" in text.stdout


def test_a_layer_count_splits_the_model_between_cpu_and_rpc_device(tiny_model: Path, server: RpcServer) -> None:
    done = localrun(
        "generate", "-m", str(tiny_model), "--rpc", server.endpoint, "--gpu-layers", "1",
        "-t", "0", "-n", "16", "--json", "--verbose", "the dog",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done_event(done.stdout)["settings"]["placement"]["value"] == "RPC0, 1 of 2 layers (the rest on the CPU)"
    assert json_text(done.stdout)
    weights = model_buffers(done.stderr)
    on_rpc = weights[f"RPC0[{server.endpoint}]"]
    assert on_rpc > 0 and weights["CPU_Mapped"] > 0  # layers on both
    whole = localrun(
        "generate", "-m", str(tiny_model), "--rpc", server.endpoint, "--gpu-layers", "all",
        "-t", "0", "-n", "1", "--verbose", "x",
    )  # fmt: skip
    assert model_buffers(whole.stderr)[f"RPC0[{server.endpoint}]"] > on_rpc  # and more of them with all


def test_the_device_option_names_the_rpc_device(tiny_model: Path, server: RpcServer) -> None:
    done = localrun(
        "generate", "-m", str(tiny_model), "--rpc", server.endpoint, "--device", "rpc0",
        "--gpu-layers", "all", "-t", "0", "-n", "4", "--json", "x",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done_event(done.stdout)["settings"]["placement"]["value"] == "RPC0, all 2 layers"


def test_a_batch_offloads_to_the_rpc_device(tiny_model: Path, server: RpcServer, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the cat\nthe dog\na bird\n")
    done = localrun(
        "generate", "-m", str(tiny_model), "--rpc", server.endpoint, "--gpu-layers", "all",
        "--batch", str(prompts), "-t", "0", "-n", "12", "--verbose",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(results) == 3 and all(r["text"] for r in results)
    assert model_buffers(done.stderr)[f"RPC0[{server.endpoint}]"] > 0
    assert re.search(rf"RPC0\[{re.escape(server.endpoint)}\] KV buffer size = +[\d.]+ MiB", done.stderr)


def test_serve_offloads_two_models_to_the_rpc_device(
    tiny_model: Path, models_dir: Path, server: RpcServer, tmp_path: Path
) -> None:
    other = write_tiny_model(models_dir / "tiny-rpc-other.gguf", seed=5)
    args = ("-m", str(tiny_model), "-m", str(other), "--rpc", server.endpoint, "--gpu-layers", "all", "--verbose")
    for served in start_serve(tmp_path / "home", *args):
        for name in ("tiny", "tiny-rpc-other"):
            reply = served.client().completions.create(model=name, prompt="the cat", max_tokens=8, temperature=0)
            assert reply.choices[0].text
        loads = re.findall(rf"RPC0\[{re.escape(server.endpoint)}\] model buffer size = +([\d.]+) MiB", served.log)
        assert len(loads) == 2 and all(float(mib) > 0 for mib in loads)
        assert "offloaded 3/3 layers to GPU" in served.log
        assert served.stop() == 0


def test_a_draft_model_offloads_beside_its_target(tiny_model: Path, models_dir: Path, server: RpcServer) -> None:
    draft = write_tiny_model(models_dir / "tiny-rpc-draft.gguf", seed=3)
    done = localrun(
        "generate", "-m", str(tiny_model), "--draft-model", str(draft), "--rpc", server.endpoint,
        "--gpu-layers", "all", "-t", "0", "-n", "16", "--json", "--verbose", "the cat",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json_text(done.stdout)
    offloads = re.findall(r"offloaded (\d+)/(\d+) layers to GPU", done.stderr)
    assert len(offloads) == 2  # the target, then the draft
    assert all(n == total for n, total in offloads), offloads


# -- a server of its own: stopped, or killed under a run --


def test_ctrl_c_stops_the_server_cleanly() -> None:
    started = _start_server()
    started.proc.send_signal(signal.SIGINT)
    _, err = started.proc.communicate(timeout=30)
    assert started.proc.returncode == 0
    assert f"on {started.endpoint}" in err and "rpc-server stopped" in err and "Traceback" not in err
    with pytest.raises(RpcError, match="cannot reach"):
        rpc.check(rpc.Endpoint("127.0.0.1", started.port), timeout=2)


def test_a_server_killed_mid_run_is_a_clear_error_not_a_hang(long_model: Path) -> None:
    started = _start_server()
    try:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "localrun", "generate", "-m", str(long_model), "--rpc", started.endpoint,
                "--gpu-layers", "all", "--ctx", "32768", "-t", "0", "--json", "hello",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert proc.stdout is not None
        for _ in range(5):  # the model is on the server and generating
            assert '"token"' in proc.stdout.readline()
        started.proc.kill()
        _, err = proc.communicate(timeout=60)
    finally:
        _stop(started)
    assert proc.returncode == RPC_FAILED, err
    assert f"error: lost the RPC server ({started.endpoint}) mid-run" in err
    assert "hint: restart `localrun rpc-server`" in err


@pytest.mark.pty
def test_a_server_lost_under_a_chat_leaves_the_terminal_as_it_was(long_model: Path) -> None:
    """The chat's panel hides the cursor and its prompt stops the echo while
    a reply streams; the exit on a lost server runs no `finally`, so it
    puts both back itself."""
    import pexpect

    started = _start_server()
    try:
        child = pexpect.spawn(
            sys.executable,
            ["-m", "localrun", "chat", "-m", str(long_model), "--rpc", started.endpoint, "--gpu-layers", "all",
             "--ctx", "32768", "-t", "0"],
            env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "100", "LINES": "30"},
            encoding="utf-8",
            timeout=120,
            dimensions=(30, 100),
        )  # fmt: skip
        child.expect(">>> ")
        child.sendline("hello")
        child.expect("tok/s")  # the reply streams in its panel
        started.proc.kill()
        child.expect("error: lost the RPC server")
        shown = child.before
        child.expect(pexpect.EOF)
        assert child.getecho()  # the terminal echoes keys again
        child.close()
    finally:
        _stop(started)
    assert child.exitstatus == RPC_FAILED
    assert "\x1b[?25h" in shown  # the cursor is shown again
