from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from localrun.events import DraftStats
from localrun.gguf.info import describe
from localrun.gguf.reader import read_gguf
from localrun.ui.stream import footer
from tests.helpers import Result, cli, on_terminal

ANSI = "\x1b"


def test_pipe_output_is_plain_text(tiny_model: Path) -> None:
    res = cli("generate", "-m", str(tiny_model), "--max-tokens", "20", "--temperature", "0", "hello")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip()
    assert ANSI not in res.stdout
    assert res.stderr == ""  # llama.cpp's log stays hidden


def test_stats_line_on_stderr(tiny_model: Path) -> None:
    res = cli("generate", "-m", str(tiny_model), "-n", "8", "--temperature", "0", "--stats", "hi")
    assert res.returncode == 0, res.stderr
    assert "8 tokens" in res.stderr and "tok/s" in res.stderr and "stop: length" in res.stderr
    assert ANSI not in res.stdout + res.stderr


def test_json_event_contract(tiny_model: Path) -> None:
    res = cli("generate", "-m", str(tiny_model), "-n", "10", "--json", "--temperature", "0", "hello")
    assert res.returncode == 0, res.stderr
    events = [json.loads(line) for line in res.stdout.splitlines()]
    assert events[-1]["type"] == "done"
    assert all(e == {"type": "token", "text": e["text"]} for e in events[:-1])
    done = events[-1]
    assert set(done) == {
        "type",
        "prompt_tokens",
        "generated_tokens",
        "ttft_s",
        "decode_tokens_per_s",
        "elapsed_s",
        "stop_reason",
        "cached_tokens",
        "draft",  # speculative decoding (--spec auto, the default): drafter, proposed, accepted
        "threads",  # CPU threads decoding when the run ended
        "thread_shares",  # the share of decode steps at each thread count
        "settings",  # every setting used, and where it came from
    }
    assert set(done["draft"]) == {"drafter", "proposed", "accepted"}
    names = {"ctx", "type_k", "type_v", "flash_attn", "threads", "draft", "parallel", "n_ubatch", "sample_on"}
    assert set(done["settings"]) == names | {"placement", "memory_budget", "wait", "chat_template"}
    wait = done["settings"]["wait"]  # how llama.cpp's idle threads wait: this process's policy, and why
    assert wait["value"].split()[0] in ("spin", "sleep-soon", "user") and wait["why"]
    assert done["settings"]["placement"]["value"] == "CPU" and done["settings"]["placement"]["why"]
    assert done["settings"]["memory_budget"]["value"] > 0
    assert done["settings"]["sample_on"]["value"] == "host" and done["settings"]["sample_on"]["why"]
    assert all(
        s["source"] in ("option", "model", "config", "wisdom", "default", "env") for s in done["settings"].values()
    )
    assert done["settings"]["draft"] == {"value": "auto", "source": "default"}
    assert done["cached_tokens"] == 0 and done["threads"] >= 1
    assert done["generated_tokens"] == 10 and done["stop_reason"] == "length" and done["prompt_tokens"] > 0
    plain = cli("generate", "-m", str(tiny_model), "-n", "10", "--temperature", "0", "hello")
    assert "".join(e["text"] for e in events[:-1]) == plain.stdout.rstrip("\n")


def test_json_stop_reasons(tiny_model: Path, eos_model: Path) -> None:
    def done(*args: str) -> dict[str, object]:
        res = cli("generate", "--json", "--temperature", "0", *args)
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout.splitlines()[-1])  # type: ignore[no-any-return]

    assert done("-m", str(eos_model), "x")["stop_reason"] == "eos"
    full = cli("generate", "-m", str(tiny_model), "-n", "30", "--temperature", "0", "x").stdout
    assert done("-m", str(tiny_model), "-n", "30", "--stop", full[8:11], "x")["stop_reason"] == "stop"


def test_seed_makes_sampling_repeatable(tiny_model: Path) -> None:
    args = ("generate", "-m", str(tiny_model), "-n", "16", "--temperature", "1.2", "--seed", "42", "x")
    assert cli(*args).stdout == cli(*args).stdout


