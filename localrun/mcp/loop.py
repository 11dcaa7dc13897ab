"""The tool loop of one chat turn (or one `generate`): the model is offered
the tools in its own format, its calls are constrained by the grammar serve
uses (a call names a declared tool and its arguments follow that tool's
input schema) and read back by the same parser; each call runs if the user
allows it, and its result goes back as the tool's message; until the model
answers without a call, or the step limit is reached (the last step is then
offered no tools: it answers from what it has).

A small model given its tools' results often calls the same tool again
rather than answering (measured: Qwen2.5-Coder 1.5B greedy, ten of ten;
sampled, it calls it with the result as the argument). So a tool runs once
a turn (several calls of it in one step run, each): a later step's call of
it is dropped, and a step left with no call is generated again with no tool
to call, so the model answers from the results it has. Calls of other tools
go on, step after step (a result that leads to another tool).

Events: the reply's text with the calls' text held back (`ToolStream`), a
`ToolStepDone` for each step that ended in calls, a `ToolCallEvent` and a
`ToolResultEvent` for each call, and one `DoneEvent` for the whole reply,
its figures summed over the steps.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

from localrun.events import (
    DoneEvent,
    Event,
    ReasoningEvent,
    Stats,
    TokenEvent,
    ToolCallEvent,
    ToolEvent,
    ToolResultEvent,
    ToolStepDone,
)

if TYPE_CHECKING:
    from localrun.mcp.host import Tool, ToolResult
    from localrun.runtime.chat import ChatSession, TurnPlan
    from localrun.serve.tools import ToolUse
    from localrun.structured.spec import OutputSpec
    from localrun.structured.toolcalls.calls import Call

MAX_STEPS = 8
MAX_CALLS = 8  # in one step
CHOICES = ("auto", "required", "none")  # a turn's tool choice, as OpenAI's tool_choice; or a tool's name
HELD_LIMIT = 16_000  # characters held back as a call that has not ended: the step ends there
TOOL_TIMEOUT = 60.0
Answer = Literal["yes", "no", "always"]


def asks_for_a_call(choice: str | None) -> bool:
    """Whether a tool choice (None: none given) makes the model call: required, or a tool's name."""
    return choice not in (None, "auto", "none")


class Tools(Protocol):
    """What the loop needs of the servers (`ToolHost`)."""

    @property
    def tools(self) -> list[Tool]: ...

    def call(self, name: str, arguments: dict[str, Any], timeout: float) -> ToolResult: ...


@dataclass
class Approval:
    """Which calls run: those of tools allowed (``allowed``: their names, or
    "all"), else what ``ask`` answers (a terminal's prompt); with no ``ask``
    (a pipe), nothing else runs. "always" allows that tool for the session."""

    allowed: set[str] = field(default_factory=set)
    ask: Callable[[Tool, dict[str, Any]], Answer] | None = None

    def allows(self, tool: Tool, arguments: dict[str, Any]) -> bool:
        if "all" in self.allowed or tool.name in self.allowed:
            return True
        if self.ask is None:
            return False
        answer = self.ask(tool, arguments)
        if answer == "always":
            self.allowed.add(tool.name)
        return answer in ("yes", "always")


def allowed_names(given: list[str], tools: list[Tool], preallowed: set[str]) -> tuple[set[str], list[str]]:
    """``--allow-tool`` values as tool names: "all", a tool (`server_tool`), or
    a server (every tool of it); and the values that name nothing (to warn of)."""
    allowed = set(preallowed)
    unknown = []
    for name in given:
        if name == "all":
            allowed.add("all")
            continue
        matched = {t.name for t in tools if name in (t.name, t.server)}
        if not matched:
            unknown.append(name)
        allowed |= matched
    return allowed, unknown


def merged(steps: list[Stats]) -> Stats:
    """One reply's figures over its steps: tokens and times summed, the rate
    over every step's decoding, the prompt and stop reason of the last."""
    last = steps[-1]
    generated = sum(s.generated_tokens for s in steps)
    seconds = sum(max(s.generated_tokens - 1, 0) / s.decode_tokens_per_s for s in steps if s.decode_tokens_per_s)
    decoded = sum(max(s.generated_tokens - 1, 0) for s in steps if s.decode_tokens_per_s)
    return replace(
        last,
        generated_tokens=generated,
        ttft_s=steps[0].ttft_s,
        elapsed_s=sum(s.elapsed_s for s in steps),
        decode_tokens_per_s=decoded / seconds if seconds else last.decode_tokens_per_s,
        reasoning_tokens=sum(s.reasoning_tokens for s in steps),
        valid=None,  # the steps' grammars are the loop's own, not a schema the user gave
        invalid=None,
        forced_tokens=None,
    )


