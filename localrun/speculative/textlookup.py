"""Prompt lookup over the text with its whitespace set aside: follows an
answer that copies its input with the spacing changed (reformatted code, a
re-indented block), where token lookup loses its place at every changed space.

Both the source (the prompt) and the answer so far are read as their
non-space characters, each with the whitespace before it: its gap. While the
answer copies the source character for character, gaps aside, every gap the
answer writes is learned against the source's gap at the same place, keyed by
the characters on either side (`SpacingRules`). A draft is the source's
continuation with each gap replaced by the one the rules predict, tokenized
with the model's own tokenizer.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from localrun.runtime.engine import Engine
from localrun.runtime.sampling import SamplingParams
from localrun.speculative.base import LOOKUP_MAX, Draft, Mask, Offer, Profile

BOUNDARY = "\x00"  # stands in the source for a token that renders to nothing; drafts stop there
SYNC_CHARS = 10  # non-space characters that must match the source to take up copying it
DRAFT_CHARS = 4 * LOOKUP_MAX + 16  # characters of source read for one draft: enough for its tokens
# the most new characters read at once: after a long rest (the drafters not asked: speculation did not pay),
# only the last ones are followed, so that the first asking after it costs no more than a few
CATCH_UP_CHARS = 256
# buckets by how many characters have been copied since the text last left the source
_BUCKET_EDGES = (16, 48, 128)
TEXT_PRIOR = (0.3, 0.5, 0.7, 0.8)
_OPERATORS = frozenset("=<>!+-*/%&|^")


def split_gaps(text: str) -> tuple[list[str], list[str], str]:
    """(non-space characters, the whitespace before each, the whitespace after the last)."""
    chars: list[str] = []
    gaps: list[str] = []
    gap: list[str] = []
    for ch in text:
        if ch.isspace():
            gap.append(ch)
        else:
            chars.append(ch)
            gaps.append("".join(gap))
            gap = []
    return chars, gaps, "".join(gap)


def indent_of(gap: str) -> int | None:
    """Width of the indentation a gap ends with, if it starts a line."""
    newline = gap.rfind("\n")
    return None if newline < 0 else len(gap) - newline - 1


def char_class(ch: str) -> str:
    if ch.isalnum() or ch == "_":
        return "w"
    return "o" if ch in _OPERATORS else ch


@dataclass(frozen=True)
class LineBreak:
    """A gap that breaks a source line (``if x: y`` written on two lines):
    ``newlines`` line ends, then the indentation of the line it broke plus ``shift``."""

    newlines: int
    shift: int


Gap = str | LineBreak
_Key = tuple[str, str, str]


@dataclass
class SpacingRules:
    """What the answer writes where the source has a given gap between two
    characters. Looked up from the most specific evidence to the least:
    the last gap written between these two characters; the commonest between
    their classes (word, operator, or the character itself); for a line
    start, the commonest for this indentation, else the indentation scaled
    the commonest way seen; the commonest after this class, or before it
    (seen twice at least; not inside a word or an operator such as ``>=``,
    which the source writes as one); else the source's own gap."""

    latest: dict[_Key, Gap] = field(default_factory=dict)
    votes: dict[object, dict[Gap, int]] = field(default_factory=dict)
    scales: dict[float, int] = field(default_factory=dict)

    def learn(self, before: str, src_gap: str, after: str, out_gap: str, line_indent: int) -> None:
        gap: Gap = out_gap
        out_indent = indent_of(out_gap)
        src_indent = indent_of(src_gap)
        if out_indent is not None and src_indent is None:
            gap = LineBreak(out_gap.count("\n"), out_indent - line_indent)
        self.latest[(before, src_gap, after)] = gap
        b, a = char_class(before), char_class(after)
        keys: list[object] = [(b, src_gap, a), (b, src_gap, "*"), ("*", src_gap, a)]
        if src_indent is not None:
            keys.append(src_gap)
            if out_indent is not None and src_indent:
                scale = out_indent / src_indent
                self.scales[scale] = self.scales.get(scale, 0) + 1
        for key in keys:
            votes = self.votes.setdefault(key, {})
            votes[gap] = votes.get(gap, 0) + 1

    def predict(self, before: str, src_gap: str, after: str, line_indent: int) -> str:
        gap = self.latest.get((before, src_gap, after))
        if gap is None:
            gap = self._voted(before, src_gap, after)
        if isinstance(gap, LineBreak):
            return "\n" * gap.newlines + " " * max(line_indent + gap.shift, 0)
        return src_gap if gap is None else gap

    def _voted(self, before: str, src_gap: str, after: str) -> Gap | None:
        b, a = char_class(before), char_class(after)
        keys: list[tuple[object, int]] = [((b, src_gap, a), 1), (src_gap, 1)]
        if b != a or src_gap:  # a word's characters, or an operator's (>=, **), are not split by analogy
            keys += [((b, src_gap, "*"), 2), (("*", src_gap, a), 2)]
        for key, least in keys:
            votes = self.votes.get(key)
            if votes and sum(votes.values()) >= least:
                return max(votes, key=lambda g: votes[g])
        src_indent = indent_of(src_gap)
        if src_indent is not None and self.scales:
            scale = max(self.scales, key=lambda s: self.scales[s])
            return src_gap[: len(src_gap) - src_indent] + " " * round(src_indent * scale)
        return None