def test_stdin_prompt_and_instruction(tiny_model: Path) -> None:
    base = ("generate", "-m", str(tiny_model), "-n", "12", "--temperature", "0", "--json")

    def prompt_tokens(res: Result) -> int:
        assert res.returncode == 0, res.stderr
        return int(json.loads(res.stdout.splitlines()[-1])["prompt_tokens"])

    from_dash = prompt_tokens(cli(*base, "-", input="some material"))
    from_pipe = prompt_tokens(cli(*base, input="some material"))
    with_instruction = prompt_tokens(cli(*base, "summarize", input="some material"))
    assert from_dash == from_pipe
    assert with_instruction > from_pipe


@pytest.mark.parametrize(
    ("make", "code", "needle"),
    [
        (lambda d: d / "missing.gguf", 3, "not found"),
        (lambda d: d, 4, "directory"),
        (lambda d: _write(d / "text.gguf", b"just some text, definitely not a model"), 4, "not a GGUF"),
    ],
)
def test_bad_model_paths(tmp_path: Path, make, code: int, needle: str) -> None:  # type: ignore[no-untyped-def]
    res = cli("generate", "-m", str(make(tmp_path)), "hello")
    assert res.returncode == code
    assert needle in res.stderr and "hint:" in res.stderr
    assert "Traceback" not in res.stderr and res.stdout == ""


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_truncated_model(tiny_model: Path, tmp_path: Path) -> None:
    data = tiny_model.read_bytes()
    res = cli("generate", "-m", str(_write(tmp_path / "cut.gguf", data[: len(data) // 2])), "hello")
    assert res.returncode == 4 and "truncated" in res.stderr and "Traceback" not in res.stderr


def test_empty_prompt_and_no_model(tiny_model: Path) -> None:
    res = cli("generate", "-m", str(tiny_model), "   ")
    assert res.returncode == 2 and "prompt is empty" in res.stderr
    res = cli("generate", "--offline", "hello")  # the default model is not downloaded here
    assert res.returncode == 3 and "not downloaded" in res.stderr  # README: 3, model not found


def test_prompt_longer_than_context(tiny_model: Path) -> None:
    res = cli("generate", "-m", str(tiny_model), "--ctx", "64", "word " * 60)
    assert res.returncode == 5
    assert "the context holds 64" in res.stderr  # the size given, though llama.cpp pads its cells to 256
    assert "--ctx" in res.stderr and "--kv" not in res.stderr and "Traceback" not in res.stderr
    beyond = cli("generate", "-m", str(tiny_model), "word " * 200)
    assert beyond.returncode == 5 and "trained on 512 tokens" in beyond.stderr


def test_bad_option_is_usage_error(tiny_model: Path) -> None:
    assert cli("generate", "-m", str(tiny_model), "--max-tokens", "0", "x").returncode == 2
    assert cli("generate", "--no-such-option").returncode == 2


def start_long_generation(model: Path) -> subprocess.Popen[bytes]:
    """A greedy generation that runs for seconds (the model never emits end-of-text)."""
    return subprocess.Popen(
        [sys.executable, "-m", "localrun", "generate", "-m", str(model), "--ctx", "32768", "-t", "0", "hello"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_ctrl_c_keeps_text_and_exits_130(long_model: Path) -> None:
    proc = start_long_generation(long_model)
    assert proc.stdout is not None
    first = proc.stdout.read(8)  # generation has started
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert len(first + rest) > 8
    assert b"stop: interrupted" in err and b"Traceback" not in err


@pytest.mark.pty
def test_terminal_shows_live_panel(tiny_model: Path) -> None:
    status, screen = on_terminal("generate", "-m", str(tiny_model), "-n", "40", "hello")
    assert status == 0
    quant = describe(read_gguf(tiny_model)).quantization
    assert f"tiny.gguf ({quant})" in screen and "tiny-test-llama" not in screen  # the name given, not general.name
    assert "40 tokens" in screen and "tok/s" in screen and "stop: length" in screen
    assert "╭" in screen  # the panel's border


def test_footer_keeps_the_stop_reason_when_narrow() -> None:
    draft = DraftStats("qwen2.5-coder-0.5b-instruct-q4_k_m", proposed=40, accepted=30, rounds=12)
    wide = footer(40, 11.5, 0.8, 4.2, "length", draft, width=200).plain
    assert "stop: length" in wide and "75% accepted, 2.5/step" in wide
    medium = footer(40, 11.5, 0.8, 4.2, "length", draft, width=110).plain
    assert len(medium) <= 110 and "stop: length" in medium and "q4_k_m 75%" in medium and "/step" not in medium
    narrow = footer(40, 11.5, 0.8, 4.2, "length", draft, width=70).plain
    assert narrow == "40 tokens  ·  11.5 tok/s  ·  ttft 0.80s  ·  4.2s  ·  stop: length"


def test_closed_pipe_ends_quietly(long_model: Path) -> None:
    proc = start_long_generation(long_model)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(5)
    proc.stdout.close()  # like `| head -c 5`
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=60) == 0
    assert b"Traceback" not in err and b"Error" not in err


def test_summaries_read_as_sentences() -> None:
    from localrun.bench.stats import Row
    from localrun.events import DraftStats
    from localrun.runtime.chat import SessionTotals
    from localrun.ui.bench import _note
    from localrun.ui.text import draft_line, session_line

    assert draft_line(DraftStats("lookup", proposed=1, accepted=0, rounds=1)) == (
        "draft lookup: 0% of 1 drafted token kept, 0.0 per step"
    )
    assert session_line(SessionTotals(turns=1)).startswith("1 turn, ")
    too_short = SessionTotals(turns=1, generated_tokens=2, evaluated_tokens=9)  # no decode long enough to time
    assert session_line(too_short) == "1 turn, 2 tokens generated, prompt tokens evaluated 9, reused from the cache 0"
    timed = SessionTotals(turns=2, generated_tokens=12, decode_seconds=2.0)
    assert session_line(timed).startswith("2 turns, 12 tokens generated at 5.0 tok/s, prompt tokens evaluated 0")
    row = Row("speculative auto", note="lookup", extra={"acceptance": 1.0, "mean_accepted": 2.0})
    assert _note(row) == "lookup, 100% of drafted tokens kept, 2.0 per step"


def test_footer_drops_whole_fields_when_narrow() -> None:
    draft = DraftStats("lookup", proposed=40, accepted=30, rounds=12)
    for width in (60, 45, 30):
        line = footer(120, 11.5, 0.8, 4.2, "length", draft, width=width).plain
        assert len(line) <= width and line.startswith("120 tokens") and line.endswith("stop: length"), line
        wide = footer(120, 11.5, 0.8, 4.2, "length", draft).plain.split("  ·  ")
        assert set(line.split("  ·  ")) <= {*wide, "lookup 75%"}  # whole fields only, none cut mid-word
    assert footer(120, 11.5, 0.8, 4.2, "length", draft, width=30).plain == "120 tokens  ·  stop: length"


def test_live_panel_stays_within_the_screen() -> None:
    """Wrapped words and wide characters count as the rows Rich gives them, so
    the streaming panel never grows taller than the terminal."""
    import io

    from rich.console import Console

    from localrun.ui.stream import LiveRenderer

    console = Console(file=io.StringIO(), width=40, height=12, force_terminal=True)
    renderer = LiveRenderer(console, title="t")
    for text in ("漢字" * 100, "ab " * 130, "x\n" + "漢字" * 100 + "\nend"):
        renderer._chunks = [text]
        rows = console.render_lines(renderer._panel(), console.options)
        assert len(rows) <= console.height, text[:20]
        assert text.rstrip()[-2:] in "".join(seg.text for row in rows for seg in row)  # the end is what shows


def test_live_panel_leaves_the_text_on_screen_when_interrupted() -> None:
    """The live panel is transient; a second Ctrl-C mid-stream must not take
    the text shown so far off the screen with it."""
    import io

    from rich.console import Console

    from localrun.events import Event, TokenEvent
    from localrun.ui.stream import LiveRenderer

    def events() -> Iterator[Event]:
        for i, word in enumerate(("kept ", "on ", "screen")):
            yield TokenEvent(word, i + 1, 0.1, 0.1 * (i + 1), 10.0)
        raise KeyboardInterrupt

    screen = io.StringIO()
    console = Console(file=screen, width=60, height=20, force_terminal=True)
    with pytest.raises(KeyboardInterrupt):
        LiveRenderer(console, title="t").render(events())
    last = screen.getvalue().rsplit("\x1b[2K", 1)[-1]  # after the live region was erased
    assert "kept on screen" in last
