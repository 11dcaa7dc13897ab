from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest

from localrun.events import Stats, TokenEvent
from localrun.runtime.chat import ChatSession, read_conversation
from localrun.runtime.decoder import Decoder
from localrun.runtime.engine import Engine
from localrun.runtime.generate import generate
from localrun.runtime.sampling import SamplingParams
from localrun.runtime.templates import BUILTIN_TEMPLATES
from tests.helpers import cli, collect, engine_config
from tests.tinymodel import CHATML, write_tiny_model

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture
def engine(tiny_model: Path) -> Iterator[Engine]:
    with Engine(engine_config(tiny_model, n_ctx=512, n_threads=2)) as eng:
        yield eng


def run_turn(session: ChatSession, text: str) -> tuple[str, Stats]:
    return collect(session.reply(session.plan(text)))


def test_later_turns_evaluate_only_their_new_tokens(engine: Engine) -> None:
    session = ChatSession(engine, CHATML, GREEDY, system="Be brief.", max_tokens=6)
    _, first = run_turn(session, "hello there")
    assert first.cached_tokens == 0
    for _ in range(5):
        _, stats = run_turn(session, "and again")
        # the ChatML text a turn adds after the previous reply, tokenized alone
        new_text = "<|im_end|>\n<|im_start|>user\nand again<|im_end|>\n<|im_start|>assistant\n"
        new = len(engine.tokenize(new_text, add_special=False))
        # plus the previous reply's last token, sampled but never evaluated (it stopped at --max-tokens)
        assert stats.prompt_tokens - stats.cached_tokens == new + 1
        assert stats.cached_tokens == stats.prompt_tokens - new - 1


def test_reused_cache_gives_the_same_reply_as_a_fresh_one(engine: Engine) -> None:
    session = ChatSession(engine, CHATML, GREEDY, max_tokens=8)
    run_turn(session, "first message")
    plan = session.plan("second message")
    reused = "".join(ev.text for ev in session.reply(plan) if isinstance(ev, TokenEvent))
    fresh_decoder = Decoder(engine)
    fresh = "".join(
        ev.text
        for ev in generate(engine, plan.tokens, GREEDY, max_tokens=8, decoder=fresh_decoder)
        if isinstance(ev, TokenEvent)
    )
    assert reused == fresh


def test_full_context_drops_oldest_turns_and_keeps_the_system_prompt(tiny_model: Path) -> None:
    with Engine(engine_config(tiny_model, n_ctx=256, n_threads=2)) as eng:
        session = ChatSession(eng, CHATML, GREEDY, system="SYSTEM-PROMPT", max_tokens=8)
        dropped = 0
        for i in range(12):
            plan = session.plan(f"message {i} " + "word " * 20)
            dropped += plan.dropped
            list(session.reply(plan))
            assert len(plan.tokens) < eng.n_ctx
        assert dropped > 0
        messages = session.messages()
        assert messages[0] == {"role": "system", "content": "SYSTEM-PROMPT"}
        assert "message 11" in messages[-2]["content"]
        assert not any("message 0 " in m["content"] for m in messages)


def test_save_and_load_round_trip(engine: Engine, tmp_path: Path) -> None:
    session = ChatSession(engine, CHATML, GREEDY, system="sys", max_tokens=5)
    run_turn(session, "one")
    run_turn(session, "two")
    path = tmp_path / "conv.json"
    session.save(path)
    system, turns, model = read_conversation(path)
    assert system == "sys"
    assert [(t.user, t.reply) for t in turns] == [(t.user, t.reply) for t in session.turns]
    assert json.loads(path.read_text())["messages"][0] == {"role": "user", "content": "one"}
    assert model == str(engine.config.model_path)  # what -m takes, not the GGUF's own name
    session.model = "qwen2.5-coder:0.5b"  # an alias given: saved as given
    session.save(path)
    assert read_conversation(path).model == "qwen2.5-coder:0.5b"
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "format": "localrun-chat/1", "model": "Qwen2.5 Coder 0.5B Instruct AWQ"}))
    assert read_conversation(path).model is None  # an old file's "model" was the GGUF's own name


