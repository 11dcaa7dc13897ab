"""Plain decoding, and what every single-sequence decode loop shares.

Per token, Python does one sample (greedy: an argmax over a numpy view of the
logits; else llama.cpp's chain), one native decode, a cached piece lookup and
the stop-string check: no logits copies. Each single-token step is timed
for the thread governor (localrun.runtime.threads), which may change the
engine's thread count between steps.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, Unpack

from localrun.events import Event, ReasoningEvent, StopReason, TokenEvent
from localrun.runtime.decoder import Decoder, StoredPrefix
from localrun.runtime.llama import DecodeStatus
from localrun.runtime.output import TokenOutput
from localrun.runtime.reasoning import AnswerGuard, Reasoning
from localrun.runtime.sampling import Sampler, SamplingParams
from localrun.runtime.threads import ThreadMeter

if TYPE_CHECKING:
    from localrun.runtime.engine import Engine
    from localrun.structured.constraint import Constraint


class GenerateOptions(TypedDict, total=False):
    """The options of every decode loop (see `Generation`)."""

    max_tokens: int | None
    stop: Sequence[str]
    ignore_eos: bool
    decoder: Decoder | None
    checkpoint: StoredPrefix | None
    marks: Sequence[int]
    constraint: Constraint | None
    reasoning: Reasoning | None


class Generation:
    """One generation's parts and its end: the decoder, the sampler, the
    output, how many tokens it may produce, why it stopped, and the thread
    governor's meter. Use it as a context manager: the native sampler is
    freed on leaving."""

    def __init__(
        self,
        engine: Engine,
        prompt_tokens: Sequence[int],
        sampling: SamplingParams,
        *,
        max_tokens: int | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        decoder: Decoder | None = None,
        checkpoint: StoredPrefix | None = None,
        marks: Sequence[int] = (),
        constraint: Constraint | None = None,
        reasoning: Reasoning | None = None,
        sample_on_device: bool = False,
    ) -> None:
        engine.check_fits(len(prompt_tokens))
        # the grammar applies to the answer: after the thinking, where there is one
        self.guard = AnswerGuard(constraint, reasoning, lambda t: engine.tokenize(t, add_special=False))
        self.engine = engine
        self.prompt_tokens = prompt_tokens
        self.checkpoint = checkpoint
        self.marks = marks  # where a later prompt is expected to start again (a chat's history): see Decoder.prefill
        self.decoder = decoder or Decoder(engine)
        self.sampler = Sampler(sampling, engine.n_vocab, engine if sample_on_device and not self.guard.masks else None)
        self.out = TokenOutput(
            engine, n_prompt=len(prompt_tokens), stop=stop, ignore_eos=ignore_eos, reasoning=reasoning
        )
        limit = engine.n_ctx - len(prompt_tokens)
        self.limit = min(limit, max_tokens) if max_tokens is not None else limit
        self.reason: StopReason = "length"
        self.meter = ThreadMeter(engine)

    def prefill(self) -> DecodeStatus:
        """Evaluate what the KV cache lacks of the prompt (nothing when no token may follow)."""
        status = DecodeStatus.OK
        if self.limit > 0:
            status, cached = self.decoder.prefill(self.prompt_tokens, self.checkpoint, self.marks)
            self.out.prompt_done(cached)
        return self.note(status)

    @property
    def constraint(self) -> Constraint | None:
        """The grammar, once it applies: from the answer's first token on."""
        return self.guard.constraint

    def sample(self, row: int = -1) -> int:
        """The next token from ``row`` of the last batch: masked first to what
        may come (`AnswerGuard`), which then follows the token."""
        if not self.guard.masks:
            return self.decoder.sample(self.sampler, row)
        self.guard.mask(self.decoder.logits(row))
        token = self.decoder.sample(self.sampler, row)
        self.guard.accepted(token)
        return token

    def emit(self, tokens: Sequence[int]) -> Iterator[Event]:
        """Put ``tokens`` in the output, with their text events, until it ends."""
        for token in tokens:
            yield from self.out.push_events(token, self.threads)
            if self.ended():
                return

    def fast_forward(self) -> list[int]:
        """The tokens that must follow, where the grammar leaves exactly one way
        on (jump-forward); at most as many as the output may still take."""
        grammar = self.constraint
        if grammar is None:
            return []
        return grammar.fast_forward(self.limit - self.out.n_gen)

    def step(self, tokens: Sequence[int]) -> DecodeStatus:
        """Evaluate decided tokens (one, or one and those the grammar forced
        after it) in one batch; a single-token step is timed for the thread governor."""
        if len(tokens) != 1:
            return self.note(self.decoder.evaluate(tokens))
        return self.note(self.meter.timed(lambda: self.decoder.evaluate(tokens)))

    @property
    def threads(self) -> int:
        """The CPU threads decoding (the settled count; a probe of one window is not reported)."""
        return self.meter.threads

    def note(self, status: DecodeStatus) -> DecodeStatus:
        """A failed decode ends the generation: interrupted, or length (the context is full)."""
        if status == DecodeStatus.ABORTED:
            self.reason = "interrupted"
        return status

    def ended(self) -> bool:
        """The output reached its end (end of generation, a stop string) or the token limit."""
        return self.out.reason is not None or self.out.n_gen >= self.limit

    def finish(self, **extra: Any) -> Iterator[Event]:
        outcome = self.checkpoint.outcome if self.checkpoint is not None else None
        self.meter.finish()
        threads = self.threads
        shares = self.meter.shares or None
        for event in self.out.finish(self.reason, prompt_cache=outcome, threads=threads, thread_shares=shares, **extra):
            if isinstance(event, TokenEvent | ReasoningEvent):
                yield replace(event, threads=threads)
            elif (grammar := self.guard.grammar) is not None:  # the whole answer is known now: check it
                checked = grammar.check(self.out.text)
                stats = replace(event.stats, valid=checked.valid, invalid=checked.error)
                yield replace(event, stats=replace(stats, forced_tokens=grammar.forced))
            else:
                yield event

    def __enter__(self) -> Generation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.meter.finish()
        self.sampler.close()


