"""Renderers: consume the decode loop's events and show them.

- `LiveRenderer`: a Rich Live panel for a terminal, redrawn at a fixed rate
  (not per token); per token it only appends to a list.
- `PlainRenderer`: the text alone, flushed as it comes (pipes, files).
- `JsonRenderer`: newline-delimited JSON events.
Each returns the final `Stats`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import IO, Protocol

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.text import Text

from localrun.events import DoneEvent, DraftStats, Event, ReasoningEvent, Stats, TokenEvent
from localrun.ui.text import stats_line
from localrun.units import count

# one encoder for every token's line (json.dumps with an option builds one per call)
_encode_text = json.JSONEncoder(ensure_ascii=False).encode


class Renderer(Protocol):
    def render(self, events: Iterable[Event]) -> Stats: ...


def _final(stats: Stats | None) -> Stats:
    if stats is None:  # the loop always ends with a DoneEvent
        raise RuntimeError("event stream ended without a done event")
    return stats


class PlainRenderer:
    """The answer alone, as it comes; with ``show_thinking``, a reasoning
    model's thinking before it, between ``<think>`` and ``</think>`` lines."""

    def __init__(self, out: IO[str], err: IO[str], *, show_stats: bool = False, show_thinking: bool = False) -> None:
        self.out, self.err, self.show_stats, self.show_thinking = out, err, show_stats, show_thinking

    def render(self, events: Iterable[Event]) -> Stats:
        stats: Stats | None = None
        last = ""
        thinking = False  # inside the shown thinking
        for ev in events:
            if isinstance(ev, ReasoningEvent):
                if not self.show_thinking:
                    continue
                self.out.write(ev.text if thinking else "<think>\n" + ev.text)
                thinking = True
            elif isinstance(ev, TokenEvent):
                if thinking:
                    self.out.write("\n</think>\n\n")
                    thinking = False
                self.out.write(ev.text)
                last = ev.text
            else:
                stats = ev.stats
                if thinking:
                    self.out.write("\n</think>\n")
                continue
            self.out.flush()
        if last and not last.endswith("\n"):
            self.out.write("\n")
        self.out.flush()
        final = _final(stats)
        if self.show_stats or final.stop_reason == "interrupted":
            self.err.write(stats_line(final) + "\n")
            self.err.flush()
        return final


class JsonRenderer:
    """One JSON object per line: {"type":"token","text":...} then {"type":"done",...}."""

    DONE_FIELDS = (
        "prompt_tokens",
        "generated_tokens",
        "ttft_s",
        "decode_tokens_per_s",
        "elapsed_s",
        "stop_reason",
        "cached_tokens",  # prompt tokens found in the KV cache (a chat turn, a prompt cache hit)
    )

    def __init__(
        self, out: IO[str], *, extra: dict[str, object] | None = None, settings: dict[str, object] | None = None
    ) -> None:
        self.out = out
        self.extra = extra or {}  # added to every event (chat adds its turn number)
        self.settings = settings  # the run's settings, each with its source: on the done event

    def render(self, events: Iterable[Event]) -> Stats:
        stats: Stats | None = None
        for ev in events:
            if isinstance(ev, TokenEvent | ReasoningEvent):
                kind = "token" if isinstance(ev, TokenEvent) else "reasoning"
                record: dict[str, object] = {"type": kind, "text": ev.text, **self.extra}
                self.out.write(_encode_text(record) + "\n")
            else:
                stats = ev.stats
                record = {"type": "done", **{k: getattr(stats, k) for k in self.DONE_FIELDS}, **self.extra}
                if stats.reasoning_tokens:  # a reasoning model thought: of generated_tokens, these
                    record["reasoning_tokens"] = stats.reasoning_tokens
                if stats.prompt_cache:
                    record["prompt_cache"] = stats.prompt_cache
                if stats.draft is not None:  # speculative decoding ran
                    record["draft"] = stats.draft.as_dict()
                if stats.threads is not None:
                    record["threads"] = stats.threads
                    shares = stats.thread_shares or {}
                    record["thread_shares"] = {str(n): share for n, share in shares.items()}
                if stats.valid is not None:  # structured output: checked against its schema or grammar
                    record["valid"] = stats.valid
                    record["forced_tokens"] = stats.forced_tokens
                    if stats.invalid:
                        record["invalid"] = stats.invalid
                if self.settings is not None:
                    record["settings"] = self.settings
                self.out.write(json.dumps(record) + "\n")
            self.out.flush()
        return _final(stats)