class TextLookupDrafter:
    """Drafts the source's continuation, respaced the way the answer has been
    respacing it. ``piece`` gives a token's bytes and ``tokenize`` tokenizes
    text without special tokens: the target's own (see `for_engine`)."""

    def __init__(self, piece: Callable[[int], bytes], tokenize: Callable[[str], list[int]]) -> None:
        self.piece = piece
        self.tokenize = tokenize
        self.profile = Profile(
            name="text-lookup", step_cost=0.0, catch_up_cost=0.0, setup_s=0.0, acceptance=TEXT_PRIOR, free=True
        )
        self.begin(())

    @classmethod
    def for_engine(cls, engine: Engine) -> TextLookupDrafter:
        return cls(engine.piece, lambda text: engine.tokenize(text, add_special=False, parse_special=False))

    def begin(self, context: Sequence[int]) -> None:
        # a token that renders to nothing (a control token: a message's end) ends a stretch of source
        text = b"".join(self.piece(t) or BOUNDARY.encode() for t in context).decode("utf-8", errors="replace")
        chars, self.src_gaps, _ = split_gaps(text)
        self.src = "".join(chars)
        self.n_prompt = self.n_read = len(context)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.out: list[str] = []  # the answer's non-space characters
        self.out_gaps: list[str] = []
        self.out_indent: list[int] = []  # the indentation of each one's line
        self.trail = ""  # whitespace after the last
        self.rules = SpacingRules()
        self.pos = -1  # where in the source the next character is expected; -1: not copying
        self.run = 0  # characters copied since the text last left the source
        self.last = 0  # where the source was last followed to

    def _read(self, context: Sequence[int]) -> None:
        if len(context) < self.n_read:  # another text: start over from its prompt
            self.begin(context[: min(self.n_prompt, len(context))])
        new = self._utf8.decode(b"".join(self.piece(t) for t in context[self.n_read :]))
        self.n_read = len(context)
        if len(new) > CATCH_UP_CHARS:  # a long rest: the text is taken up again from its last characters
            new = new[-CATCH_UP_CHARS:]
            self.pos, self.run, self.trail = -1, 0, ""
        for ch in new:
            if ch.isspace():
                self.trail += ch
            else:
                self._push(ch)

    def _push(self, ch: str) -> None:
        gap, self.trail = self.trail, ""
        indent = indent_of(gap)
        line_indent = self.out_indent[-1] if self.out_indent else 0
        self.out.append(ch)
        self.out_gaps.append(gap)
        self.out_indent.append(line_indent if indent is None else indent)
        pos = self.pos
        if 0 <= pos < len(self.src) and self.src[pos] == ch:
            if self.run and pos:
                self.rules.learn(self.src[pos - 1], self.src_gaps[pos], ch, gap, line_indent)
            self.pos, self.run, self.last = pos + 1, self.run + 1, pos + 1
        else:
            self.pos, self.run = -1, 0
            if len(self.out) >= SYNC_CHARS:
                self._resync()

    def _resync(self) -> None:
        """Find the last few characters in the source: the first place at or
        past where it was last followed, else the last place before."""
        tail = "".join(self.out[-SYNC_CHARS:])
        start = max(self.last - SYNC_CHARS, 0)
        found = self.src.find(tail, start)
        if found < 0:  # before it: what the search from there did not see
            found = self.src.rfind(tail, 0, start + SYNC_CHARS - 1)
        if found >= 0:
            self.pos = self.last = found + SYNC_CHARS
            self.run = SYNC_CHARS

    def offer(self, context: Sequence[int], index: int) -> Offer | None:
        self._read(context)
        if self.run < SYNC_CHARS or not 0 < self.pos < len(self.src) or self.src[self.pos] == BOUNDARY:
            return None
        bucket = sum(1 for edge in _BUCKET_EDGES if self.run >= edge)
        return Offer(index, bucket, LOOKUP_MAX)

    def continuation(self, chars: int) -> tuple[tuple[str, ...], str]:
        """The source's next ``chars`` characters (up to a boundary), respaced:
        the whitespace to write first (some choices, when the answer has
        already written other whitespace than the rules predict), and the rest."""
        src, gaps, rules, pos = self.src, self.src_gaps, self.rules, self.pos
        indent = self.out_indent[-1] if self.out_indent else 0
        first = rules.predict(src[pos - 1], gaps[pos], src[pos], indent)
        leads = (first[len(self.trail) :],) if first.startswith(self.trail) else ("", " ")
        if (new_indent := indent_of(self.trail + leads[0])) is not None:
            indent = new_indent
        parts = [src[pos]]
        for k in range(pos + 1, min(pos + chars, len(src))):
            if src[k] == BOUNDARY:
                break
            gap = rules.predict(src[k - 1], gaps[k], src[k], indent)
            if (new_indent := indent_of(gap)) is not None:
                indent = new_indent
            parts.append(gap)
            parts.append(src[k])
        return leads, "".join(parts)

    def draft(
        self,
        context: Sequence[int],
        n: int,
        sampling: SamplingParams,
        rng: np.random.Generator,
        mask: Mask | None = None,
    ) -> Draft:
        t0 = time.perf_counter()
        leads, rest = self.continuation(DRAFT_CHARS)
        last = self.piece(context[-1])
        # tokenized after the last token's text, so that the first new token splits where the model's would:
        # the first lead with which the last token comes out whole (a space before a word or a digit
        # goes with it or not, as the tokenizer has it)
        for lead in leads:
            tokens = self.tokenize(last.decode("utf-8", errors="ignore") + lead + rest)
            if tokens and self.piece(tokens[0]) == last:
                return Draft(tokens[1 : n + 1], steps_s=time.perf_counter() - t0)
        tokens = self.tokenize(leads[0] + rest)
        return Draft(tokens[:n], steps_s=time.perf_counter() - t0)

    def close(self) -> None:
        pass