def test_chat_load_goes_on_with_the_conversations_model(tiny_model: Path, wide_model: Path, tmp_path: Path) -> None:
    from tests.history.test_commands import logged

    saved = tmp_path / "c.json"
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    saved.write_text(json.dumps({"format": "localrun-chat/2", "model": str(wide_model), "messages": messages}))
    res = cli("chat", "-n", "2", "--json", "--load", str(saved), input="c\n")  # no -m: the conversation's model
    assert res.returncode == 0, res.stderr
    assert logged()[-1]["model_file"] == str(wide_model)
    res = cli("chat", "-m", str(tiny_model), "-n", "2", "--json", "--load", str(saved), input="c\n")
    assert res.returncode == 0, res.stderr
    assert logged()[-1]["model_file"] == str(tiny_model)  # -m wins
    saved.write_text(json.dumps({"format": "localrun-chat/2", "model": str(tmp_path / "gone.gguf"), "messages": []}))
    res = cli("chat", "--load", str(saved), input="c\n")
    assert res.returncode == 3 and "gone.gguf" in res.stderr and "conversation's model" in res.stderr


def test_piped_chat_answers_each_line(tiny_model: Path) -> None:
    res = cli("chat", "-m", str(tiny_model), "-n", "6", "-t", "0", "--json", input='first\n\n{"content": "second"}\n')
    assert res.returncode == 0, res.stderr
    events = [json.loads(line) for line in res.stdout.splitlines()]
    done = [e for e in events if e["type"] == "done"]
    assert [e["turn"] for e in done] == [1, 2]
    assert all(e["turn"] in (1, 2) for e in events)
    assert done[0]["cached_tokens"] == 0 and done[1]["cached_tokens"] > done[0]["prompt_tokens"]
    plain = cli("chat", "-m", str(tiny_model), "-n", "6", "-t", "0", input="first\nsecond\n")
    assert plain.returncode == 0, plain.stderr
    replies = ["".join(e["text"] for e in events if e["type"] == "token" and e["turn"] == n) for n in (1, 2)]
    assert plain.stdout == "\n".join(r + "\n" for r in replies)  # a blank line between replies


def test_piped_chat_bad_jsonl_line(tiny_model: Path) -> None:
    res = cli("chat", "-m", str(tiny_model), "-n", "4", "-t", "0", "--json", input='hello\n{"content": oops}\nlater\n')
    assert res.returncode == 2
    assert "line 2" in res.stderr and "not valid JSON" in res.stderr
    done = [json.loads(line) for line in res.stdout.splitlines() if '"done"' in line]
    assert len(done) == 1  # the turn before the bad line was answered
    res = cli("chat", "-m", str(tiny_model), input='{"role": "assistant", "content": "x"}\n')
    assert res.returncode == 2 and "line 1" in res.stderr and "not a user message" in res.stderr


def test_chat_load_continues_a_saved_conversation(tiny_model: Path, tmp_path: Path) -> None:
    saved = tmp_path / "c.json"
    saved.write_text(
        json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})
    )
    res = cli("chat", "-m", str(tiny_model), "-n", "4", "--json", "--load", str(saved), input="c\n")
    assert res.returncode == 0, res.stderr
    done = json.loads(res.stdout.splitlines()[-1])
    assert done["turn"] == 2
    bad = tmp_path / "bad.json"
    bad.write_text('{"messages": [{"role": "assistant", "content": "b"}]}')
    res = cli("chat", "-m", str(tiny_model), "--load", str(bad), input="c\n")
    assert res.returncode == 2 and "reply with no question" in res.stderr


@pytest.mark.pty
def test_model_without_template(models_dir: Path) -> None:
    plain = write_tiny_model(models_dir / "no-template.gguf", chat_template=None)
    res = cli("chat", "-m", str(plain), input="hi\n")
    assert res.returncode == 2
    assert "no chat template" in res.stderr and "--template" in res.stderr
    res = cli("chat", "-m", str(plain), "-n", "3", "--template", "chatml", input="hi\n")
    assert res.returncode == 0, res.stderr
    res = cli("chat", "-m", str(plain), "--template", "nope", input="hi\n")
    assert res.returncode == 2 and all(name in res.stderr for name in BUILTIN_TEMPLATES)


# ------------------------------------------------------------------ terminal --


