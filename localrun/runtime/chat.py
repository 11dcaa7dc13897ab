"""A conversation held in one context: each turn evaluates only its new tokens.

`ChatSession` keeps the messages and, beside them, exactly what the KV cache
holds (tokens, and the rendered text they stand for). A new turn renders the
whole conversation with the chat template; when the rendering extends the text
already in the cache, only the extension is tokenized and evaluated. When the
conversation no longer fits the context, the oldest turns are dropped (the
system prompt stays) and the caller is told how many.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from localrun import paths
from localrun.errors import UsageError
from localrun.events import DoneEvent, Event, ReasoningEvent, Stats, TokenEvent
from localrun.runtime.decoder import Decoder
from localrun.runtime.engine import Engine
from localrun.runtime.generate import PLAIN, Decoding
from localrun.runtime.prompt import render_messages, reply_start, tokenize_rendered
from localrun.runtime.reasoning import ThinkMode, reasoning_for
from localrun.runtime.sampling import SamplingParams
from localrun.runtime.templates import Message
from localrun.structured.constraint import Constraint
from localrun.structured.spec import OutputSpec

REPLY_RESERVE = 512  # context kept free for a reply when older turns must go
SAVE_FORMAT = "localrun-chat/2"  # /1 wrote the GGUF's own name as "model", which -m cannot take


@dataclass
class Turn:
    """One user message and the reply to it."""

    user: str
    reply: str = ""  # the answer (a reasoning model's thinking is apart)
    interrupted: bool = False
    stats: Stats | None = None
    reasoning: str = ""
    steps: list[dict[str, Any]] = field(default_factory=list)  # a tool loop's calls and results before the reply


# a tool loop's hook: the messages as the template takes them, and the tools it offers
PromptTools = Callable[[list[Message]], tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]


@dataclass
class SessionTotals:
    turns: int = 0
    generated_tokens: int = 0
    evaluated_tokens: int = 0
    cached_tokens: int = 0
    decode_seconds: float = 0.0

    def add(self, stats: Stats) -> None:
        self.turns += 1
        self.generated_tokens += stats.generated_tokens
        self.evaluated_tokens += stats.prompt_tokens - stats.cached_tokens
        self.cached_tokens += stats.cached_tokens
        if stats.decode_tokens_per_s:
            self.decode_seconds += max(stats.generated_tokens - 1, 0) / stats.decode_tokens_per_s

    @property
    def decode_rate(self) -> float:
        """Tokens per second over every turn's decoding (each turn's first token is its prompt's)."""
        return (self.generated_tokens - self.turns) / self.decode_seconds if self.decode_seconds else 0.0


class Conversation(NamedTuple):
    """A conversation to continue: saved with /save, or taken from the run history."""

    system: str | None
    turns: list[Turn]
    model: str | None = None  # what -m takes to load its model again (an alias, a path)


@dataclass
class TurnPlan:
    """The prompt of the next turn and how many old turns were dropped to fit it."""

    tokens: list[int]
    dropped: int = 0
    marks: tuple[int, ...] = ()  # where the next turn is expected to start again (a recurrent memory checkpoints)


