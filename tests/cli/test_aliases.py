"""llama.cpp's and ollama's spellings: the common ones are taken (`-ngl` on a
CPU-only build runs on the CPU, `-c`, `-p`, `-f`, `run`); where one would
clash, or is spelled another way here, the error names localrun's."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pexpect
import pytest

from localrun.runtime import devices
from tests.helpers import cli

NO_GPU = not devices.offload_targets(devices.probe())


@pytest.mark.skipif(not NO_GPU, reason="a GPU takes the layers here")
@pytest.mark.parametrize("layers", ["99", "all"])
def test_gpu_layers_without_a_gpu_warn_and_run_on_the_cpu(tiny_model: Path, layers: str) -> None:
    res = cli("generate", "-m", str(tiny_model), "-ngl", layers, "-n", "2", "-t", "0", "--json", "hi")
    assert res.returncode == 0, res.stderr
    assert f"warning: --gpu-layers {layers}: this build or machine has no GPU" in res.stderr
    done = json.loads(res.stdout.splitlines()[-1])
    assert done["settings"]["placement"]["value"] == "CPU"
    bad = cli("generate", "-m", str(tiny_model), "-ngl", "most", "hi")  # not a count: still refused
    assert bad.returncode == 2 and "not a count" in bad.stderr


@pytest.mark.skipif(not NO_GPU, reason="a GPU takes the layers here")
def test_bench_with_gpu_layers_without_a_gpu_runs_on_the_cpu(tiny_model: Path) -> None:
    res = cli("bench", "--quick", "--rounds", "1", "-m", str(tiny_model), "-ngl", "99", "--json")
    assert res.returncode == 0, res.stderr
    assert "warning: --gpu-layers 99: this build or machine has no GPU" in res.stderr


def test_llama_cpp_short_options_in_generate(tiny_model: Path, tmp_path: Path) -> None:
    res = cli("generate", "-m", str(tiny_model), "-c", "256", "-n", "2", "-t", "0", "--json", "-p", "hello")
    assert res.returncode == 0, res.stderr
    done = json.loads(res.stdout.splitlines()[-1])
    assert done["settings"]["ctx"] == {"value": 256, "source": "option"}
    argument = cli("generate", "-m", str(tiny_model), "-c", "256", "-n", "2", "-t", "0", "--json", "hello")
    assert json.loads(argument.stdout.splitlines()[-1])["prompt_tokens"] == done["prompt_tokens"]

    prompt = tmp_path / "prompt.txt"
    prompt.write_text("hello")
    from_file = cli("generate", "-m", str(tiny_model), "-n", "2", "-t", "0", "--json", "-f", str(prompt))
    assert from_file.returncode == 0, from_file.stderr
    assert json.loads(from_file.stdout.splitlines()[-1])["prompt_tokens"] == done["prompt_tokens"]

    twice = cli("generate", "-m", str(tiny_model), "-p", "hello", "-f", str(prompt))
    assert twice.returncode == 2 and "-p and -f both give the prompt" in twice.stderr
    missing = cli("generate", "-m", str(tiny_model), "-f", str(tmp_path / "nope.txt"))
    assert missing.returncode == 2 and "nope.txt: no such file" in missing.stderr


def test_run_generates_with_a_prompt_and_chats_without(tiny_model: Path) -> None:
    """`localrun run MODEL PROMPT` as `ollama run`: the reply alone; without a
    prompt, text piped in is the prompt (ollama's way too)."""
    once = cli("run", str(tiny_model), "hello", "-n", "3", "-t", "0", "--json")
    assert once.returncode == 0, once.stderr
    events = [json.loads(line) for line in once.stdout.splitlines()]
    assert events[-1]["type"] == "done" and events[-1]["generated_tokens"] == 3
    same = cli("generate", "-m", str(tiny_model), "hello", "-n", "3", "-t", "0", "--json")
    assert json.loads(same.stdout.splitlines()[-1])["prompt_tokens"] == events[-1]["prompt_tokens"]
    piped = cli("run", str(tiny_model), "-n", "3", "-t", "0", input="hello")
    assert piped.returncode == 0 and piped.stdout, piped.stderr
    unknown = cli("run", str(tiny_model), "hi", "--bogus")
    assert unknown.returncode == 2 and "no such option --bogus" in unknown.stderr


@pytest.mark.pty
def test_run_without_a_prompt_at_a_terminal_is_chat(tiny_model: Path) -> None:
    child = pexpect.spawn(
        sys.executable,
        ["-m", "localrun", "run", str(tiny_model), "-n", "3"],
        env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "100", "LINES": "30"},
        encoding="utf-8",
        timeout=180,
        dimensions=(30, 100),
    )
    child.expect(">>> ")
    child.sendline("/bye")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["chat", "-c", "4096"], "hint: in chat, -c continues the last conversation; the context size is --ctx 4096"),
        (["chat", "-p", "hi"], "`localrun generate -p TEXT`"),
        (["chat", "-f", "notes.txt"], "`localrun chat < FILE`"),
        (["generate", "--n-gpu-layers", "3", "hi"], "hint: localrun spells --n-gpu-layers as --gpu-layers (-ngl)"),
        (["generate", "--ctx-size", "512", "hi"], "hint: localrun spells --ctx-size as --ctx"),
        (["serve", "-c", "4096"], "hint: localrun spells -c as --ctx"),
    ],
)
def test_a_spelling_taken_another_way_names_localruns(args: list[str], said: str) -> None:
    res = cli(*args)
    assert res.returncode == 2 and said in res.stderr, res.stderr
