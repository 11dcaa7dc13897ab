"""Tokens to text: a character cut in two by the end of the run."""

from __future__ import annotations

from typing import cast

import pytest

from localrun.events import DoneEvent, Event, StopReason, TokenEvent
from localrun.runtime.engine import Engine
from localrun.runtime.output import TokenOutput

PIECES = {1: b"caf", 2: b"\xc3", 3: b"\xa9"}  # "café", its é split over two tokens


class Pieces:
    """What TokenOutput asks of an engine: each token's bytes, and which ends generation."""

    def piece(self, token: int) -> bytes:
        return PIECES[token]

    def is_eog(self, token: int) -> bool:
        return token == 0


def text_of(tokens: list[int], reason: StopReason) -> tuple[str, DoneEvent]:
    output = TokenOutput(cast(Engine, Pieces()), n_prompt=1)
    events: list[Event | None] = [output.push(t) for t in tokens]
    events += list(output.finish(reason))
    done = events[-1]
    assert isinstance(done, DoneEvent)
    return "".join(e.text for e in events if isinstance(e, TokenEvent)), done


@pytest.mark.parametrize("reason", ["length", "interrupted"])
def test_a_character_cut_by_the_limit_is_left_out(reason: StopReason) -> None:
    text, done = text_of([1, 2], reason)
    assert text == "caf" and done.stats.stop_reason == reason  # no U+FFFD at the end


def test_a_whole_character_is_kept() -> None:
    assert text_of([1, 2, 3], "length")[0] == "café"
    assert text_of([2, 3, 1], "length")[0] == "écaf"


def test_a_model_that_ends_inside_a_character_shows_it() -> None:
    assert text_of([1, 2, 0], "length")[0] == "caf\ufffd"  # the model's own end: what it wrote, marked


MARKERS = {5: b"", 6: b"get_weather"}  # 5 stands for [TOOL_CALLS], a control token: it renders as nothing


class Marked(Pieces):
    """A vocabulary with a control-token marker, one token of its own."""

    def piece(self, token: int) -> bytes:
        return MARKERS.get(token, PIECES.get(token, b""))

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return [5] if text == "[TOOL_CALLS]" else [9, 9]  # any other marker is several tokens here


@pytest.mark.parametrize(
    ("preserved", "expected"), [((), "get_weather"), (("[TOOL_CALLS]", "<x>"), "[TOOL_CALLS]get_weather")]
)
def test_preserved_markers_are_written_as_text(preserved: tuple[str, ...], expected: str) -> None:
    """A family's tool-call marker reaches the parser as text though it is a
    control token; a marker that is not one token here is left to the text."""
    output = TokenOutput(cast(Engine, Marked()), n_prompt=1, preserved=preserved)
    events = [output.push(t) for t in (5, 6)]
    assert "".join(e.text for e in events if e is not None) == expected