@dataclass
class ChatSession:
    engine: Engine
    template: str
    sampling: SamplingParams
    system: str | None = None
    max_tokens: int | None = None
    turns: list[Turn] = field(default_factory=list)
    totals: SessionTotals = field(default_factory=SessionTotals)
    speculation: Decoding | None = None  # drafting (a Speculation): kept across turns so its measurements carry over
    use_draft: bool = True
    output: OutputSpec | None = None  # every reply follows this schema or grammar (--schema, /schema)
    model: str | None = None  # what -m takes to load this model again: /save writes it
    switches: dict[str, Any] | None = None  # the chat template's switches (enable_thinking, reasoning_effort)
    think: ThinkMode = "auto"
    reasoning_budget: int | None = None  # a reasoning model's thinking ends after this many tokens
    prompt_tools: PromptTools | None = None  # tools offered (localrun.mcp's tool loop sets it)

    def __post_init__(self) -> None:
        self.decoder = Decoder(self.engine)
        self._cached_text = ""  # the rendered text that the KV cache's tokens stand for
        self._cached_tokens: list[int] = []

    @property
    def decoding(self) -> Decoding:
        """The speculation while drafting is on (/draft), else plain decoding."""
        return self.speculation if self.speculation is not None and self.use_draft else PLAIN

    # -- conversation --

    def messages(self, turns: list[Turn] | None = None) -> list[Message]:
        """The conversation as chat messages. Every answered turn has its reply,
        an empty one too: templates expect user and assistant to alternate
        (Gemma's refuses two user messages in a row)."""
        turns = self.turns if turns is None else turns
        out: list[Message] = [{"role": "system", "content": self.system}] if self.system else []
        for i, turn in enumerate(turns, 1):
            out.append({"role": "user", "content": turn.user})
            out.extend(turn.steps)
            if turn.reply or turn.reasoning or i < len(turns):  # the last one unanswered is the one to answer
                reply = {"role": "assistant", "content": turn.reply}  # the template keeps or drops the thinking
                out.append(reply | {"reasoning_content": turn.reasoning} if turn.reasoning else reply)
        return out

    def clear(self) -> None:
        self.turns.clear()

    def set_system(self, text: str | None) -> None:
        self.system = text or None

    # -- turns --

    def plan(self, user: str) -> TurnPlan:
        """Add the user's message and build the prompt for the reply, dropping
        the oldest turns while the conversation does not fit the context."""
        if not user.strip():
            raise UsageError("the message is empty")
        self.turns.append(Turn(user))
        return self.replan()

    def _prompt(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        messages = self.messages()
        return self.prompt_tools(messages) if self.prompt_tools is not None else (list(messages), None)

    def replan(self) -> TurnPlan:
        """The prompt for the last turn's reply as the conversation stands
        (after a tool loop's calls and results), older turns dropped to fit."""
        reserve = min(self.max_tokens or REPLY_RESERVE, REPLY_RESERVE)
        dropped = 0
        while True:
            messages, tools = self._prompt()
            text = render_messages(self.engine, self.template, messages, tools, switches=self.switches)
            tokens = self._tokens_for(text)
            if len(tokens) + reserve <= self.engine.n_ctx or len(self.turns) == 1:
                break
            self.turns.pop(0)
            dropped += 1
        if len(tokens) >= self.engine.n_ctx:
            self.turns.pop()
            self.engine.check_fits(len(tokens))  # raises with the numbers and a hint
        self._pending_text = text
        mark = None
        if self.engine.cuts.recurrent:  # only a recurrent memory needs a checkpoint to start there again
            mark = reply_start(self.engine, self.template, messages, text, tokens, self.switches, tools)
        return TurnPlan(tokens, dropped, (mark,) if mark else ())

    def _tokens_for(self, text: str) -> list[int]:
        if self._cached_text and text.startswith(self._cached_text):
            rest = text[len(self._cached_text) :]
            return self._cached_tokens + self.engine.tokenize(rest, add_special=False)
        return tokenize_rendered(self.engine, text)

    def reply(self, plan: TurnPlan, grammar: OutputSpec | None = None) -> Iterator[Event]:
        """Stream the reply to the last planned message; the turn keeps what was
        generated, even when interrupted. ``grammar``: this reply's constraint
        in place of the session's (a tool loop's calls)."""
        turn = self.turns[-1]
        self.engine.abort_requested = False
        output = grammar if grammar is not None else self.output
        constraint = Constraint(self.engine, output) if output is not None else None
        reasoning = reasoning_for(self.template, self._pending_text, budget=self.reasoning_budget, mode=self.think)
        events = self.decoding.generate(
            self.engine,
            plan.tokens,
            self.sampling,
            max_tokens=self.max_tokens,
            decoder=self.decoder,
            marks=plan.marks,
            constraint=constraint,
            reasoning=reasoning,
        )
        for event in events:
            if isinstance(event, TokenEvent):
                turn.reply += event.text
            elif isinstance(event, ReasoningEvent):
                turn.reasoning += event.text
            elif isinstance(event, DoneEvent):
                turn.stats = event.stats
                turn.interrupted = event.stats.stop_reason == "interrupted"
                self.totals.add(event.stats)
            yield event
        # Remember the text the cache's tokens stand for, so the next turn
        # tokenizes only its own part (a different tokenization of the reply
        # would otherwise cut the reuse short). A reply cut short leaves its
        # last token unevaluated: the next turn evaluates it with its own text.
        held = self.decoder.tokens
        if len(held) >= len(plan.tokens):
            self._cached_tokens = list(held)
            self._cached_text = self._pending_text + self.engine.detokenize(held[len(plan.tokens) :])
        else:  # stopped during the prompt
            self._cached_tokens, self._cached_text = [], ""

    def retry(self) -> TurnPlan:
        """Forget the last reply and plan it again."""
        if not self.turns:
            raise UsageError("there is no reply to retry yet")
        last = self.turns.pop()
        return self.plan(last.user)

    # -- files --

    def save(self, path: Path) -> None:
        record: dict[str, Any] = {
            "format": SAVE_FORMAT,
            "model": self.model or str(self.engine.config.model_path),
            "system": self.system,
            "messages": [
                m
                for t in self.turns
                for m in (
                    {"role": "user", "content": t.user},
                    *t.steps,  # a tool loop's calls and results
                    {
                        "role": "assistant",
                        "content": t.reply,
                        **({"reasoning_content": t.reasoning} if t.reasoning else {}),  # the thinking, apart
                        **({"interrupted": True} if t.interrupted else {}),
                    },
                )
            ],
        }
        paths.atomic_write(path, json.dumps(record, ensure_ascii=False, indent=2) + "\n")

    def load(self, path: Path) -> Conversation:
        saved = read_conversation(path)
        self.system = saved.system
        self.turns = saved.turns
        return saved


def read_conversation(path: Path) -> Conversation:
    """A conversation saved by `ChatSession.save` (or any {"messages": [...]} file)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read it: {paths.why_failed(exc)}") from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path} is not a saved conversation: {exc}") from None
    messages = record.get("messages") if isinstance(record, dict) else None
    if not isinstance(messages, list):
        raise UsageError(f"{path} is not a saved conversation: no 'messages' list")
    system = record.get("system")
    turns: list[Turn] = []
    for i, m in enumerate(messages, 1):
        role = m.get("role") if isinstance(m, dict) else None
        content = m.get("content") if isinstance(m, dict) else None
        if turns and not turns[-1].reply and (role == "tool" or (role == "assistant" and m.get("tool_calls"))):
            turns[-1].steps.append(m)  # a tool loop's call or result, before the turn's reply
            continue
        if not isinstance(content, str) or role not in ("system", "user", "assistant"):
            raise UsageError(f"{path}: message {i} needs a role (system, user, assistant) and text content")
        if role == "system":
            system = content
        elif role == "user":
            turns.append(Turn(content))
        elif turns and not turns[-1].reply:
            turns[-1].reply = content
            turns[-1].interrupted = bool(m.get("interrupted"))
            thinking = m.get("reasoning_content")
            turns[-1].reasoning = thinking if isinstance(thinking, str) else ""
        else:
            raise UsageError(f"{path}: message {i} is a reply with no question before it")
    model = record.get("model") if record.get("format") == SAVE_FORMAT else None
    return Conversation(system if isinstance(system, str) else None, turns, model if isinstance(model, str) else None)