def footer(
    generated: int,
    rate: float,
    ttft: float,
    elapsed: float,
    reason: str | None = None,
    draft: DraftStats | None = None,
    *,
    threads: int | None = None,
    width: int | None = None,
) -> Text:
    """The figures line. Within ``width`` columns whole fields go, least
    important first (the thread count, the speculation figures, shortened
    and then dropped, then time to first token, elapsed time, speed), so what
    remains reads; the token count and the stop reason stay."""
    fields: dict[str, str] = {
        "tokens": count(generated, "token"),
        "rate": f"{rate:.1f} tok/s" if rate else "- tok/s",
        "ttft": f"ttft {ttft:.2f}s" if generated else "ttft -",
        "elapsed": f"{elapsed:.1f}s",
    }
    if threads is not None:
        fields["threads"] = count(threads, "thread")
    if reason:
        fields["stop"] = f"stop: {reason}"
    if draft is not None and draft.proposed:
        fields["draft"] = f"{draft.drafter} {draft.acceptance:.0%} accepted, {draft.mean_accepted:.1f}/step"
    shorter = f"{draft.drafter} {draft.acceptance:.0%}" if draft is not None else ""
    steps = ["threads", "draft-short", "draft", "ttft", "elapsed", "rate"]
    line = "  ·  ".join(fields.values())
    while width is not None and len(line) > width and steps:
        step = steps.pop(0)
        if step == "draft-short":
            if "draft" in fields:
                fields["draft"] = shorter
        else:
            fields.pop(step, None)
        line = "  ·  ".join(fields.values())
    return Text(line, style="dim")


