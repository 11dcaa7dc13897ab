"""The command line as a whole: version, help, completion, lazy imports, the
error boundary and the flags that do not go together."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from localrun import __version__
from localrun.cli._env import Environment, use
from localrun.cli._errors import bounded
from tests.helpers import cli


def test_version() -> None:
    res = cli("--version")
    assert res.returncode == 0 and res.stdout == f"localrun {__version__}\n"


def test_completion_script_for_each_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    import typer._completion_shared

    # the shell named wins over the one detected from the process tree; with no name, the detected one
    markers = {"bash": "complete -o", "zsh": "compdef", "fish": "complete --command"}
    for shell, marker in markers.items():
        other = "fish" if shell != "fish" else "bash"
        monkeypatch.setattr(typer._completion_shared, "_get_shell_name", lambda other=other: other)
        res = cli("--show-completion", shell)
        assert res.returncode == 0, res.stderr
        assert "localrun" in res.stdout and "_LOCALRUN_COMPLETE" in res.stdout and marker in res.stdout, shell
        assert markers[other] not in res.stdout
        detected = cli("--show-completion")
        assert detected.returncode == 0 and markers[other] in detected.stdout, detected.stderr


@pytest.mark.parametrize("args", [["--help"], ["list"], ["generate", "--help"], ["chat", "--help"]])
def test_help_and_list_do_not_load_llama_cpp(args: list[str]) -> None:
    code = (
        "import sys\nfrom localrun.cli import main\n"
        f"status = main({args!r})\n"
        "print('LOADED' if 'llama_cpp' in sys.modules else 'NOT LOADED', status, file=sys.stderr)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert res.stderr.strip().splitlines()[-1] == "NOT LOADED 0", res.stderr[-2000:]


def run_bounded(exc: BaseException) -> tuple[int, str]:
    """What the error boundary makes of ``exc`` raised by a command."""
    import io

    err = io.StringIO()
    use(Environment(io.StringIO(), io.StringIO(), err))
    try:

        def command() -> None:
            raise exc

        bounded(command)()
    except typer.Exit as done:
        return done.exit_code, err.getvalue()
    finally:
        use(None)
    raise AssertionError("the boundary let the command end normally")


def test_os_and_value_errors_from_user_paths_are_one_line() -> None:
    code, err = run_bounded(FileNotFoundError(2, "No such file or directory", "/nowhere/x.json"))
    assert (
        code == 1
        and err == "error: /nowhere/x.json: No such file or directory\nhint: check the path and its permissions\n"
    )
    code, err = run_bounded(ValueError("not a size: 'lots'"))
    assert code == 2 and err == "error: not a size: 'lots'\n"


def test_debug_shows_the_traceback(tiny_model: Path, tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.gguf")
    plain = cli("generate", "-m", missing, "hi")
    debug = cli("--debug", "generate", "-m", missing, "hi")
    assert plain.returncode == debug.returncode == 3
    assert "Traceback" not in plain.stderr and "Traceback" in debug.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--spec", "lookup"], "does not decode speculatively"),
        (["--draft"], "does not decode speculatively"),
        (["--prompt-cache"], "does not use the prompt cache"),
        (["--json"], "always writes JSON lines"),
    ],
)
def test_batch_refuses_flags_it_cannot_honour(tiny_model: Path, tmp_path: Path, args: list[str], needle: str) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    res = cli("generate", "-m", str(tiny_model), "--batch", str(prompts), *args)
    assert res.returncode == 2 and needle in res.stderr and not res.stdout


def test_batch_flags_without_batch_are_refused(tiny_model: Path) -> None:
    res = cli("generate", "-m", str(tiny_model), "--parallel", "2", "hi")
    assert res.returncode == 2 and "apply to --batch only" in res.stderr


def test_paths_into_missing_folders_fail_before_the_work(tiny_model: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    resume = cli(
        "generate", "-m", str(tiny_model), "--batch", str(prompts), "--resume", str(tmp_path / "no" / "o.jsonl")
    )
    assert resume.returncode == 2 and "does not exist" in resume.stderr and not resume.stdout
    chart = cli("bench", "-m", str(tiny_model), "--quick", "--chart", str(tmp_path / "no" / "c.svg"))
    assert chart.returncode == 2 and "does not exist" in chart.stderr and "Traceback" not in chart.stderr


def test_draft_is_a_flag_and_does_not_take_the_prompt(tiny_model: Path) -> None:
    res = cli("generate", "-m", str(tiny_model), "-n", "4", "-t", "0", "--json", "--draft", "Say hi")
    assert res.returncode == 0, res.stderr
    assert "has no matched draft model" in res.stderr  # a model with none: prompt lookup, said once
    plain = cli("generate", "-m", str(tiny_model), "-n", "4", "-t", "0", "--json", "--spec", "none", "Say hi")
    assert (
        json.loads(res.stdout.splitlines()[-1])["prompt_tokens"]
        == json.loads(plain.stdout.splitlines()[-1])["prompt_tokens"]
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--spec", "sometimes"], "unknown --spec"),
        (["--draft", "--spec", "none"], "--draft speculates with a draft model"),
        (["--draft-model", "x.gguf", "--spec", "lookup"], "--draft-model names the one drafter"),
    ],
)
def test_speculation_options_that_do_not_go_together(tiny_model: Path, args: list[str], needle: str) -> None:
    res = cli("generate", "-m", str(tiny_model), *args, "hi")
    assert res.returncode == 2 and needle in res.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--top-p", "2"], "--top-p must be more than 0 and at most 1"),
        (["--top-p", "0"], "--top-p must be more than 0 and at most 1"),
        (["--temperature", "-1"], "--temperature must be 0 (greedy) or more"),
        (["--top-k", "-3"], "--top-k must be 0 (off) or more"),
        (["--min-p", "1.5"], "--min-p must be from 0 to 1"),
        (["--repeat-penalty", "0"], "--repeat-penalty must be more than 0"),
        (["--seed", "-1"], "--seed must be from 0 to 4294967295"),
        (["--stop", ""], "--stop '' matches nothing"),
        (["--parallel", "0", "--batch", "-"], "--parallel must be at least 1"),
        (["--ctx", "15"], "use --ctx 16 or more"),
    ],
)
def test_values_out_of_range_are_refused_before_a_model_loads(tmp_path: Path, args: list[str], needle: str) -> None:
    res = cli("generate", "-m", str(tmp_path / "absent.gguf"), *args, "hi")  # a missing model would be exit 3
    assert res.returncode == 2 and needle in res.stderr and "Traceback" not in res.stderr


def test_an_explicit_context_is_used_as_given(long_model: Path) -> None:
    res = cli("generate", "-m", str(long_model), "--ctx", "64", "-n", "500", "-t", "0", "--json", "hi")
    assert res.returncode == 0, res.stderr
    done = json.loads(res.stdout.splitlines()[-1])
    assert done["prompt_tokens"] + done["generated_tokens"] == 64 and done["stop_reason"] == "length"
    over = cli("generate", "-m", str(long_model), "--ctx", "16", "-n", "5", "a prompt longer than sixteen tokens " * 3)
    assert over.returncode == 5 and "the context holds 16" in over.stderr
    assert "--ctx" in over.stderr and "--kv" not in over.stderr


def test_help_shows_flags_without_a_type() -> None:
    res = cli("generate", "--help")
    assert res.returncode == 0 and "--draft" in res.stdout and "--top-p FLOAT" in res.stdout
    assert "BOOLEAN" not in res.stdout  # a flag takes no value


def test_tables_into_a_pipe_have_no_trailing_spaces() -> None:
    res = cli("list")
    assert res.returncode == 0 and "MODEL" in res.stdout
    assert all(line == line.rstrip() for line in res.stdout.splitlines())


def test_a_full_context_says_so(long_model: Path) -> None:
    full = cli("generate", "-m", str(long_model), "--ctx", "64", "-n", "500", "-t", "0", "hi")
    assert full.returncode == 0 and "the context of 64 tokens is full" in full.stderr
    limited = cli("generate", "-m", str(long_model), "--ctx", "64", "-n", "5", "-t", "0", "hi")
    assert limited.returncode == 0 and "is full" not in limited.stderr
