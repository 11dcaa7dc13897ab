"""A reasoning model end to end, on tiny models whose chat template opens
``<think>`` in the generation prompt (as DeepSeek-R1's distills do) and whose
``<think>``/``</think>`` are control tokens the random weights never sample:
everything such a model writes is thinking until a budget forces the closing
marker, so the tests know where the thinking ends."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from localrun.chatformat.thinking import THINK
from localrun.events import DoneEvent, Event, ReasoningEvent, Stats, TokenEvent
from localrun.runtime.chat import ChatSession
from localrun.runtime.engine import Engine
from localrun.runtime.generate import generate
from localrun.runtime.prompt import build_prompt
from localrun.runtime.reasoning import Reasoning, reasoning_for
from localrun.runtime.sampling import SamplingParams
from localrun.structured.constraint import Constraint
from localrun.structured.spec import parse_schema
from tests.helpers import cli, engine_config, on_terminal
from tests.tinymodel import THINK_TOKENS, THINKING_CHATML, THINKING_TURNS, write_tiny_model

GREEDY = SamplingParams(temperature=0.0)
SWITCHED = THINKING_CHATML
UNSWITCHED = THINKING_TURNS + "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"


@pytest.fixture(scope="module")
def thinker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("models") / "thinker.gguf"
    return write_tiny_model(path, chat_template=SWITCHED, extra_tokens=THINK_TOKENS, n_ctx_train=1024)


@pytest.fixture(scope="module")
def stubborn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A thinker whose template has no switch."""
    path = tmp_path_factory.mktemp("models") / "stubborn.gguf"
    return write_tiny_model(path, chat_template=UNSWITCHED, extra_tokens=THINK_TOKENS)


@pytest.fixture(scope="module")
def engine(thinker: Path) -> Iterator[Engine]:
    with Engine(engine_config(thinker, n_ctx=512, n_threads=2)) as eng:
        yield eng


def _run(engine: Engine, budget: int | None, **options: object) -> tuple[str, str, Stats, list[Event]]:
    built = build_prompt(engine, "hello", None)
    reasoning = reasoning_for(engine.info.chat_template, built.text, budget=budget)
    assert reasoning == Reasoning(THINK, starts_open=True, budget=budget)
    events = list(generate(engine, built.tokens, GREEDY, reasoning=reasoning, **options))  # type: ignore[arg-type]
    thinking = "".join(e.text for e in events if isinstance(e, ReasoningEvent))
    answer = "".join(e.text for e in events if isinstance(e, TokenEvent))
    done = events[-1]
    assert isinstance(done, DoneEvent)
    return thinking, answer, done.stats, events


def test_a_budget_ends_the_thinking_and_the_answer_follows(engine: Engine) -> None:
    thinking, answer, stats, events = _run(engine, 6, max_tokens=20)
    assert thinking and answer  # both, apart
    assert "<think>" not in answer and "</think>" not in answer + thinking
    assert stats.reasoning_tokens == 7  # six thinking tokens and the forced closing marker
    assert stats.generated_tokens == 20
    kinds = [type(e).__name__ for e in events if isinstance(e, TokenEvent | ReasoningEvent)]
    assert kinds.index("TokenEvent") > kinds.index("ReasoningEvent")
    assert "ReasoningEvent" not in kinds[kinds.index("TokenEvent") :]  # the thinking ended for good


def test_without_a_budget_the_limit_cuts_the_thinking_off(engine: Engine) -> None:
    thinking, answer, stats, _ = _run(engine, None, max_tokens=12)
    assert thinking and answer == ""
    assert stats.reasoning_tokens == stats.generated_tokens == 12 and stats.stop_reason == "length"


def test_the_schema_starts_where_the_answer_starts(engine: Engine) -> None:
    spec = parse_schema("kind cat|dog, n int")
    thinking, answer, stats, _ = _run(engine, 5, max_tokens=120, constraint=Constraint(engine, spec))
    assert thinking  # free text, no JSON: the grammar did not apply to it
    record = json.loads(answer)
    assert record["kind"] in ("cat", "dog") and isinstance(record["n"], int)
    assert stats.valid is True and stats.stop_reason == "eos"


def test_chat_keeps_the_thinking_apart_and_out_of_the_next_prompt(engine: Engine) -> None:
    session = ChatSession(engine, SWITCHED, GREEDY, max_tokens=16, reasoning_budget=4)
    for _ in session.reply(session.plan("hi")):
        pass
    turn = session.turns[-1]
    assert turn.reasoning and turn.reply and turn.stats is not None and turn.stats.reasoning_tokens == 5
    plan = session.plan("again")
    rendered = engine.detokenize(plan.tokens)
    assert turn.reply in rendered and turn.reasoning not in rendered


def _cli(model: Path, *args: str) -> tuple[int, str, str]:
    res = cli("generate", "-m", str(model), "-n", "24", "-t", "0", "--no-log", *args, "hello")
    return res.returncode, res.stdout, res.stderr


def test_a_pipe_gets_the_answer_and_think_show_the_thinking(thinker: Path) -> None:
    code, shown, err = _cli(thinker, "--reasoning-budget", "6", "--think", "show")
    assert code == 0, err
    assert shown.startswith("<think>\n") and "\n</think>\n\n" in shown
    thinking, answer = shown.removeprefix("<think>\n").split("\n</think>\n\n")
    code, piped, err = _cli(thinker, "--reasoning-budget", "6")
    assert code == 0, err
    assert piped == answer and thinking.strip() not in piped