def spawn_chat(*args: str) -> pexpect.spawn:
    return pexpect.spawn(
        sys.executable,
        ["-m", "localrun", "chat", *args],
        env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "100", "LINES": "30"},
        encoding="utf-8",
        timeout=180,  # generous: a loaded CI machine can take long to start Python and llama.cpp
        dimensions=(30, 100),
    )


@pytest.mark.pty
def test_interactive_session(tiny_model: Path, tmp_path: Path) -> None:
    saved = tmp_path / "saved.json"
    child = spawn_chat("-m", str(tiny_model), "-n", "12", "-t", "0")
    child.expect(">>> ")
    child.sendline("hello model")
    child.expect("stop: length")  # the reply's panel footer
    child.expect(">>> ")
    child.sendline('"""')
    child.expect(r"\.\.\. ")
    child.sendline("a message on")
    child.sendline('two lines"""')
    child.expect("12 tokens")
    child.expect(">>> ")
    child.sendline("/stats")
    child.expect("last turn: 12 tokens")
    child.expect("session: +2 turns")
    child.expect(">>> ")
    child.sendline("/bogus")
    child.expect("unknown command /bogus; /help lists")
    child.expect(">>> ")
    child.sendline("/retry")
    child.expect("stop: length")
    child.expect(">>> ")
    child.sendline("/draft off")
    child.expect("speculative decoding off")
    child.expect(">>> ")
    child.sendline(f"/save {saved}")
    child.expect("saved 2 turns")
    child.expect(">>> ")
    child.sendeof()
    child.expect("session: 3 turns")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    messages = json.loads(saved.read_text())["messages"]
    assert [m["content"] for m in messages if m["role"] == "user"] == ["hello model", "a message on\ntwo lines"]
    assert json.loads(saved.read_text())["model"] == str(tiny_model)  # what -m takes
    history = Path(os.environ["LOCALRUN_HOME"]) / "data" / "chat_history"
    assert "hello model" in history.read_text()

    child = spawn_chat("-m", str(tiny_model), "-n", "4", "--load", str(saved))
    child.expect("continuing a conversation of 2 turns")
    child.expect(">>> ")
    child.sendline("/exit")
    child.expect(pexpect.EOF)


@pytest.mark.pty
def test_a_paste_is_one_message(tiny_model: Path, tmp_path: Path) -> None:
    """The terminal is asked to mark pastes (bracketed paste mode); a paste of
    several lines is one turn and one reply, as typing it in a \"\"\" block."""
    saved = tmp_path / "saved.json"
    child = spawn_chat("-m", str(tiny_model), "-n", "4", "-t", "0")
    child.expect_exact("\x1b[?2004h")  # paste mode on while reading
    child.expect(">>> ")
    child.send("\x1b[200~Fix this code:\rdef add(a, b)\r    return a+b\r\x1b[201~")
    child.send("\r")
    child.expect("stop: length")
    child.expect(">>> ")
    save_one_turn_and_exit(child, saved)
    messages = json.loads(saved.read_text())["messages"]
    assert [m["content"] for m in messages if m["role"] == "user"] == ["Fix this code:\ndef add(a, b)\n    return a+b"]


def save_one_turn_and_exit(child: pexpect.spawn, saved: Path) -> None:
    """`/save` a session of one turn to ``saved``, then `/exit` and wait for the end."""
    child.sendline(f"/save {saved}")
    child.expect("saved 1 turn")
    child.expect(">>> ")
    child.sendline("/exit")
    child.expect("session: 1 turn, ")
    child.expect(pexpect.EOF)


@pytest.mark.pty
def test_ctrl_c_at_the_prompt_clears_the_line(tiny_model: Path, tmp_path: Path) -> None:
    saved = tmp_path / "saved.json"
    child = spawn_chat("-m", str(tiny_model), "-n", "4", "-t", "0")
    child.expect(">>> ")
    child.send("half typed")
    child.expect("half typed")  # echoed: readline holds it
    child.sendintr()
    child.expect("Ctrl-D or /exit ends the session")
    child.expect(">>> ")
    child.sendline("hello")
    child.expect("stop: length")
    child.expect(">>> ")
    child.send("more")
    child.expect("more")
    child.sendintr()  # again: the line goes, without the hint
    child.expect(">>> ")
    save_one_turn_and_exit(child, saved)
    assert "ends the session" not in child.before
    child.close()
    assert child.exitstatus == 0
    messages = json.loads(saved.read_text())["messages"]
    assert [m["content"] for m in messages if m["role"] == "user"] == ["hello"]


