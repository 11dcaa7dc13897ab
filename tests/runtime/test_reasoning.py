"""The thinking told apart from the answer: each family's markers in the
vendored chat templates, the streaming splitter on recorded outputs (however
they are cut into pieces, and cut off), and the token gate's budget."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from localrun import chatformat
from localrun.chatformat.thinking import FORMATS, THINK, ReasoningFormat
from localrun.errors import UsageError
from localrun.runtime.engine import Engine
from localrun.runtime.reasoning import (
    AnswerGuard,
    Reasoning,
    Splitter,
    ThinkingGate,
    check_mode,
    opens_thinking,
    reasoning_for,
    split_reply,
    switches_for,
)
from localrun.runtime.templates import render_chat
from localrun.structured.constraint import Constraint
from localrun.structured.spec import parse_schema
from tests import vendored
from tests.helpers import engine_config

BY_NAME = {fmt.name: fmt for fmt in FORMATS}


def reasoning_of(template: str | None) -> ReasoningFormat | None:
    return chatformat.of(template).reasoning


# (family, whether the prompt opened the thinking, a recorded output, its thinking, its answer)
RECORDED: list[tuple[str, bool, str, str, str]] = [
    (  # Qwen3: the model opens the thinking itself
        "think",
        False,
        "<think>\nThe user greets me. I should greet back.\n\nKeep it short.\n</think>\n\nHello! How can I help?",
        "The user greets me. I should greet back.\n\nKeep it short.",
        "Hello! How can I help?",
    ),
    (  # DeepSeek-R1 distills, SmolLM3: the generation prompt opened it
        "think",
        True,
        "\nOkay, 2 + 2 is 4.\n</think>\n\nThe answer is **4**.",
        "Okay, 2 + 2 is 4.",
        "The answer is **4**.",
    ),
    (  # Qwen3 with thinking off: no thinking at all
        "think",
        False,
        "Paris is the capital of France.",
        "",
        "Paris is the capital of France.",
    ),
    (  # gpt-oss, as llama.cpp detokenizes it: <|end|> renders to nothing
        "harmony",
        True,
        "<|channel|>analysis<|message|>User asks for a joke. Provide one.<|start|>assistant"
        "<|channel|>final<|message|>Why did the scarecrow win an award?",
        "User asks for a joke. Provide one.",
        "Why did the scarecrow win an award?",
    ),
    (  # gpt-oss with <|end|> rendered
        "harmony",
        True,
        "<|channel|>analysis<|message|>Short.<|end|><|start|>assistant<|channel|>final<|message|>Done.",
        "Short.",
        "Done.",
    ),
    (  # gpt-oss calling a tool: the call stays in the answer, header and all
        "harmony",
        True,
        "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}',
        "Need the weather.",
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}',
    ),
    ("seed", False, "<seed:think>Hmm.</seed:think>Yes.", "Hmm.", "Yes."),
    ("magistral", False, "[THINK]Let me see.[/THINK]It is 7.", "Let me see.", "It is 7."),
    ("command-r", False, "<|START_THINKING|>Plan.<|END_THINKING|>Answer.", "Plan.", "Answer."),
    ("gemma4", False, "<|channel>thought\nConsider it.<channel|>Ok.", "Consider it.", "Ok."),
]


def _stream(fmt: ReasoningFormat, starts_open: bool, text: str, size: int) -> tuple[str, str, list[str]]:
    splitter = Splitter(fmt, starts_open=starts_open)
    pieces = []
    for i in range(0, len(text), size):
        pieces += splitter.feed(text[i : i + size])
    pieces += splitter.flush()
    reasoning = "".join(t for kind, t in pieces if kind == "reasoning")
    content = "".join(t for kind, t in pieces if kind == "content")
    return reasoning, content, [kind for kind, _ in pieces]


@pytest.mark.parametrize(("name", "opened", "text", "thinking", "answer"), RECORDED)
def test_recorded_outputs_split_the_same_in_any_pieces(
    name: str, opened: bool, text: str, thinking: str, answer: str
) -> None:
    fmt = BY_NAME[name]
    assert split_reply(text, fmt, starts_open=opened) == (thinking, answer)
    for size in range(1, len(text) + 1):  # every cut: markers split across pieces, one character at a time
        reasoning, content, kinds = _stream(fmt, opened, text, size)
        assert (reasoning, content) == (thinking, answer), size
        assert "content" not in kinds or "reasoning" not in kinds[kinds.index("content") :], "thinking after answer"


@pytest.mark.parametrize(("name", "opened", "text", "thinking", "answer"), [r for r in RECORDED if r[3]])
def test_thinking_cut_off_stays_thinking(name: str, opened: bool, text: str, thinking: str, answer: str) -> None:
    fmt = BY_NAME[name]
    end = fmt.end if fmt.name != "harmony" else "<|start|>" if "<|start|>" in text else "<|end|>"
    cut = text[: text.index(end)]  # the token limit came before the closing marker
    for size in (1, 3, len(cut)):
        reasoning, content, _ = _stream(fmt, opened, cut, size)
        assert reasoning == thinking.rstrip() and content == ""


def test_a_marker_held_back_is_not_shown_early() -> None:
    splitter = Splitter(THINK, starts_open=True)
    assert splitter.feed("Thinking about it</thi") == [("reasoning", "Thinking about it")]
    assert splitter.thinking
    assert splitter.feed("nk>\n\nHi") == [("content", "Hi")]
    assert not splitter.thinking


def test_without_a_format_a_reply_is_all_answer() -> None:
    assert split_reply("<think>x</think>y", None) == ("", "<think>x</think>y")


def test_families_of_the_vendored_templates() -> None:
    assert reasoning_of(vendored.template("Qwen-Qwen3-0.6B")) is THINK
    assert reasoning_of(vendored.template("deepseek-ai-DeepSeek-R1-Distill-Llama-8B")) is THINK
    assert reasoning_of(vendored.template("HuggingFaceTB-SmolLM3-3B")) is THINK
    assert reasoning_of(vendored.template("openai-gpt-oss-120b")) is BY_NAME["harmony"]
    assert reasoning_of(vendored.template("mistralai-Ministral-3-14B-Reasoning-2512")) is BY_NAME["magistral"]
    assert reasoning_of(vendored.template("ByteDance-Seed-OSS")) is BY_NAME["seed"]
    assert reasoning_of(vendored.template("google-gemma-4-31B-it")) is BY_NAME["gemma4"]
    assert reasoning_of(vendored.template("meta-llama-Llama-3.3-70B-Instruct")) is None
    assert reasoning_of(None) is None


def test_switches_each_template_reads() -> None:
    qwen3 = vendored.template("Qwen-Qwen3-0.6B")
    assert switches_for(qwen3, "off") == {"enable_thinking": False}
    assert switches_for(qwen3, "auto") == {"enable_thinking": True}
    gpt_oss = vendored.template("openai-gpt-oss-120b")
    assert switches_for(gpt_oss, "off") == {"reasoning_effort": "low"}
    assert switches_for(gpt_oss, "auto") == {}
    assert switches_for(vendored.template("deepseek-ai-DeepSeek-R1-Distill-Llama-8B"), "off") == {}


def _prompt(template: str, **switches: object) -> str:
    return render_chat(
        template, [{"role": "user", "content": "hi"}], bos_token="<s>", eos_token="</s>", switches=switches
    )


def test_the_rendered_prompt_says_whether_the_thinking_is_open() -> None:
    r1 = vendored.template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B")
    assert opens_thinking(THINK, _prompt(r1, enable_thinking=True)) is True
    assert opens_thinking(THINK, _prompt(r1, enable_thinking=False)) is False
    qwen3 = vendored.template("Qwen-Qwen3-0.6B")
    assert opens_thinking(THINK, _prompt(qwen3, enable_thinking=True)) is None  # the model opens it, or not
    assert reasoning_for(qwen3, _prompt(qwen3, enable_thinking=False)) is None  # thinking off: nothing to split
    found = reasoning_for(r1, _prompt(r1, enable_thinking=True), budget=8)
    assert found == Reasoning(THINK, starts_open=True, budget=8)


def test_think_off_needs_a_switch() -> None:
    r1_llama = vendored.template("deepseek-ai-DeepSeek-R1-Distill-Llama-8B")
    with pytest.raises(UsageError, match="no switch"):
        check_mode(r1_llama, "off", model="r1")
    check_mode(r1_llama, "show", model="r1")
    check_mode(vendored.template("Qwen-Qwen3-0.6B"), "off", model="qwen3")
    llama = vendored.template("meta-llama-Llama-3.3-70B-Instruct")
    with pytest.raises(UsageError, match="does not think"):
        check_mode(llama, "on", model="llama")
    # what a model that never thinks does anyway: a note, not an error (scripts pass them to every model)
    assert check_mode(llama, "auto", model="llama", budget=10) == (
        "--reasoning-budget does nothing here: llama does not think (its chat template has no thinking markers)"
    )
    assert (check_mode(llama, "off", model="llama") or "").startswith("--think off does nothing here: llama does")
    assert check_mode(llama, "auto", model="llama") is None and check_mode(r1_llama, "on", model="r1") is None


# -- the gate, on a vocabulary where each marker is one token and each letter another --

VOCAB = {"<think>": 900, "</think>": 901, "<|end|>": 902, "<|start|>": 903, "<|channel|>": 904, "<|message|>": 905}


def _tokenize(text: str) -> list[int]:
    out: list[int] = []
    while text:
        marker = next((m for m in VOCAB if text.startswith(m)), None)
        if marker is not None:
            out.append(VOCAB[marker])
            text = text[len(marker) :]
        else:
            out.append(ord(text[0]))
            text = text[1:]
    return out


def _drive(gate: ThinkingGate, model: list[int], n: int) -> list[int]:
    """The tokens a run takes: the forced one where the gate forces, else the model's next."""
    taken: list[int] = []
    source = iter(model)
    while len(taken) < n:
        token = gate.forced()
        taken.append(token if token is not None else next(source))
        gate.accept(taken[-1])
    return taken


