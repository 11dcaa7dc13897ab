"""Reasoning models: the thinking told apart from the answer, by the
markers of the chat template's format (`localrun.chatformat`), confirmed by
what the model generates:

- ``<think>…</think>`` (Qwen3, QwQ, DeepSeek-R1 and its distills, SmolLM3,
  GLM, Kimi, MiniMax, Nemotron, ...) and its kin with other tags (Seed-OSS
  ``<seed:think>``, Magistral ``[THINK]``, Command R7B ``<|START_THINKING|>``,
  Gemma 4 ``<|channel>thought``). A generation prompt may already open the
  thinking (``<|im_start|>assistant\\n<think>\\n``): the output then starts
  inside it. Otherwise a model may open it as its first words, or not think.
- gpt-oss's harmony channels: ``<|channel|>analysis<|message|>…`` is the
  thinking, ``<|channel|>final<|message|>…`` the answer (``<|end|>`` renders
  to nothing, so a message also ends where the next ``<|start|>`` or
  ``<|channel|>`` begins). Other channels (a ``commentary`` tool call) stay in
  the answer as written, headers and all, for the tool-call parser.

`Splitter` splits streamed text into thinking and answer pieces, robust to a
marker cut across pieces and to thinking cut off by the token limit (it stays
thinking, as llama.cpp's ``deepseek`` reasoning format keeps it);
`split_reply` does the same to a whole reply. `ThinkingGate` follows the
same boundary token by token in a decode loop: it ends the thinking after a
budget of tokens (forcing the closing marker, as llama.cpp's reasoning budget
does) and says when the answer starts, where a grammar takes over.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from localrun import chatformat
from localrun.chatformat.thinking import ReasoningFormat
from localrun.errors import UsageError

if TYPE_CHECKING:
    from localrun.structured.constraint import Constraint

PieceKind = Literal["reasoning", "content"]
Piece = tuple[PieceKind, str]
ThinkMode = Literal["auto", "on", "off", "show"]
THINK_MODES: tuple[ThinkMode, ...] = ("auto", "on", "off", "show")


def _switch_names(template: str) -> set[str]:
    return set(re.findall(r"\b(enable_thinking|reasoning_effort|thinking)\b", template))


def switches_for(template: str | None, mode: ThinkMode) -> dict[str, Any]:
    """The template switches that ask for ``mode`` (``enable_thinking``, or
    gpt-oss's ``reasoning_effort`` where that is all there is). auto and show
    pass ``enable_thinking`` on, as llama.cpp does (a template that reads it
    unset as false would close the thinking), and leave the rest to the
    template's defaults."""
    if not template:
        return {}
    on = mode != "off"
    names = _switch_names(template)
    if "enable_thinking" in names:
        return {"enable_thinking": on}
    if mode not in ("on", "off"):
        return {}
    if "reasoning_effort" in names:
        return {"reasoning_effort": "medium" if on else "low"}
    if "thinking" in names and re.search(r"\bif\s+(not\s+)?thinking\b", template):
        return {"thinking": on}
    return {}


def check_mode(template: str | None, mode: ThinkMode, *, model: str, budget: int | None = None) -> str | None:
    """Refuse what the model's template cannot do: ``--think off`` without a
    switch, ``--think on`` on a model that does not think (``show`` there
    shows nothing, as ``auto`` does). ``--think off`` or a budget on such a
    model already hold (scripts pass them to every model): returns the note
    that says they do nothing there."""
    fmt = chatformat.of(template).reasoning
    if mode == "off" and budget is not None:
        raise UsageError("--reasoning-budget with --think off: there is no thinking to budget", hint="drop one")
    if fmt is None:
        why = f"{model} does not think (its chat template has no thinking markers)"
        if mode == "on":
            raise UsageError(f"--think on: {why}")
        if mode == "off" or budget is not None:
            return f"{'--think off' if mode == 'off' else '--reasoning-budget'} does nothing here: {why}"
        return None
    if mode == "off" and not switches_for(template, "off"):
        raise UsageError(
            f"--think off: {model}'s chat template has no switch to turn its thinking off",
            hint="leave --think out (a pipe gets the answer alone), or give --reasoning-budget 0",
        )
    return None


@dataclass(frozen=True)
class Reasoning:
    """A run's thinking: the family's markers, whether the prompt already
    opened the thinking, and the budget of thinking tokens (None: no limit)."""

    format: ReasoningFormat
    starts_open: bool = False
    budget: int | None = None

    def splitter(self) -> Splitter:
        return Splitter(self.format, starts_open=self.starts_open)


def opens_thinking(fmt: ReasoningFormat, prompt: str) -> bool | None:
    """What the end of a rendered prompt says of the output: True when it
    opened the thinking (``…<think>\\n``), False when it opened and closed it
    (``<think>\\n\\n</think>\\n\\n``, thinking off), None when it left the
    choice to the model."""
    if fmt.channels:
        return True  # every reply on channels starts with a channel header
    tail = prompt.rstrip()
    if tail.endswith(fmt.start):
        return True
    if tail.endswith(fmt.end):
        return False
    return None


def reasoning_for(
    template: str | None, prompt: str, *, budget: int | None = None, mode: ThinkMode = "auto"
) -> Reasoning | None:
    """The run's thinking, from its chat template and its rendered ``prompt``;
    None where the model does not think (or its prompt turned thinking off)."""
    fmt = chatformat.of(template).reasoning
    if fmt is None:
        return None
    opened = opens_thinking(fmt, prompt)
    if opened is False and mode != "on":
        return None
    return Reasoning(fmt, starts_open=bool(opened), budget=budget)


# -- text --


def _held(buf: str, marker: str) -> int:
    """How many trailing characters of ``buf`` could begin ``marker``."""
    for k in range(min(len(marker) - 1, len(buf)), 0, -1):
        if buf.endswith(marker[:k]):
            return k
    return 0


@dataclass
class Splitter:
    """Streamed text in, (kind, text) pieces out: thinking and answer apart.

    Holds back what could be the start of a marker, the whitespace around the
    markers (a thinking section's first and last blank lines, the blank line
    before the answer), and, before the output has shown whether it thinks,
    what could still become the opening marker."""

    format: ReasoningFormat
    starts_open: bool = False
    state: Literal["undecided", "reasoning", "content", "header", "other"] = field(init=False)
    pending: str = field(init=False, default="")
    fresh: bool = field(init=False, default=True)  # nothing of this section emitted yet: leading whitespace goes

    def __post_init__(self) -> None:
        self.state = "header" if self.format.channels else "reasoning" if self.starts_open else "undecided"

    @property
    def thinking(self) -> bool:
        """Inside the thinking (for harmony, in a channel's header too)."""
        return self.state in ("reasoning", "header")

    def feed(self, text: str) -> list[Piece]:
        self.pending += text
        out: list[Piece] = []
        while self.pending:
            before = (self.state, len(self.pending))
            self._step(out)
            if (self.state, len(self.pending)) == before:
                break
        return out

    def flush(self) -> list[Piece]:
        """What is held at the end: thinking cut off stays thinking."""
        out: list[Piece] = []
        rest, self.pending = self.pending, ""
        if self.state == "header":  # a header cut off says nothing; text that never was harmony is the answer
            kind: PieceKind = "content"
            rest = "" if "<|channel|>" in rest or "<|start|>" in rest else rest
        else:
            kind = "reasoning" if self.state == "reasoning" else "content"
        text = rest.rstrip() if kind == "reasoning" else rest
        if self.fresh:
            text = text.lstrip()
        if text:
            out.append((kind, text))
        return out

    def _emit(self, out: list[Piece], kind: PieceKind, text: str) -> None:
        if self.fresh:
            text = text.lstrip()
        if text:
            self.fresh = False
            if out and out[-1][0] == kind:
                out[-1] = (kind, out[-1][1] + text)
            else:
                out.append((kind, text))

    def _enter(self, state: Literal["reasoning", "content", "header", "other"], rest: str) -> None:
        self.state, self.pending, self.fresh = state, rest, True

    def _step(self, out: list[Piece]) -> None:
        fmt, buf = self.format, self.pending
        if self.state == "undecided":
            lead = buf.lstrip()
            if lead.startswith(fmt.start):
                self._enter("reasoning", lead[len(fmt.start) :])
            elif lead.startswith(fmt.end):  # a thinking closed with nothing in it, as templates render one
                self._enter("content", lead[len(fmt.end) :])
            elif not (fmt.start.startswith(lead) or fmt.end.startswith(lead)):  # the answer from the first character
                self.state = "content"
            return
        if self.state == "content":
            self.pending = ""
            self._emit(out, "content", buf)
            return
        if self.state == "header":
            self._header(out, buf)
            return
        kind: PieceKind = "reasoning" if self.state == "reasoning" else "content"
        ends = _HARMONY_ENDS if fmt.channels else (fmt.end,)
        cut = min((i for i in (buf.find(e) for e in ends) if i >= 0), default=-1)
        if cut >= 0:
            body = buf[:cut].rstrip() if kind == "reasoning" else buf[:cut]
            self._emit(out, kind, body)
            if not fmt.channels:
                self._enter("content", buf[cut + len(fmt.end) :])
            else:
                rest = buf[cut:]
                self._enter("header", rest[len("<|end|>") :] if rest.startswith("<|end|>") else rest)
            return
        hold = max(_held(buf, e) for e in ends)
        body = buf[: len(buf) - hold]
        if kind == "reasoning":  # trailing whitespace waits: it may be the blank line before the marker
            keep = len(body) - len(body.rstrip())
            body, hold = body[: len(body) - keep], hold + keep
        self._emit(out, kind, body)
        self.pending = buf[len(buf) - hold :] if hold else ""

    def _header(self, out: list[Piece], buf: str) -> None:
        """Harmony: ``[<|start|>assistant]<|channel|>NAME[ to=...][<|constrain|>json]<|message|>``."""
        mark = buf.find("<|message|>")
        if mark < 0:
            if len(buf) > 200 and "<|channel|>" not in buf:  # not harmony after all: the text is the answer
                self.state = "content"
            return
        header = buf[:mark]
        start = header.find("<|channel|>")
        channel = header[start + len("<|channel|>") :].strip() if start >= 0 else ""
        name = re.split(r"[\s<]", channel, maxsplit=1)[0] if channel else ""
        rest = buf[mark + len("<|message|>") :]
        if name == "analysis":
            self._enter("reasoning", rest)
        elif name == "final":
            self._enter("content", rest)
        else:  # a tool call or another channel: kept whole, header and all, for whoever parses it
            recipient = header.find("to=")  # in the role header (``<|start|>assistant to=...``): kept with it
            begin = min((i for i in (start, recipient) if i >= 0), default=0)
            self._enter("other", rest)
            self.fresh = False
            self._emit(out, "content", buf[begin : mark + len("<|message|>")])


_HARMONY_ENDS = ("<|end|>", "<|start|>", "<|channel|>")


def split_reply(text: str, fmt: ReasoningFormat | None, *, starts_open: bool = False) -> tuple[str, str]:
    """A whole reply as (thinking, answer): what a tool-call parser reads the
    answer from. Without a format, the reply is all answer."""
    if fmt is None:
        return "", text
    splitter = Splitter(fmt, starts_open=starts_open)
    parts: dict[PieceKind, list[str]] = {"reasoning": [], "content": []}
    for kind, piece in [*splitter.feed(text), *splitter.flush()]:
        parts[kind].append(piece)
    return "".join(parts["reasoning"]), "".join(parts["content"])


# -- tokens --


class _SeqMatcher:
    """Whether the tokens seen so far end with ``seq``."""

    def __init__(self, seq: Sequence[int]) -> None:
        self.seq = list(seq)
        self.recent: list[int] = []

    def advance(self, token: int) -> bool:
        if not self.seq:
            return False
        self.recent.append(token)
        del self.recent[: max(len(self.recent) - len(self.seq), 0)]
        if self.recent == self.seq:
            self.recent.clear()
            return True
        return False

    def reset(self) -> None:
        self.recent.clear()


GateState = Literal["undecided", "thinking", "forcing", "answer"]


class ThinkingGate:
    """The thinking's boundary token by token, in a decode loop.

    ``undecided``: the output may open the thinking (its first tokens match
    the opening marker's) or start the answer; ``thinking``: counting tokens
    against the budget; ``forcing``: the budget is spent, the closing
    marker's tokens are forced one by one; ``answer``: the thinking is over
    (a grammar applies from here)."""

    def __init__(self, reasoning: Reasoning, tokenize: Callable[[str], list[int]]) -> None:
        fmt = reasoning.format
        self.start = tokenize(fmt.start)
        self.forced_seq = tokenize(fmt.forced)
        self.end = _SeqMatcher(tokenize(fmt.answer))
        self.budget = reasoning.budget
        self.state: GateState = "undecided"
        self.spent = 0
        self.position = 0  # in the opening marker (undecided) or the forced sequence (forcing)
        if reasoning.starts_open:
            self._think()

    def _think(self) -> None:
        self.state, self.spent, self.position = "thinking", 0, 0
        self.end.reset()
        if self.budget is not None and self.budget <= 0:
            self.state = "forcing"

    @property
    def answering(self) -> bool:
        return self.state == "answer"

    def forced(self) -> int | None:
        """The token that must come next (the budget is spent), if any."""
        if self.state == "forcing" and self.position < len(self.forced_seq):
            return self.forced_seq[self.position]
        return None

    def opening(self) -> int | None:
        """While undecided, the next token of the opening marker: a grammar on
        the answer must leave it possible."""
        if self.state == "undecided" and self.position < len(self.start):
            return self.start[self.position]
        return None

    def accept(self, token: int) -> bool:
        """Follow one token of the output; True when it belongs to the answer
        (a grammar on the answer takes it)."""
        if self.state == "answer":
            return True
        if self.state == "undecided":
            if self.opening() == token:
                self.position += 1
                if self.position == len(self.start):
                    self._think()
                return False
            self.state = "answer"
            return True
        if self.end.advance(token):
            self.state = "answer"
            return False
        if self.state == "forcing":
            self.position += 1
            if self.position >= len(self.forced_seq):
                self.state = "answer"
            return False
        self.spent += 1
        if self.budget is not None and self.spent >= self.budget:
            self.state, self.position = "forcing", 0
        return False


class AnswerGuard:
    """What one output may take next, token by token: the token a spent
    thinking budget forces, else the grammar's tokens once the answer started
    (the thinking is free; while the output may still open it, its opening
    token stays possible). Every decode loop masks each row with `mask` and
    tells `accepted` each token the output keeps."""

    def __init__(self, grammar: Constraint | None, reasoning: Reasoning | None, tokenize: Callable[[str], list[int]]):
        self.grammar = grammar
        # the gate follows the thinking where there is something to force or to start after it
        # (a grammar that covers the thinking too, as harmony's tool calls do, keeps its budget itself)
        needed = reasoning is not None and (grammar is not None or reasoning.budget is not None)
        needed = needed and not (grammar is not None and grammar.spec.whole)
        self.gate = ThinkingGate(reasoning, tokenize) if reasoning is not None and needed else None

    @property
    def masks(self) -> bool:
        """Whether `mask` changes anything (else a loop may sample without it, even on the device)."""
        return self.grammar is not None or self.gate is not None

    @property
    def constraint(self) -> Constraint | None:
        """The grammar, once it applies: from the answer's first token on."""
        return self.grammar if self.gate is None or self.gate.answering else None

    def mask(self, logits: Any) -> None:
        """Mask one row of logits (in place) to what may come next."""
        gate = self.gate
        forced = gate.forced() if gate is not None else None
        if forced is not None:
            keep = float(logits[forced])
            logits[:] = -np.inf
            logits[forced] = keep if np.isfinite(keep) else 0.0
        elif self.grammar is None:
            return
        elif gate is None or gate.answering:
            self.grammar.apply(logits)
        elif (opening := gate.opening()) is not None:
            keep = float(logits[opening])
            self.grammar.apply(logits)
            logits[opening] = keep

    def accepted(self, token: int) -> None:
        """The output keeps ``token``: the gate follows it, the grammar takes it when it is the answer's."""
        answer = self.gate.accept(token) if self.gate is not None else True
        if answer and self.grammar is not None:
            self.grammar.consume(token)


def marker_tokens(fmt: ReasoningFormat, tokenize: Callable[[str], list[int]]) -> list[str]:
    """The family's markers that are one token each in this vocabulary."""
    return [m for m in fmt.markers if len(tokenize(m)) == 1]
