"""What a tool call is, whatever family wrote it: a declared function, and
a call of one (its name and its arguments as a JSON object)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Function:
    name: str
    parameters: dict[str, Any]  # a JSON Schema for the arguments object
    description: str = ""


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict[str, Any]
    raw: str = ""  # the arguments as JSON text: as the model wrote them where it wrote JSON