def test_json_has_reasoning_events_and_counts_them(thinker: Path) -> None:
    code, out, err = _cli(thinker, "--reasoning-budget", "3", "--json")
    assert code == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "reasoning" and "token" in kinds and kinds[-1] == "done"
    assert "reasoning" not in kinds[kinds.index("token") :]
    assert events[-1]["reasoning_tokens"] == 4 and events[-1]["generated_tokens"] == 24


def test_think_off_uses_the_switch(thinker: Path) -> None:
    code, out, err = _cli(thinker, "--think", "off", "--json")
    assert code == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert all(e["type"] != "reasoning" for e in events) and "reasoning_tokens" not in events[-1]


def test_think_off_without_a_switch_is_a_usage_error(stubborn: Path, tiny_model: Path) -> None:
    code, out, err = _cli(stubborn, "--think", "off")
    assert code == 2 and out == "" and "no switch to turn its thinking off" in err
    code, out, err = _cli(stubborn, "--think", "maybe")
    assert code == 2 and "not a mode" in err


def test_a_model_that_never_thinks_notes_think_off_and_a_budget(tiny_model: Path) -> None:
    """Scripts pass them to every model: one line on stderr, and the run a plain one is."""
    code, plain, quiet = _cli(tiny_model)
    assert code == 0, quiet
    for args in (["--reasoning-budget", "5"], ["--think", "off"]):
        code, out, err = _cli(tiny_model, *args)
        assert code == 0, err
        note, *rest = err.splitlines()
        assert out == plain and rest == quiet.splitlines()
        said = "--think off" if args[0] == "--think" else "--reasoning-budget"
        assert note.startswith(f"note: {said} does nothing here: ") and "does not think" in note
    code, out, err = _cli(tiny_model, "--think", "on")
    assert code == 2 and out == "" and "does not think" in err


def test_history_records_the_reasoning_tokens(thinker: Path) -> None:
    res = cli("generate", "-m", str(thinker), "-n", "10", "-t", "0", "--reasoning-budget", "2", "hello")
    assert res.returncode == 0, res.stderr
    logged = cli("logs", "show", "1", "--json")
    assert logged.returncode == 0, logged.stderr
    assert json.loads(logged.stdout)["reasoning_tokens"] == 3


@pytest.mark.pty
def test_a_terminal_shows_the_thinking_in_its_own_section(thinker: Path) -> None:
    code, screen = on_terminal(
        "generate", "-m", str(thinker), "-n", "30", "-t", "0", "--reasoning-budget", "9", "--no-log", "hello"
    )
    assert code == 0, screen
    assert "thinking · 10 tokens" in screen  # the final panel: nine thinking tokens and the closing marker


def test_a_batch_keeps_the_thinking_out_of_its_records(thinker: Path, tiny_model: Path, tmp_path: Path) -> None:
    lines = tmp_path / "lines.txt"
    lines.write_text("hello\nwhat now\n")
    res = cli("generate", "-m", str(thinker), "--batch", str(lines), "-n", "12", "-t", "0", "--no-log")
    assert res.returncode == 0, res.stderr
    records = [json.loads(line) for line in res.stdout.splitlines()]
    assert [r["text"] for r in records] == ["", ""]  # all thinking, cut off by -n: none of it is the text
    assert all(r["generated_tokens"] == 12 for r in records)
    res = cli("generate", "-m", str(tiny_model), "--batch", str(lines), "-n", "12", "-t", "0", "--no-log")
    assert all(json.loads(line)["text"] for line in res.stdout.splitlines())  # a model that does not think


def test_a_schema_where_the_model_may_open_the_thinking_itself(tmp_path: Path) -> None:
    """Qwen3's way: the prompt leaves the choice to the model; the grammar waits
    while the output may still open the thinking, and holds for the answer."""
    template = THINKING_TURNS + "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    model = write_tiny_model(tmp_path / "qwen3ish.gguf", chat_template=template, extra_tokens=THINK_TOKENS)
    with Engine(engine_config(model, n_ctx=512, n_threads=2)) as eng:
        built = build_prompt(eng, "hello", None)
        reasoning = reasoning_for(template, built.text, budget=3)
        assert reasoning == Reasoning(THINK, starts_open=False, budget=3)
        grammar = Constraint(eng, parse_schema("kind cat|dog, n int"))
        events = list(generate(eng, built.tokens, GREEDY, max_tokens=120, constraint=grammar, reasoning=reasoning))
    answer = "".join(e.text for e in events if isinstance(e, TokenEvent))
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.stats.valid is True, answer
    assert json.loads(answer)["kind"] in ("cat", "dog")


def test_stop_strings_apply_to_the_answer_only(engine: Engine) -> None:
    thinking, answer, _, _ = _run(engine, 8, max_tokens=24)
    in_thinking = next(thinking[i : i + 3] for i in range(len(thinking)) if thinking[i : i + 3] not in answer)
    again, answer_again, stats, _ = _run(engine, 8, max_tokens=24, stop=[in_thinking])
    assert (again, answer_again) == (thinking, answer) and stats.stop_reason == "length"
    _, cut, stats, _ = _run(engine, 8, max_tokens=24, stop=[answer[2:5]])
    assert stats.stop_reason == "stop" and cut == answer[: answer.index(answer[2:5])]
