"""What localrun knows of one chat-format family: how its template is
recognised, how a conversation is prepared for it, how it marks its
thinking, and how it writes tool calls."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localrun.chatformat import messages
from localrun.chatformat.thinking import TAGGED, ReasoningFormat
from localrun.structured.toolcalls.families import HERMES_FAMILY, Family

Json = dict[str, Any]


@dataclass(frozen=True)
class ChatFormat:
    """One family. A template is of it when it holds every text of
    ``present`` and none of ``absent``. ``prepare`` changes the
    conversation (in llama.cpp's shape) before rendering, ``finish`` the
    rendered prompt; ``trims`` strips every content first, ``keeps_developer``
    leaves the ``developer`` role as it is. ``thinks``: the reasoning markers
    its templates may write, the first one the template's text shows being
    its own (``reasoning``, once `of` has matched a template). ``tools``: how
    its calls are written, read and constrained; ``own_tools`` False where
    the family has no syntax of its own and its calls are read as Hermes' are."""

    name: str
    present: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    tools: Family = HERMES_FAMILY
    own_tools: bool = True
    thinks: tuple[ReasoningFormat, ...] = TAGGED
    reasoning: ReasoningFormat | None = None
    prepare: Callable[[list[Json], str], list[Json]] = messages.unchanged
    finish: Callable[[str, bool], str] = messages.as_rendered
    trims: bool = False
    keeps_developer: bool = False
    nested_arguments: bool = True  # its template writes an argument that is an object or a list
    note: str = ""  # the models it is, for the list of families

    def matches(self, template: str) -> bool:
        return all(m in template for m in self.present) and not any(m in template for m in self.absent)

    @property
    def constrained(self) -> bool:
        """Whether a grammar can hold its calls to the declared functions."""
        return self.tools.grammar is not None

    @property
    def parallel(self) -> bool:
        """Whether one reply may hold several calls."""
        return self.tools.parallel