def _stopped(done: Stats) -> bool:
    return done.stop_reason == "interrupted"


def _key(call: Call) -> tuple[str, str]:
    return call.name, json.dumps(call.arguments, sort_keys=True, ensure_ascii=False)


def _runaway(written: list[tuple[str, str]], new: list[tuple[str, str]], offering: bool) -> bool:
    """Whether a step should end now that ``new`` calls are whole: a small
    model may go on writing calls (the same one again) until its context is
    full. It ends at a call written twice, at MAX_CALLS, and, where no tool
    is offered, at the first call (it is no answer)."""
    repeated = any(call in written for call in new)
    written.extend(new)
    return not offering or repeated or len(written) >= MAX_CALLS


def _with_calls(messages: list[Any]) -> list[Any]:
    """The messages with each tool result said with the call it answers
    (``name(arg="value") returned: RESULT``), for the prompt only: given a
    bare result, a small model often leaves out a value it does not see
    the point of (measured: Qwen2.5-Coder 1.5B, results like ``K-12 in
    storage room 4``, the code kept in 12 of 24 answers bare, 16 of 24 so)."""
    from localrun.serve.tools import call_arguments

    calls: dict[str, str] = {}
    out: list[Any] = []
    for m in messages:
        for c in m.get("tool_calls") or []:
            function = c["function"]
            arguments = call_arguments(function["arguments"])
            if isinstance(arguments, dict):
                said = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in arguments.items())
            else:
                said = str(function["arguments"])
            calls[c["id"]] = f"{function['name']}({said})"
        said_call = calls.get(m.get("tool_call_id", "")) if m["role"] == "tool" else None
        out.append(m if said_call is None else m | {"content": f"{said_call} returned: {m['content']}"})
    return out


def checked_choice(choice: str, tools: list[Tool], where: str = "--tool-choice") -> str:
    """A tool choice as the user gave it (``where``: `--tool-choice`, `/tools
    CHOICE`, a JSONL turn's ``tool_choice``): auto, required, none or a
    tool's name (`server_tool`), else a UsageError."""
    from localrun.errors import UsageError

    if choice in CHOICES or any(t.name == choice for t in tools):
        return choice
    raise UsageError(
        f"{where}: {choice!r} is not auto, required, none or a tool's name",
        hint="`localrun tools --mcp FILE` lists the tools' names",
    )