@pytest.mark.pty
def test_markdown_off_by_option_config_or_command(tiny_model: Path) -> None:
    def markdown_state(*args: str) -> str:
        child = spawn_chat("-m", str(tiny_model), *args)
        child.expect(">>> ")
        child.sendline("/markdown")
        child.expect(r"replies are shown (as Markdown|as the model wrote them)")
        state = child.match.group(1)
        child.expect(">>> ")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
        return str(state)

    assert markdown_state() == "as Markdown"
    assert markdown_state("--no-markdown") == "as the model wrote them"
    config = Path(os.environ["LOCALRUN_HOME"]) / "config" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("[defaults]\nmarkdown = false\n")
    assert markdown_state() == "as the model wrote them"
    assert markdown_state("--markdown") == "as Markdown"  # the option wins


def test_markdown_command_takes_on_or_off(engine: Engine, tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from localrun.cli.repl import Repl

    screen = io.StringIO()
    repl = Repl(ChatSession(engine, CHATML, GREEDY), Console(file=screen, width=200), history=tmp_path / "h")
    states = []
    for arg in ("off", "on"):
        assert repl._command(f"/markdown {arg}") is True
        states.append(repl.markdown)
    assert states == [False, True]
    assert "replies are shown as the model wrote them" in screen.getvalue()
    assert repl._command("/markdown raw") is True and "/markdown takes on or off, not 'raw'" in screen.getvalue()


@pytest.mark.pty
def test_ctrl_c_stops_the_reply_not_the_session(long_model: Path) -> None:
    child = spawn_chat("-m", str(long_model), "--ctx", "32768", "-n", "30000")
    child.expect(">>> ")
    child.sendline("go on forever")
    child.expect(r"\d{3,} tokens")  # the live footer: the reply is streaming
    child.sendintr()
    child.expect("reply interrupted")
    child.expect(">>> ")
    child.sendline("/stats")
    child.expect("stop: interrupted")
    child.expect(">>> ")
    child.sendintr()  # at the prompt: a new line, the session goes on
    child.expect("Ctrl-D or /exit ends the session")
    child.expect(">>> ")
    child.sendeof()
    child.expect("session: 1 turn, ")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_chat_speculation_is_lossless_across_turns(tiny_model: Path) -> None:
    turns = "repeat after me: the cat sat on the mat\nand once more: the cat sat on the mat\n"
    replies = {}
    for draft in ("none", "lookup"):
        res = cli("chat", "-m", str(tiny_model), "-n", "24", "-t", "0", "--json", "--spec", draft, input=turns)
        assert res.returncode == 0, res.stderr
        events = [json.loads(line) for line in res.stdout.splitlines()]
        replies[draft] = ["".join(e["text"] for e in events if e["type"] == "token" and e["turn"] == n) for n in (1, 2)]
        done = [e for e in events if e["type"] == "done"]
        assert ("draft" in done[-1]) == (draft == "lookup")
    assert replies["lookup"] == replies["none"]


def test_a_failed_save_keeps_the_session(engine: Engine, tmp_path: Path) -> None:
    """/save into a missing folder is one line on the screen; the conversation stays."""
    import io

    from rich.console import Console

    from localrun.cli.repl import Repl

    session = ChatSession(engine, CHATML, GREEDY, max_tokens=4)
    run_turn(session, "one")
    screen = io.StringIO()
    repl = Repl(session, Console(file=screen, width=200), history=tmp_path / "history")
    assert repl._command(f"/save {tmp_path / 'missing' / 'talk.json'}") is True  # the session goes on
    assert "error:" in screen.getvalue() and "No such file or directory" in screen.getvalue()
    assert [t.user for t in session.turns] == ["one"]
    assert repl._command(f"/save {tmp_path / 'talk.json'}") is True
    assert read_conversation(tmp_path / "talk.json")[1][0].user == "one"
    assert f"saved 1 turn to {tmp_path / 'talk.json'}" in screen.getvalue()  # not "1 turns"
    assert repl._command(f"/load {tmp_path / 'talk.json'}") is True
    assert f"loaded 1 turn from {tmp_path / 'talk.json'}" in screen.getvalue()


def test_piped_chat_says_which_turns_it_dropped(tiny_model: Path) -> None:
    turns = "".join(f"message {i} " + "word " * 20 + "\n" for i in range(8))
    res = cli("chat", "-m", str(tiny_model), "--ctx", "256", "-n", "8", "-t", "0", input=turns)
    assert res.returncode == 0, res.stderr
    assert "note: dropped the oldest turn to fit the context" in res.stderr
    assert "turn(s)" not in res.stderr


@pytest.mark.pty
def test_a_session_with_no_turns_ends_without_a_summary(tiny_model: Path) -> None:
    for end in ("/exit", "eof"):
        child = spawn_chat("-m", str(tiny_model))
        child.expect(">>> ")
        child.sendline("/help")
        child.expect(">>> ")
        if end == "eof":
            child.sendeof()
        else:
            child.sendline(end)
        child.expect(pexpect.EOF)
        assert "session:" not in child.before  # no summary of nothing
        child.close()
        assert child.exitstatus == 0


def test_draft_command_takes_on_or_off(engine: Engine, tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from localrun.cli.repl import Repl

    screen = io.StringIO()
    repl = Repl(ChatSession(engine, CHATML, GREEDY), Console(file=screen, width=200), history=tmp_path / "h")
    assert repl._command("/draft bogus") is True
    assert "/draft takes on or off, not 'bogus'" in screen.getvalue()
    assert repl._command("/draft on") is True and "no drafter was opened" in screen.getvalue()


def test_piped_jsonl_stops_at_a_line_that_is_not_json(tiny_model: Path) -> None:
    turns = '{"role":"user","content":"Hi"}\nnot json\n{"role":"user","content":"x"}\n'
    res = cli("chat", "-m", str(tiny_model), "-n", "4", "-t", "0", "--json", input=turns)
    assert res.returncode == 2 and "line 2" in res.stderr and "not valid JSON" in res.stderr
    done = [json.loads(line) for line in res.stdout.splitlines() if '"done"' in line]
    assert len(done) == 1  # the turn before it was answered, none after


def test_help_lists_every_command_aligned(engine: Engine, tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from localrun.cli.repl import Repl

    screen = io.StringIO()
    repl = Repl(ChatSession(engine, CHATML, GREEDY), Console(file=screen, width=200), history=tmp_path / "h")
    repl._command("/help")
    lines = screen.getvalue().splitlines()
    assert "/system [TEXT]" in screen.getvalue()
    starts = {re.match(r"  \S+(?: \S+)*\s{2,}", line).end() for line in lines}  # type: ignore[union-attr]
    assert len(starts) == 1, lines


def test_ollama_commands_and_quit_words(engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`/bye` and `/set` as ollama has them; a line of only `exit` or `quit` ends the session, unsent."""
    import builtins
    import io

    from rich.console import Console

    from localrun.cli.repl import Repl

    screen = io.StringIO()
    session = ChatSession(engine, CHATML, GREEDY)
    repl = Repl(session, Console(file=screen, width=200), history=tmp_path / "h")
    assert repl._command("/set parameter temperature 0.25") is True
    assert repl._command("/set parameter top_k 7") is True
    assert repl._command("/set parameter num_predict 5") is True
    assert (session.sampling.temperature, session.sampling.top_k, session.max_tokens) == (0.25, 7, 5)
    assert repl._command("/set system be brief") is True and session.system == "be brief"
    repl._command("/set parameter num_ctx 8192")
    assert "num_ctx is fixed once the model is loaded" in screen.getvalue() and "--ctx" in screen.getvalue()
    repl._command("/set parameter top_p 3")
    assert "--top-p must be" in screen.getvalue() and session.sampling.top_p == 0.95
    assert repl._command("/bye") is False

    for word in ("exit", "  Quit "):
        lines = iter([word, "never read"])
        monkeypatch.setattr(builtins, "input", lambda _prompt, lines=lines: next(lines))
        assert repl.run() == 0
        assert next(lines) == "never read" and session.turns == []  # nothing went to the model
    lines = iter(['"""', "exit", '"""'])  # in a block it is a message like any other
    monkeypatch.setattr(builtins, "input", lambda _prompt: next(lines))
    assert repl.read_message() == "exit"
