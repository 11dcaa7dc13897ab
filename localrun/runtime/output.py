"""From sampled tokens to events: text across token boundaries, stop
strings, counts, timing and the final Stats."""

from __future__ import annotations

import codecs
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from localrun.events import DoneEvent, DraftStats, Event, ReasoningEvent, Stats, StopReason, TokenEvent
from localrun.runtime.reasoning import Piece, Reasoning, Splitter, marker_tokens

if TYPE_CHECKING:
    from localrun.runtime.engine import Engine


class StopMatcher:
    """Holds back text that could be the start of a stop string."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Returns (text safe to emit, whether a stop string was reached)."""
        if not self.stops:
            return text, False
        buf = self.pending + text
        cut = min((i for i in (buf.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.pending = ""
            return buf[:cut], True
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), 0, -1):
                if buf.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        self.pending = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold], False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


class TokenOutput:
    """One sequence's way from sampled tokens to events: bytes to text (UTF-8
    across token boundaries), stop strings, counts, timing and the final Stats.
    Every loop (plain, speculative, batched) feeds it the tokens it accepts."""

    def __init__(
        self,
        engine: Engine,
        *,
        n_prompt: int,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        reasoning: Reasoning | None = None,
        preserved: Sequence[str] = (),
    ) -> None:
        self.engine = engine
        self.n_prompt = n_prompt
        self.ignore_eos = ignore_eos
        self.matcher = StopMatcher(stop)
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.n_gen = 0
        self.n_cached = 0
        self.reason: StopReason | None = None
        self.t_start = time.perf_counter()
        self.t_prompt = 0.0
        self.t_first = self.t_last = self.t_start
        self.ttft = 0.0
        self.text_parts: list[str] = []
        self.tokens: list[int] = []  # the generated tokens, end of generation excluded
        # a reasoning model: its thinking goes apart from the answer (text, stop strings and the grammar's check)
        self.splitter: Splitter | None = reasoning.splitter() if reasoning is not None else None
        self.reasoning_parts: list[str] = []
        self.n_reasoning = 0
        # the thinking's markers and ``preserved`` ones (a family's tool-call markers), each one token
        # of this vocabulary: rendered as text even where they are control tokens, which render as nothing
        self.markers: dict[int, bytes] = {}
        for marker in preserved:
            tokens = engine.tokenize(marker, add_special=False)
            if len(tokens) == 1:
                self.markers[tokens[0]] = marker.encode()
        if reasoning is not None:
            for marker in marker_tokens(reasoning.format, lambda t: engine.tokenize(t, add_special=False)):
                (token,) = engine.tokenize(marker, add_special=False)
                self.markers[token] = marker.encode()

    def prompt_done(self, n_cached: int = 0) -> None:
        """The prompt is evaluated (``n_cached`` of its tokens were already in the cache)."""
        self.t_prompt = time.perf_counter() - self.t_start
        self.n_cached = n_cached

    def push(self, token: int, threads: int | None = None) -> TokenEvent | None:
        """Account for one accepted token; sets `reason` when it ends the sequence
        (end of generation or a stop string). Returns the answer's text event,
        if any, saying ``threads`` decode (thinking: see `push_events`)."""
        events = self.push_events(token, threads)
        return next((e for e in events if isinstance(e, TokenEvent)), None)

    def push_events(
        self, token: int, threads: int | None = None, draft: DraftStats | None = None
    ) -> list[TokenEvent | ReasoningEvent]:
        """`push`, with the thinking's events besides the answer's, in order;
        ``draft``: what speculative decoding drafted so far, for the events."""
        now = time.perf_counter()
        if self.n_gen == 0 and self.reason is None:
            self.t_first = now
            self.ttft = now - self.t_start
        self.t_last = now
        if self.engine.is_eog(token) and not self.ignore_eos:
            self.reason = "eos"
            return []
        self.n_gen += 1
        self.tokens.append(token)
        piece = self.markers.get(token)
        text = self.utf8.decode(piece if piece is not None else self.engine.piece(token))
        if self.splitter is None:
            return self._answer(text, threads, draft)
        thinking = self.splitter.thinking
        pieces = self.splitter.feed(text)
        if thinking or self.splitter.thinking:
            self.n_reasoning += 1
        return self._pieces(pieces, threads, draft)

    def _pieces(
        self, pieces: list[Piece], threads: int | None, draft: DraftStats | None = None
    ) -> list[TokenEvent | ReasoningEvent]:
        events: list[TokenEvent | ReasoningEvent] = []
        for kind, text in pieces:
            if kind == "content":
                events.extend(self._answer(text, threads, draft))
            else:
                self.reasoning_parts.append(text)
                events.append(
                    ReasoningEvent(
                        text,
                        self.n_gen,
                        self.n_reasoning,
                        self.ttft,
                        self.t_last - self.t_start,
                        self.decode_rate(),
                        draft=draft,
                        threads=threads,
                    )
                )
        return events

    def _answer(
        self, text: str, threads: int | None, draft: DraftStats | None = None
    ) -> list[TokenEvent | ReasoningEvent]:
        if self.reason == "stop":  # a stop string ended it: nothing after it
            return []
        text, hit = self.matcher.feed(text)
        if hit:
            self.reason = "stop"
        if not text:
            return []
        self.text_parts.append(text)
        elapsed = self.t_last - self.t_start
        return [TokenEvent(text, self.n_gen, self.ttft, elapsed, self.decode_rate(), draft=draft, threads=threads)]

    def decode_rate(self) -> float:
        span = self.t_last - self.t_first
        return (self.n_gen - 1) / span if self.n_gen > 1 and span > 0 else 0.0

    def finish(self, reason: StopReason, **extra: Any) -> Iterator[Event]:
        """The held-back tail (unless a stop string cut it; without the first
        bytes of a character the limit or Ctrl-C cut) and the DoneEvent.
        ``reason`` applies unless `push` already ended the sequence."""
        final: StopReason = self.reason or reason
        if final in ("length", "interrupted"):  # a character cut in two: its first bytes go, not a U+FFFD
            self.utf8.reset()
        if final != "stop":
            rest = self.utf8.decode(b"", final=True)
            if self.splitter is not None:  # what the splitter held: thinking cut off stays thinking
                pieces = self.splitter.feed(rest) + self.splitter.flush()
                rest = "".join(text for kind, text in pieces if kind == "content")
                for kind, text in pieces:
                    if kind == "reasoning":
                        self.reasoning_parts.append(text)
                        yield ReasoningEvent(
                            text, self.n_gen, self.n_reasoning, self.ttft, self.t_last - self.t_start, 0.0
                        )
            tail, hit = self.matcher.feed(rest)
            tail += "" if hit else self.matcher.flush()
            if tail:
                self.text_parts.append(tail)
                yield TokenEvent(tail, self.n_gen, self.ttft, self.t_last - self.t_start, 0.0)
            if hit:
                final = "stop"
        evaluated = self.n_prompt - self.n_cached
        yield DoneEvent(
            Stats(
                prompt_tokens=self.n_prompt,
                generated_tokens=self.n_gen,
                ttft_s=self.ttft,
                decode_tokens_per_s=self.decode_rate(),
                elapsed_s=time.perf_counter() - self.t_start,
                stop_reason=final,
                prompt_tokens_per_s=evaluated / self.t_prompt if evaluated and self.t_prompt > 0 else 0.0,
                cached_tokens=self.n_cached,
                reasoning_tokens=self.n_reasoning,
                **extra,
            )
        )

    @property
    def text(self) -> str:
        """The answer (a reasoning model's thinking is `reasoning`)."""
        return "".join(self.text_parts)

    @property
    def reasoning(self) -> str:
        return "".join(self.reasoning_parts)
