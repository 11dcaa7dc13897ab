"""The tool loop on a tiny random model with a real chat template (Qwen3's:
Hermes-style calls) and the real facts server: the grammar makes every call
name a declared tool with arguments that follow its schema; the model is
steered (a bias on `<tool_call>`) so that it calls. What runs is read from
the server's own log of its calls."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localrun.events import DoneEvent, TokenEvent, ToolCallEvent, ToolResultEvent, ToolStepDone
from localrun.mcp.host import ToolHost
from localrun.mcp.loop import Answer, Approval, ToolLoop, merged
from localrun.runtime.chat import ChatSession, read_conversation
from localrun.runtime.engine import Engine
from localrun.runtime.sampling import SamplingParams
from localrun.structured.spec import json_problem
from tests.helpers import engine_config
from tests.mcp.conftest import FACTS, python_server
from tests.synthmodels import BY_NAME, write_family_model


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    path = write_family_model(BY_NAME["qwen3"], tmp_path_factory.mktemp("qwen3") / "qwen3.gguf")
    with Engine(engine_config(path, n_ctx=4096, n_threads=2)) as engine:
        yield engine


@pytest.fixture
def calls(tmp_path: Path) -> Path:
    return tmp_path / "calls.log"


def host(calls: Path, pidfile: Path, tools: str = "add") -> ToolHost:
    env = {"LOCALRUN_TEST_CALLS": str(calls), "LOCALRUN_TEST_PIDFILE": str(pidfile), "LOCALRUN_TEST_TOOLS": tools}
    return ToolHost([python_server("facts", FACTS, env=env)])


def session(engine: Engine, *, seed: int = 1) -> ChatSession:
    """A chat whose model writes `<tool_call>` wherever it may (the grammar decides the rest)."""
    (marker,) = engine.tokenize("<tool_call>", add_special=False, parse_special=True)
    sampling = SamplingParams(temperature=1.0, seed=seed, logit_bias=((marker, 30.0),))
    assert engine.info.chat_template is not None
    return ChatSession(engine, engine.info.chat_template, sampling, max_tokens=160, switches={"enable_thinking": False})


def ran(calls: Path) -> list[str]:
    return calls.read_text().splitlines() if calls.exists() else []


def test_a_call_runs_and_its_result_goes_back_to_the_model(engine: Engine, calls: Path, pidfile: Path) -> None:
    chat = session(engine)
    with host(calls, pidfile) as tools:
        tools.start()
        loop = ToolLoop(chat, tools, Approval({"facts_add"}), max_steps=1, parallel=False)
        events = list(loop.turn(loop.plan("What is Bob's badge number?")))
    steps = [e for e in events if isinstance(e, ToolStepDone)]
    (call,) = [e for e in events if isinstance(e, ToolCallEvent)]
    (result,) = [e for e in events if isinstance(e, ToolResultEvent)]
    assert len(steps) == 1 and isinstance(events[-1], DoneEvent)
    assert sum(isinstance(e, DoneEvent) for e in events) == 1  # one reply, its figures over both steps
    assert call.name == "facts_add"
    schema = tools.tool("facts_add")
    assert schema is not None and json_problem(schema.parameters, json.dumps(call.arguments)) is None
    assert result.status == "ok" and result.id == call.id
    a, b = call.arguments["a"], call.arguments["b"]
    assert ran(calls) == [f"add {{'a': {a}, 'b': {b}}}"]
    assert result.text == str(a + b)
    assert not any("<tool_call>" in e.text for e in events[: events.index(steps[0])] if isinstance(e, TokenEvent))
    turn = chat.turns[-1]
    assert [m["role"] for m in turn.steps] == ["assistant", "tool"]
    assert turn.steps[1] == {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": result.text}
    # the last step's prompt holds the result (with its call), and (the step limit reached) offers no tool
    assert f"<tool_response>\n{call.name}(a={a}, b={b}) returned: {result.text}\n</tool_response>" in chat._pending_text
    assert "<tools>" not in chat._pending_text
    assert loop.problems == [] and loop.calls == 1  # every call written was read and checked
    final = events[-1]
    assert isinstance(final, DoneEvent) and final.stats.generated_tokens > steps[0].stats.generated_tokens
    assert chat.totals.turns == 1


def test_in_a_pipe_no_tool_runs_unless_allowed(engine: Engine, calls: Path, pidfile: Path) -> None:
    chat = session(engine)
    with host(calls, pidfile) as tools:
        tools.start()
        loop = ToolLoop(chat, tools, Approval(set(), ask=None), max_steps=1, parallel=False)
        events = list(loop.turn(loop.plan("What is Bob's badge number?")))
    (result,) = [e for e in events if isinstance(e, ToolResultEvent)]
    assert result.status == "refused" and result.text == "the user did not allow facts_add to run"
    assert ran(calls) == []
    assert "the user did not allow facts_add to run" in chat._pending_text


def test_asked_always_runs_that_tool_for_the_rest_of_the_session(engine: Engine, calls: Path, pidfile: Path) -> None:
    asked: list[tuple[str, dict[str, Any]]] = []

    def ask(tool: Any, arguments: dict[str, Any]) -> Any:
        asked.append((tool.name, arguments))
        return "always"

    chat = session(engine)
    with host(calls, pidfile) as tools:
        tools.start()
        loop = ToolLoop(chat, tools, Approval(set(), ask=ask), max_steps=1, parallel=False)
        for question in ("Bob's badge?", "And Alice's?"):
            list(loop.turn(loop.plan(question)))
    assert len(asked) == 1 and asked[0][0] == "facts_add"
    assert len(ran(calls)) == 2
    first, second = chat.turns  # both turns keep their calls and results in the conversation
    assert len(first.steps) == 2 and len(second.steps) == 2
    assert first.steps[1]["content"] in chat._pending_text and second.steps[1]["content"] in chat._pending_text


def test_save_and_load_keep_the_calls_and_results(engine: Engine, calls: Path, pidfile: Path, tmp_path: Path) -> None:
    chat = session(engine)
    with host(calls, pidfile) as tools:
        tools.start()
        loop = ToolLoop(chat, tools, Approval({"all"}), max_steps=1, parallel=False)
        list(loop.turn(loop.plan("Add 2 and 40.")))
    chat.save(tmp_path / "chat.json")
    (turn,) = read_conversation(tmp_path / "chat.json").turns
    assert turn.steps == chat.turns[0].steps and turn.reply == chat.turns[0].reply
    assert [m["role"] for m in turn.steps] == ["assistant", "tool"]


def test_asked_no_the_call_is_refused_and_asked_again_next_time(engine: Engine, calls: Path, pidfile: Path) -> None:
    answers: Iterator[Answer] = iter(["no", "yes"])
    chat = session(engine)
    with host(calls, pidfile) as tools:
        tools.start()
        loop = ToolLoop(chat, tools, Approval(set(), ask=lambda tool, args: next(answers)), max_steps=1, parallel=False)
        first = [e for e in loop.turn(loop.plan("Bob?")) if isinstance(e, ToolResultEvent)]
        second = [e for e in loop.turn(loop.plan("Carol?")) if isinstance(e, ToolResultEvent)]
    assert [r.status for r in first + second] == ["refused", "ok"]
    assert len(ran(calls)) == 1


def test_the_same_call_again_is_not_run_the_model_answers_without_tools(
    engine: Engine, calls: Path, pidfile: Path
) -> None:
    """A tool with no arguments: the second step's call is the first's, so that step is made again with no tool."""
    chat = session(engine)
    with host(calls, pidfile, tools="today") as tools:
        tools.start()
        loop = ToolLoop(chat, tools, Approval({"all"}), max_steps=4, parallel=False)
        events = list(loop.turn(loop.plan("What day is it?")))
    assert [e.name for e in events if isinstance(e, ToolCallEvent)] == ["facts_today"]
    assert ran(calls) == ["today {}"]
    assert "<tools>" not in chat._pending_text and "Tuesday 3 March" in chat._pending_text


def test_a_failing_tool_and_a_timeout_go_back_as_the_tools_result(engine: Engine, calls: Path, pidfile: Path) -> None:
    chat = session(engine)
    with host(calls, pidfile, tools="slow") as tools:
        tools.start()
        loop = ToolLoop(chat, tools, Approval({"all"}), max_steps=1, parallel=False, timeout=0.5)
        events = list(loop.turn(loop.plan("Wait a bit.")))
    (result,) = [e for e in events if isinstance(e, ToolResultEvent)]
    assert result.status == "timeout" and "did not answer within 0.5 s" in result.text
    assert result.text in chat._pending_text


def test_merged_figures_sum_the_steps() -> None:
    from localrun.events import Stats

    a = Stats(100, 10, 0.5, 20.0, 1.0, "eos")
    b = Stats(150, 21, 0.2, 10.0, 2.5, "eos", cached_tokens=100)
    both = merged([a, b])
    assert (both.generated_tokens, both.prompt_tokens, both.ttft_s, both.elapsed_s) == (31, 150, 0.5, 3.5)
    assert both.decode_tokens_per_s == pytest.approx(29 / (9 / 20 + 20 / 10))


def test_tools_need_a_chat_template_that_offers_them(engine: Engine, calls: Path, pidfile: Path) -> None:
    chat = session(engine)
    with host(calls, pidfile) as tools:
        tools.start()
        loop = ToolLoop(chat, tools, Approval(), parallel=False)
        loop.plan("hello")
    assert "facts_add" in chat._pending_text and "<tools>" in chat._pending_text


def test_a_step_ends_at_a_call_written_twice_or_any_call_where_none_is_offered() -> None:
    from localrun.mcp.loop import MAX_CALLS, _runaway

    written: list[tuple[str, str]] = []
    assert not _runaway(written, [("a", "{}")], offering=True)
    assert not _runaway(written, [("b", "{}")], offering=True)
    assert _runaway(written, [("a", "{}")], offering=True)  # the same call again: a small model's loop
    assert _runaway([], [("a", "{}")], offering=False)  # no tool offered: a call is no answer
    many = [(f"t{i}", "{}") for i in range(MAX_CALLS)]
    assert _runaway([], many, offering=True)


def plain_session(engine: Engine) -> ChatSession:
    """A chat whose model is not steered: left to choose (auto), the tiny random model never calls."""
    assert engine.info.chat_template is not None
    sampling = SamplingParams(temperature=0.0)
    return ChatSession(engine, engine.info.chat_template, sampling, max_tokens=80, switches={"enable_thinking": False})


def test_required_makes_a_call_then_the_model_may_answer(engine: Engine, calls: Path, pidfile: Path) -> None:
    """Three turns, the first and the last asked to call: both results stay in the conversation."""
    chat = plain_session(engine)
    with host(calls, pidfile) as tools:
        tools.start()
        loop = ToolLoop(chat, tools, Approval({"all"}), parallel=False)
        first = list(loop.turn(loop.plan("Add 2 and 40.", choice="required")))
        auto = list(loop.turn(loop.plan("Thanks.")))  # the session's choice (auto) is back
        third = list(loop.turn(loop.plan("Add 5 and 6.", choice="required")))
        loop.plan("Bye.")
    assert not any(isinstance(e, ToolCallEvent) for e in auto)
    results = []
    for turn, events in zip((chat.turns[0], chat.turns[2]), (first, third), strict=True):
        (call,) = [e for e in events if isinstance(e, ToolCallEvent)]
        (result,) = [e for e in events if isinstance(e, ToolResultEvent)]
        assert call.name == "facts_add" and result.status == "ok"
        assert isinstance(events[-1], DoneEvent) and turn.reply  # answered after the result
        assert [m["role"] for m in turn.steps] == ["assistant", "tool"]
        results.append(f"returned: {result.text}\n</tool_response>")
    assert len(ran(calls)) == 2
    assert all(said in chat._pending_text for said in results)  # the next turn's prompt holds both


def test_a_tools_name_as_the_choice_calls_that_tool(engine: Engine, calls: Path, pidfile: Path) -> None:
    chat = plain_session(engine)
    with host(calls, pidfile, tools="add,today") as tools:
        tools.start()
        loop = ToolLoop(chat, tools, Approval({"all"}), parallel=False, choice="facts_today")
        events = list(loop.turn(loop.plan("Hello.")))
    assert [e.name for e in events if isinstance(e, ToolCallEvent)] == ["facts_today"]
    assert ran(calls) == ["today {}"]


def test_none_offers_no_tool_even_to_a_model_that_would_call(
    engine: Engine, calls: Path, pidfile: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chat = session(engine)  # steered to call wherever it may
    constraints: list[object] = []  # each step's
    reply = chat.reply

    def recorded(plan: Any, grammar: Any = None) -> Any:
        constraints.append(grammar)
        return reply(plan, grammar)

    monkeypatch.setattr(chat, "reply", recorded)
    with host(calls, pidfile) as tools:
        tools.start()
        loop = ToolLoop(chat, tools, Approval({"all"}), parallel=False, choice="none")
        events = list(loop.turn(loop.plan("Add 2 and 40.")))
        assert "<tools>" not in chat._pending_text
        loop.choice = "auto"
        loop.offer()
        loop.plan("Add 2 and 40.")
        assert "<tools>" in chat._pending_text
    assert not any(isinstance(e, ToolCallEvent) for e in events) and ran(calls) == []
    assert constraints == [None]  # the reply as the model writes it: not the forced answer after calls


def test_a_choice_that_names_no_tool_is_a_usage_error(engine: Engine, calls: Path, pidfile: Path) -> None:
    from localrun.errors import UsageError

    chat = plain_session(engine)
    with host(calls, pidfile) as tools:
        tools.start()
        with pytest.raises(UsageError, match="--tool-choice: 'facts_sub' is not auto, required, none"):
            ToolLoop(chat, tools, Approval(), choice="facts_sub")
        loop = ToolLoop(chat, tools, Approval())
        with pytest.raises(UsageError, match="stdin line 3: 'always'"):
            loop.offer("always", where="stdin line 3")


def test_tools_command_changes_the_sessions_choice(engine: Engine, calls: Path, pidfile: Path) -> None:
    import io

    from rich.console import Console

    from localrun.cli.tools import choose_tools, show_tools
    from localrun.errors import UsageError

    chat = session(engine)  # steered to call wherever it may
    sink = io.StringIO()
    console = Console(file=sink, width=200)
    with host(calls, pidfile) as tools:
        tools.start()
        loop = ToolLoop(chat, tools, Approval({"all"}), max_steps=1, parallel=False)
        choose_tools(loop, "none", console)
        events = list(loop.turn(chat.plan("Add 2 and 40.")))  # the chat plans the turn itself, as /tools left it
        with pytest.raises(UsageError, match="/tools: 'sometimes'"):
            choose_tools(loop, "sometimes", console)
        show_tools(loop, console)
    assert loop.choice == "none" and not any(isinstance(e, ToolCallEvent) for e in events)
    assert "tool choice: none" in sink.getvalue() and ran(calls) == []
