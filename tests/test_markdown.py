"""Chat's Markdown: code a model left unfenced is shown as written."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from localrun.events import DoneEvent, Event, Stats, TokenEvent
from localrun.ui.markdown import fence_code, reply_markdown
from localrun.ui.stream import LiveRenderer


def shown(text: str) -> list[str]:
    screen = io.StringIO()
    Console(file=screen, width=80, color_system=None).print(reply_markdown(text))
    return [line.strip() for line in screen.getvalue().splitlines()]


def test_unfenced_code_keeps_its_lines_and_comments() -> None:
    reply = "Fix this code:\ndef add(a, b)\n    # the sum\n    return a+b\n\n# try it\nprint(add(1, 2))\n\nIt prints 3."
    assert fence_code(reply) == (
        "Fix this code:\n```\ndef add(a, b)\n    # the sum\n    return a+b\n\n# try it\nprint(add(1, 2))\n```\n\n"
        "It prints 3."
    )
    lines = shown(reply)
    for line in ("Fix this code:", "def add(a, b)", "# the sum", "return a+b", "# try it", "print(add(1, 2))"):
        assert line in lines  # each on its own line: not joined, and `#` not taken for a heading


@pytest.mark.parametrize(
    "text",
    [
        "# Title\n\nSome prose, a sentence.\n\n## Steps\n1. do x\n2. do y\n   more on y\n\n- a\n- b",
        "I think, for example: it works.\nA second line of the same paragraph.",
        "```python\n# fenced\nx = 1\n```\nafter",
        "| a | b |\n|---|---|\n| 1 | 2 |",
        "```\nnever closed\ndef f():\n    pass",
    ],
)
def test_prose_lists_tables_and_fenced_code_are_left_alone(text: str) -> None:
    assert fence_code(text) == text


def events(text: str) -> list[Event]:
    return [TokenEvent(text, 1, 0.1, 0.1, 10.0), DoneEvent(Stats(3, 1, 0.1, 10.0, 0.1, "eos"))]


@pytest.mark.parametrize("markdown", [True, False])
def test_the_final_panel_as_markdown_or_as_written(markdown: bool) -> None:
    screen = io.StringIO()
    console = Console(file=screen, width=80, color_system=None)
    LiveRenderer(console, markdown=markdown).render(events("**bold** text\n\n# Heading"))
    assert ("**bold** text" in screen.getvalue()) != markdown
    assert ("# Heading" in screen.getvalue()) != markdown
