"""Tables laid out for the width they are drawn at: the columns that name a
thing (an ID, a model, a technique) are never cut, long text (a prompt, a
source, a note) wraps into what is left, and when even that does not fit,
the columns that matter least are left out, whole."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, JustifyMethod, RenderResult


@dataclass(frozen=True)
class Column:
    header: str
    justify: JustifyMethod = "left"
    wrap: int = 0  # long text: it wraps, given at least this many cells; 0: never wraps nor is cut
    drop: int = 0  # when the width is short, the highest goes first; 0: always shown
    one_line: bool = False  # a wrapping column whose text is cut with an ellipsis instead (a snippet)


class FitTable:
    """Rows of text under `Column`s, built into a Rich table (``options``: its
    own, e.g. box, title) once the width it is drawn at is known."""

    def __init__(self, columns: Sequence[Column], **options: Any) -> None:
        self.columns = list(columns)
        self.options = options
        self.rows: list[tuple[Sequence[str], str | None]] = []

    def add_row(self, *cells: str, style: str | None = None) -> None:
        self.rows.append((cells, style))

    def _cells(self, index: int) -> int:
        """The width the column asks for: all of it, or a wrapping column's least."""
        column = self.columns[index]
        widest = max([cell_len(column.header), *(cell_len(cells[index]) for cells, _ in self.rows)])
        return min(widest, column.wrap) if column.wrap else widest

    def _width(self, kept: Sequence[int]) -> int:
        """The least width the table takes with the ``kept`` columns: their cells, padding and rules."""
        n = len(kept)
        pad_edge = self.options.get("pad_edge", True)
        padding = 2 * n - (0 if pad_edge else 2)
        rules = 0
        if self.options.get("box", True) is not None:  # Rich's default box: rules between and around columns
            rules = (n - 1) + (2 if self.options.get("show_edge", True) else 0)
        return sum(self._cells(i) for i in kept) + padding + rules

    def fitted(self, width: int) -> Table:
        """The Rich table for ``width`` cells."""
        kept = list(range(len(self.columns)))
        for index in sorted((i for i, c in enumerate(self.columns) if c.drop), key=lambda i: -self.columns[i].drop):
            if self._width(kept) <= width:
                break
            kept.remove(index)
        table = Table(**self.options)
        for i in kept:
            column = self.columns[i]
            table.add_column(
                column.header,
                justify=column.justify,
                no_wrap=not column.wrap,
                overflow="fold" if column.wrap else "ellipsis",
            )
        for cells, style in self.rows:  # text, not markup: a prompt may hold "[b]"
            table.add_row(*(self._text(i, cells[i]) for i in kept), style=style)
        return table

    def _text(self, index: int, cell: str) -> Text:
        if self.columns[index].one_line:
            return Text(cell, no_wrap=True, overflow="ellipsis")
        return Text(cell)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.fitted(options.max_width)