def generate(
    engine: Engine, prompt_tokens: Sequence[int], sampling: SamplingParams, **options: Unpack[GenerateOptions]
) -> Iterator[Event]:
    """Evaluate the prompt, then sample until end of generation, ``max_tokens``,
    a stop string, a full context, or ``engine.abort_requested``.

    With a ``decoder`` that ran before (a chat, a loaded prompt cache), only the
    part of the prompt that differs from what its KV cache holds is evaluated;
    a ``checkpoint`` restores (or stores) a prefix from a prompt cache."""
    on_device = engine.config.sample_on == "device"  # nothing else reads this generation's logits
    with Generation(engine, prompt_tokens, sampling, sample_on_device=on_device, **options) as run:
        status = run.prefill()
        decided = run.fast_forward() if status == DecodeStatus.OK else []  # a text the grammar starts with
        yield from run.emit(decided)
        while status == DecodeStatus.OK and not run.ended():
            if decided:  # one batch: the sampled token and those the grammar forced after it
                status = run.step(decided)
                if status != DecodeStatus.OK:
                    break
            if engine.abort_requested:
                run.reason = "interrupted"
                break
            token = run.sample()
            yield from run.emit((token,))
            if run.ended():
                break
            forced = run.fast_forward()  # tokens the grammar leaves no choice about: no sampling step for them
            if forced:
                yield from run.emit(forced)
                decided = [token, *forced]
            else:
                decided = [token]
        yield from run.finish()


@contextmanager
def finished(events: Iterator[Event]) -> Iterator[Iterator[Event]]:
    """``events``, closed on the way out. A generation its reader left
    midway (a closed pipe, a second Ctrl-C) then ends while its engine is
    open; left to the garbage collector, it would end after the engine was
    freed, and its cleanup would call llama.cpp on a freed context."""
    try:
        yield events
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()


class Decoding(Protocol):
    """A way to decode: plain (`PLAIN`) or speculative (`localrun.speculative.Speculation`).
    A caller chooses one and calls its `generate`."""

    @property
    def label(self) -> str: ...

    def generate(
        self, engine: Engine, prompt_tokens: Sequence[int], sampling: SamplingParams, **options: Unpack[GenerateOptions]
    ) -> Iterator[Event]: ...


class PlainDecoding:
    """One token per step: `generate`."""

    label = "plain"

    def generate(
        self, engine: Engine, prompt_tokens: Sequence[int], sampling: SamplingParams, **options: Unpack[GenerateOptions]
    ) -> Iterator[Event]:
        return generate(engine, prompt_tokens, sampling, **options)


PLAIN: Decoding = PlainDecoding()