class ToolLoop:
    """Tools for a `ChatSession`: set up once, then `turn` for each planned turn.

    ``choice`` is how each turn's first step is offered the tools, as
    OpenAI's ``tool_choice``: ``auto`` (the model decides), ``required``
    (it must call one), a tool's name (it must call that one), or ``none``
    (no tool). After a call's result the turn goes on as ``auto``: the
    model may answer. A small model that has answered without a tool in
    earlier turns of a chat often answers from guesses later on (measured:
    Qwen2.5-Coder 1.5B, docs/tools.md); ``required`` for that turn makes
    it call."""

    def __init__(
        self,
        session: ChatSession,
        tools: Tools,
        approval: Approval,
        *,
        max_steps: int = MAX_STEPS,
        timeout: float = TOOL_TIMEOUT,
        parallel: bool = True,
        choice: str = "auto",
    ) -> None:
        self.host = tools
        self.choice = checked_choice(choice, tools.tools)  # the session's (a turn may ask for another: `offer`)
        self.approval = approval
        self.max_steps = max_steps
        self.timeout = timeout
        self.parallel = parallel
        self.problems: list[str] = []  # calls the model wrote that could not be read or checked (left as text)
        self.calls = 0  # calls made (checked against their schemas), over the session
        self.bind(session)

    def bind(self, session: ChatSession) -> None:
        """Offer the tools in ``session`` (its template's own way); a session bound already keeps them."""
        from localrun.serve.tools import tool_use

        if getattr(self, "session", None) is session:
            return
        self.session = session
        declared = [t.declared() for t in self.host.tools]
        use = tool_use(declared, "auto", self.parallel, session.template)
        assert use is not None
        self.use: ToolUse = replace(use, warn=self.problems.append)
        self.off: ToolUse = replace(self.use, choice=None)  # the same conversation, no call possible
        self.off_quiet: ToolUse = replace(self.use, warn=None)
        self._uses: dict[str, ToolUse] = {"auto": self.use, "none": self.off}  # by choice
        self._grammars: dict[tuple[str, tuple[str, ...]], OutputSpec] = {}  # by choice and the tools it may call
        self._answer: OutputSpec | None = None
        self.current = self.use_for(self.choice)
        session.prompt_tools = self._prompt

    def use_for(self, choice: str) -> ToolUse:
        """The tools as offered for ``choice`` (`checked_choice`'s)."""
        from localrun.serve.tools import tool_use

        if choice not in self._uses:
            asked = choice if choice in CHOICES else {"type": "function", "function": {"name": choice}}
            use = tool_use(self.use.declared, asked, self.parallel, self.session.template)
            assert use is not None
            self._uses[choice] = replace(use, warn=self.problems.append)
        return self._uses[choice]

    def offer(self, choice: str | None = None, where: str = "tool_choice") -> None:
        """The next turn's tool choice: ``choice`` for that turn alone (given at ``where``), or the session's."""
        self.current = self.use_for(self.choice if choice is None else checked_choice(choice, self.tools, where))

    @property
    def tools(self) -> list[Tool]:
        return self.host.tools

    def _prompt(self, messages: list[Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        from localrun.serve.tools import conversation

        use = self.current
        offered = use.declared if use.native and use.choice is not None else None
        return conversation(_with_calls(messages), use), offered

    def grammar(self) -> OutputSpec | None:
        """The current step's calls' constraint (built once for each choice):
        None where the family's calls are read, not constrained."""
        use = self.current
        fmt = use.family.grammar
        if fmt is None or use.choice is None:
            return None
        key = (use.choice, tuple(f.name for f in use.functions))
        if key not in self._grammars:
            from localrun.structured.tools import tool_grammar

            engine = self.session.engine
            self._grammars[key] = tool_grammar(engine, use.functions, fmt, use.choice, parallel=use.parallel)
        return self._grammars[key]

    def answer_grammar(self) -> OutputSpec:
        """A step with no tool offered: an answer, not a call. A small model that
        has seen calls writes one again (no tool in its prompt or not): the
        answer may not begin the way a call does (a marker, an object, a
        fence), nor be empty."""
        if self._answer is None:
            import llguidance

            from localrun.structured.spec import OutputSpec

            grammar = llguidance.LLMatcher.grammar_from_lark("start: ANSWER\nANSWER: /[^\\s<{`](.|\\n)*/")
            self._answer = OutputSpec("grammar", grammar, None, "an answer")
        return self._answer

    def plan(self, user: str, choice: str | None = None) -> TurnPlan:
        """A new turn's prompt, tools offered as ``choice`` asks (None: the session's choice)."""
        self.offer(choice)
        return self.session.plan(user)

    def turn(self, plan: TurnPlan) -> Iterator[Event | ToolEvent]:
        """The reply to the turn just planned (`plan`), calls and all."""
        session = self.session
        turn = session.turns[-1]
        made: set[str] = set()  # the tools called in this turn
        steps: list[Stats] = []
        rounds = 0
        interrupted = False
        try:
            while True:
                offering = self.current.choice is not None
                done, content, calls = yield from self._generate(plan, offering)
                steps.append(done)
                if offering and not calls and not content.strip() and turn.steps and not _stopped(done):
                    self.current = self.off  # no answer after the results: one, from them, with no tool
                    plan = session.replan()
                    continue
                if _stopped(done) or not offering or not calls:
                    turn.reply = content  # what was shown: no call's text
                    break
                turn.reply = ""
                fresh = [c for c in calls if c.name not in made]
                if fresh:
                    rounds += 1
                    yield ToolStepDone(done)
                    interrupted = yield from self._run_calls(content, fresh, made)
                    if interrupted:
                        break
                    if self.current.choice == "required":  # called as asked: the model may answer now
                        self.current = self.use
                if not fresh or rounds >= self.max_steps:  # the same tools again, or enough: answer now
                    self.current = self.off
                plan = session.replan()
        finally:
            self.current = self.use_for(self.choice)
        final = merged(steps)
        if interrupted:
            final = replace(final, stop_reason="interrupted")
        turn.stats = final
        session.totals.turns -= len(steps) - 1  # the session counted each step as a turn
        yield DoneEvent(final)

    def _generate(self, plan: TurnPlan, offering: bool) -> Generator[Event, None, tuple[Stats, str, list[Call]]]:
        """One step: the text with the calls' text held back (it is never shown,
        whether the calls run or not); (its figures, its text that is no call, its calls)."""
        from localrun.serve.tools import ToolStream
        from localrun.structured.toolcalls.split import parse_calls

        held = ToolStream(self.use if offering else self.off_quiet)  # no tool offered: what looks like a call is text
        last: TokenEvent | None = None
        done: Stats | None = None
        written: list[tuple[str, str]] = []  # the calls whole so far
        shown = ""
        cut = overflow = False
        engine = self.session.engine
        # no tool offered: after calls, an answer (`answer_grammar`); where the user chose none, the reply as it comes
        answer = self.answer_grammar() if self.session.turns[-1].steps else None
        for event in self.session.reply(plan, self.grammar() if offering else answer):
            if isinstance(event, TokenEvent):
                content, deltas = held.feed(event.text)
                last = event
                if content:
                    shown += content
                    yield replace(event, text=content)
                if deltas and not cut and _runaway(written, [(d.name, d.arguments) for d in deltas], offering):
                    cut = engine.abort_requested = True  # the step ends at the next token
                elif not cut and len(held.text) - len(shown) > HELD_LIMIT:  # a call that does not end
                    cut = overflow = engine.abort_requested = True
            elif isinstance(event, ReasoningEvent):
                yield event
            else:
                done = event.stats
        assert done is not None
        if cut:  # ended here, not by Ctrl-C
            engine.abort_requested = self.session.turns[-1].interrupted = False
            done = replace(done, stop_reason="stop")
        tail, _, calls = held.finish()
        if overflow or done.stop_reason == "length":  # what is held back is a call cut short: no text to show
            return done, shown, list({_key(c): c for c in calls}.values())
        if tail and last is not None:
            yield replace(last, text=tail)
        content, _ = parse_calls(held.text, self.use.family, self.use.functions)
        once = {_key(c): c for c in calls}  # the same call written twice runs once
        return done, content, list(once.values())

    def _run_calls(self, content: str, calls: list[Call], made: set[str]) -> Generator[ToolEvent, None, bool]:
        """Each call, run if allowed, and its result, kept in the turn; True when Ctrl-C stopped them."""
        from localrun.serve.tools import call_objects, new_id

        turn = self.session.turns[-1]
        ids = ["call_" + new_id() for _ in calls]
        message: dict[str, Any] = {"role": "assistant", "content": content}
        message["tool_calls"] = [c | {"id": i} for c, i in zip(call_objects(calls), ids, strict=True)]
        if turn.reasoning:  # the thinking that led to the calls goes with them
            message["reasoning_content"], turn.reasoning = turn.reasoning, ""
        turn.steps.append(message)
        for call, call_id in zip(calls, ids, strict=True):
            made.add(call.name)
            self.calls += 1
            yield ToolCallEvent(call_id, call.name, call.arguments)
            result = self._run(call.name, call.arguments)
            turn.steps.append({"role": "tool", "tool_call_id": call_id, "name": call.name, "content": result.text})
            yield ToolResultEvent(call_id, call.name, result.text, result.status, result.seconds)
            if self.session.engine.abort_requested:  # Ctrl-C while a tool ran
                return True
        return False

    def _run(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        from localrun.mcp.host import ToolResult

        tool = next((t for t in self.host.tools if t.name == name), None)
        if tool is None:
            return ToolResult(f"error: no tool is named {name}", "error")
        if not self.approval.allows(tool, arguments):
            return ToolResult(f"the user did not allow {name} to run", "refused")
        return self.host.call(name, arguments, self.timeout)