class LiveRenderer:
    """A panel with the streaming text and a live footer of figures.

    The panel is redrawn at most `refresh_per_second` times, from the loop's
    own thread between two tokens, and shows only the tail that fits the
    screen, so a redraw costs the same however long the reply. There is no
    background refresh thread: on a machine whose cores all run llama.cpp's
    compute threads, preempting one of them stalls the others at their
    barrier. When the reply ends, the whole text is printed once in a final
    panel.
    """

    def __init__(
        self, console: Console, *, title: str = "", refresh_per_second: float = 5.0, markdown: bool = False
    ) -> None:
        self.console = console
        self.title = title
        self.markdown = markdown  # the final panel renders the reply as Markdown (unfenced code kept as written)
        self.refresh_per_second = refresh_per_second
        self._chunks: list[str] = []
        self._last: TokenEvent | ReasoningEvent | None = None  # the latest figures
        self._thinking: list[str] = []  # a reasoning model's thinking: a dimmed section above the answer
        self._thought: ReasoningEvent | None = None
        self._t0 = time.perf_counter()

    def _tail(self, text: str | None = None, rows: int | None = None) -> str:
        """The end of the text that fits the screen (or ``rows``), counted in
        the rows Rich wraps it into (whole words, wide characters), so the
        live panel is never taller than the terminal."""
        width = max(self.console.width - 4, 10)
        rows_left = max(self.console.height - 6, 3) if rows is None else rows
        keep: list[str] = []
        for line in reversed(("".join(self._chunks) if text is None else text).split("\n")):
            wrapped = Text(line).wrap(self.console, width)
            if len(wrapped) > rows_left:  # only its last rows fit
                if rows_left > 0:
                    keep.append("\n".join(row.plain for row in wrapped[len(wrapped) - rows_left :]))
                break
            rows_left -= max(1, len(wrapped))
            keep.append(line)
        return "\n".join(reversed(keep))

    def _thinking_head(self, final: Stats | None = None) -> Text:
        n = final.reasoning_tokens if final is not None else self._thought.reasoning_tokens if self._thought else 0
        return Text(f"thinking · {count(n, 'token')}", style="dim italic")

    def _body(self) -> RenderableType:
        """The answer's tail; under a thinking section while a reasoning model thinks (or thought)."""
        if not self._thinking:
            return Text(self._tail())
        rows = max(self.console.height - 6, 3)
        answer = "".join(self._chunks)
        thinking_rows = max(rows // 3, 1) if answer else max(rows - 1, 1)
        parts: list[RenderableType] = [
            self._thinking_head(),
            Text(self._tail("".join(self._thinking), thinking_rows), style="dim"),
        ]
        if answer:
            parts.append(Text(self._tail(answer, max(rows - thinking_rows - 2, 1))))
        return Group(*parts)

    def _footer_room(self) -> int:
        return max(self.console.width - 6, 20)  # the border's corners and the title's padding

    def _panel(self) -> RenderableType:
        ev = self._last
        elapsed = time.perf_counter() - self._t0
        room = self._footer_room()
        foot = (
            footer(
                ev.generated_tokens,
                ev.decode_tokens_per_s,
                ev.ttft_s,
                elapsed,
                draft=ev.draft,
                threads=ev.threads,
                width=room,
            )
            if ev
            else footer(0, 0, 0, elapsed)
        )
        return Panel(self._body(), title=self.title or None, subtitle=foot, subtitle_align="right", border_style="blue")

    def render(self, events: Iterable[Event]) -> Stats:
        stats: Stats | None = None
        self._t0 = time.perf_counter()
        interval = 1.0 / self.refresh_per_second
        next_refresh = self._t0 + interval
        live = Live(
            get_renderable=self._panel,
            console=self.console,
            auto_refresh=False,
            transient=True,
            vertical_overflow="crop",  # never taller than the screen: a scrolled live region leaves stray borders
        )
        try:
            with live:
                for ev in events:
                    if isinstance(ev, TokenEvent | ReasoningEvent):
                        self._last = ev
                        if isinstance(ev, TokenEvent):
                            self._chunks.append(ev.text)
                        else:
                            self._thinking.append(ev.text)
                            self._thought = ev
                        now = time.perf_counter()
                        if now >= next_refresh:
                            live.refresh()
                            next_refresh = now + interval
                    elif isinstance(ev, DoneEvent):
                        stats = ev.stats
        except BaseException:  # a second Ctrl-C, an error: the text shown so far stays on the screen
            if self._chunks or self._thinking:
                self._print_whole()
            raise
        final = _final(stats)
        foot = footer(
            final.generated_tokens,
            final.decode_tokens_per_s,
            final.ttft_s,
            final.elapsed_s,
            final.stop_reason,
            draft=final.draft,
            threads=final.threads,
            width=self._footer_room(),
        )
        self._print_whole(foot, final)
        return final

    def _print_whole(self, foot: Text | None = None, final: Stats | None = None) -> None:
        """The whole text in a panel that stays (the live one is erased), with ``foot`` under it."""
        text = "".join(self._chunks)
        if self.markdown:
            from localrun.ui.markdown import reply_markdown

            body: RenderableType = reply_markdown(text)
        else:
            body = Text(text)
        parts: list[RenderableType] = [body]
        if self._thinking:  # the thinking stays, dimmed, above the answer
            thought = Text("".join(self._thinking), style="dim")
            parts = [self._thinking_head(final), thought, *([Text(""), body] if text else [])]
        self.console.print(
            Panel(Group(*parts), title=self.title or None, subtitle=foot, subtitle_align="right", border_style="blue")
        )
