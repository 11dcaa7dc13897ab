"""A conversation with a remote model: the turns so far are sent with each
message (the server applies its chat template and keeps no state)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from localrun.events import DoneEvent, Event, TokenEvent
from localrun.remote.backend import Message, RemoteModel, Request
from localrun.runtime.sampling import SamplingParams
from localrun.structured.spec import OutputSpec


@dataclass
class RemoteChat:
    model: RemoteModel
    sampling: SamplingParams
    system: str | None = None
    max_tokens: int | None = None
    output: OutputSpec | None = None
    turns: list[tuple[str, str]] = field(default_factory=list)  # (user, assistant)

    def messages(self, text: str) -> list[Message]:
        messages: list[Message] = [{"role": "system", "content": self.system}] if self.system else []
        for user, assistant in self.turns:  # an empty reply too: user and assistant alternate
            messages.append({"role": "user", "content": user})
            messages.append({"role": "assistant", "content": assistant})
        return [*messages, {"role": "user", "content": text}]

    def reply(self, text: str) -> Iterator[Event]:
        """The reply's events; the turn keeps what came, even when interrupted or cut (as a local chat's does)."""
        request = Request(
            messages=self.messages(text), sampling=self.sampling, max_tokens=self.max_tokens, output=self.output
        )
        pieces: list[str] = []
        for ev in self.model.generate(request):
            if isinstance(ev, TokenEvent):
                pieces.append(ev.text)
            elif isinstance(ev, DoneEvent):
                self.turns.append((text, "".join(pieces)))
            yield ev

    def clear(self) -> None:
        self.turns.clear()