@pytest.mark.parametrize("budget", [0, 1, 5, 12])
def test_a_budget_ends_the_thinking_within_n_plus_1_tokens(budget: int) -> None:
    gate = ThinkingGate(Reasoning(THINK, starts_open=True, budget=budget), _tokenize)
    taken = _drive(gate, [ord("a")] * 100, budget + 4)
    assert taken.index(VOCAB["</think>"]) == budget  # budget thinking tokens, then the closing marker
    assert gate.answering


def test_the_budget_counts_from_the_opening_marker() -> None:
    gate = ThinkingGate(Reasoning(THINK, budget=3), _tokenize)
    assert gate.opening() == VOCAB["<think>"]
    taken = _drive(gate, [VOCAB["<think>"], *[ord("x")] * 50], 6)
    assert taken == [VOCAB["<think>"], ord("x"), ord("x"), ord("x"), VOCAB["</think>"], ord("x")]


def test_a_natural_end_is_not_forced() -> None:
    gate = ThinkingGate(Reasoning(THINK, starts_open=True, budget=10), _tokenize)
    assert [gate.accept(t) for t in _tokenize("ab</think>cd")] == [False, False, False, True, True]
    assert gate.forced() is None


def test_an_answer_without_thinking_belongs_to_the_answer_from_its_first_token() -> None:
    gate = ThinkingGate(Reasoning(THINK, budget=2), _tokenize)
    assert gate.accept(ord("{")) is True
    assert gate.answering and gate.forced() is None


def test_harmony_budget_forces_the_final_header() -> None:
    harmony = BY_NAME["harmony"]
    gate = ThinkingGate(Reasoning(harmony, starts_open=True, budget=4), _tokenize)
    head = _tokenize("<|channel|>analysis<|message|>")
    taken = _drive(gate, [*head, *[ord("z")] * 50], 4 + len(_tokenize(harmony.forced)) + 1)
    assert taken[4 : 4 + len(_tokenize(harmony.forced))] == _tokenize(harmony.forced)
    assert gate.answering


def test_a_grammar_over_the_whole_output_needs_no_gate(tiny_model: Path) -> None:
    """Harmony's tool grammar covers the thinking and keeps its budget itself:
    it applies from the first token; an answer's grammar waits for the answer."""
    harmony = BY_NAME["harmony"]
    answer_only = parse_schema("name str")
    with Engine(engine_config(tiny_model, n_ctx=256, n_threads=1)) as engine:
        for whole in (True, False):
            grammar = Constraint(engine, replace(answer_only, whole=whole))
            guard = AnswerGuard(grammar, Reasoning(harmony, starts_open=True, budget=4), _tokenize)
            assert (guard.gate is None) == whole
            assert (guard.constraint is grammar) == whole
