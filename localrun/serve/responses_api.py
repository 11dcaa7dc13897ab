"""OpenAI's Responses API (POST /v1/responses, GET /v1/responses/{id}) on
the same engines: the request runs as a chat request (responses_request.py),
and the reply goes back as a response object, its output a reasoning item
(a thinking model's), a message and `function_call` items, whole or as
OpenAI's server-sent events (response.created, output items, content parts,
text, reasoning and argument deltas, response.completed), each with its
`sequence_number`. Responses are kept in memory, the last `KEPT` of them,
for `previous_response_id`, GET and DELETE; `store: false` keeps none."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any, Protocol

from localrun.errors import InvalidRequestError
from localrun.events import SequenceDone, SequenceReasoning, SequenceText, Stats
from localrun.serve.anthropic import event
from localrun.serve.errors import ApiError, api_error
from localrun.serve.responses_request import Item, TurnRequest
from localrun.serve.tools import CallDelta, ToolStream, ToolUse, new_id, split_reply
from localrun.serve.worker import JobEvent

KEPT = 100  # responses kept for previous_response_id (the oldest goes first)
PARTS = {"message": "output_text", "reasoning": "reasoning_text"}  # the text part each item type streams


class Kept:
    """The last ``size`` responses stored: each one's body, and its conversation's items (input and output)."""

    def __init__(self, size: int = KEPT) -> None:
        self.size = size
        self.lock = threading.Lock()
        self.responses: OrderedDict[str, tuple[dict[str, Any], list[Item]]] = OrderedDict()

    def put(self, body: dict[str, Any], items: list[Item]) -> None:
        with self.lock:
            self.responses[body["id"]] = (body, items)
            while len(self.responses) > self.size:
                self.responses.popitem(last=False)

    def body(self, response_id: str) -> dict[str, Any]:
        with self.lock:
            found = self.responses.get(response_id)
        if found is None:
            raise ApiError(404, f"no response {response_id!r} is stored here", param="response_id", code="not_found")
        return found[0]

    def drop(self, response_id: str) -> dict[str, Any]:
        self.body(response_id)  # a 404 when it is not kept
        with self.lock:
            self.responses.pop(response_id, None)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    def items(self, response_id: str) -> list[Item]:
        """The conversation up to and including the response, for a `previous_response_id`."""
        with self.lock:
            found = self.responses.get(response_id)
        if found is None:
            raise InvalidRequestError(
                f"previous_response_id: no response {response_id!r} is stored here "
                f"(the last {self.size} are kept, and none made with store: false)",
                "previous_response_id",
            )
        return list(found[1])


def usage(stats: Stats) -> dict[str, Any]:
    return {
        "input_tokens": stats.prompt_tokens,
        "input_tokens_details": {"cached_tokens": stats.cached_tokens},
        "output_tokens": stats.generated_tokens,
        "output_tokens_details": {"reasoning_tokens": stats.reasoning_tokens},
        "total_tokens": stats.prompt_tokens + stats.generated_tokens,
    }


def _reasoning_item(item_id: str, text: str, status: str = "completed") -> Item:
    return {
        "type": "reasoning",
        "id": item_id,
        "summary": [],
        "content": [_part("reasoning_text", text)],
        "status": status,
    }


def _message_item(item_id: str, text: str | None, status: str = "completed") -> Item:
    content = [] if text is None else [_part("output_text", text)]
    return {"type": "message", "id": item_id, "role": "assistant", "status": status, "content": content}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> Item:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def _part(kind: str, text: str) -> dict[str, Any]:
    return {"type": kind, "text": text} | ({"annotations": [], "logprobs": []} if kind == "output_text" else {})


class Answer:
    """One response: its identity, and its shape whole or as events; kept once it ends (unless ``store`` is off)."""

    def __init__(self, model: str, turn: TurnRequest, use: ToolUse | None, kept: Kept) -> None:
        self.id = "resp_" + uuid.uuid4().hex
        self.created_at = int(time.time())
        self.model = model
        self.turn = turn
        self.use = use
        self.kept = kept
        self.held = ToolStream(use) if use is not None and use.choice is not None else None
        self.output: list[Item] = []  # the items finished (streaming)
        self.open: Item | None = None  # the item being written
        self.text = ""  # its text so far
        self.sequence = 0

    def body(self, status: str, output: list[Item], stats: Stats | None = None) -> dict[str, Any]:
        incomplete = stats is not None and stats.stop_reason == "length" and status == "completed"
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": "incomplete" if incomplete else status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "model": self.model,
            "output": output,
            "usage": usage(stats) if stats is not None else None,
        } | self.turn.echo

    def _end(self, output: list[Item], stats: Stats) -> dict[str, Any]:
        body = self.body("completed", output, stats)
        if self.turn.store:
            self.kept.put(body, [*self.turn.items, *output])
        return body

    def whole(self, done: SequenceDone) -> dict[str, Any]:
        """The response: the thinking, the message (when it has text or nothing was called), the calls."""
        content, calls = split_reply(done.text, self.use)
        output = [_reasoning_item("rs_" + new_id(), done.reasoning)] if done.reasoning else []
        if content or not calls:
            output.append(_message_item("msg_" + new_id(), content))
        output += [_call_item("fc_" + new_id(), "call_" + new_id(), c.name, c.raw) for c in calls]
        return self._end(output, done.stats)

    # -- streaming --

    def _event(self, name: str, data: dict[str, Any]) -> str:
        self.sequence += 1
        return event(name, data | {"sequence_number": self.sequence - 1})

    def _at(self) -> dict[str, Any]:
        assert self.open is not None
        return {"item_id": self.open["id"], "output_index": len(self.output)}

    def start(self) -> list[str]:
        body = self.body("in_progress", [])
        return [
            self._event("response.created", {"response": body}),
            self._event("response.in_progress", {"response": body}),
        ]

    def _open(self, item: Item, part: str | None) -> list[str]:
        out = self._close()
        self.open, self.text = item, ""
        out.append(self._event("response.output_item.added", {"output_index": len(self.output), "item": item}))
        if part is not None:
            out.append(
                self._event("response.content_part.added", self._at() | {"content_index": 0, "part": _part(part, "")})
            )
        return out

    def _close(self) -> list[str]:
        """The open item's last events: its text done, its part done, the item done."""
        item = self.open
        if item is None:
            return []
        out = []
        if item["type"] in PARTS:
            kind = PARTS[item["type"]]
            at = self._at() | {"content_index": 0}
            said: dict[str, Any] = {"text": self.text} | ({"logprobs": []} if kind == "output_text" else {})
            out.append(self._event(f"response.{kind}.done", at | said))
            out.append(self._event("response.content_part.done", at | {"part": _part(kind, self.text)}))
            item = item | {"status": "completed", "content": [_part(kind, self.text)]}
        out.append(self._event("response.output_item.done", {"output_index": len(self.output), "item": item}))
        self.output.append(item)
        self.open = None
        return out

    def thinking(self, piece: str) -> list[str]:
        if not piece:
            return []
        out = (
            []
            if self.open is not None and self.open["type"] == "reasoning"
            else self._open(_reasoning_item("rs_" + new_id(), "", "in_progress") | {"content": []}, "reasoning_text")
        )
        self.text += piece
        return [*out, self._event("response.reasoning_text.delta", self._at() | {"content_index": 0, "delta": piece})]

    def _text(self, piece: str) -> list[str]:
        if not piece:
            return []
        opened = self.open is not None and self.open["type"] == "message"
        out = [] if opened else self._open(_message_item("msg_" + new_id(), None, "in_progress"), "output_text")
        self.text += piece
        delta = {"content_index": 0, "delta": piece, "logprobs": []}
        return [*out, self._event("response.output_text.delta", self._at() | delta)]

    def _calls(self, deltas: list[CallDelta]) -> list[str]:
        out = []
        for d in deltas:
            item = _call_item("fc_" + d.id, "call_" + d.id, d.name, "", "in_progress")
            out += self._open(item, None)
            out.append(self._event("response.function_call_arguments.delta", self._at() | {"delta": d.arguments}))
            done = {"arguments": d.arguments, "name": d.name}
            out.append(self._event("response.function_call_arguments.done", self._at() | done))
            self.open = item | {"arguments": d.arguments, "status": "completed"}
            out += self._close()
        return out

    def text_events(self, piece: str) -> list[str]:
        """The events for more of the reply: text, and calls as they are written."""
        if self.held is None:
            return self._text(piece)
        piece, deltas = self.held.feed(piece)
        return self._text(piece) + self._calls(deltas)

    def finish(self, stats: Stats) -> list[str]:
        out = []
        if self.held is not None:
            rest, deltas, _ = self.held.finish()
            out += self._text(rest) + self._calls(deltas)
        written = [*self.output, self.open] if self.open is not None else self.output
        if not any(item["type"] in ("message", "function_call") for item in written):  # as `whole`: an empty message
            out += self._open(_message_item("msg_" + new_id(), None, "in_progress"), "output_text")
        out += self._close()
        return [*out, self._event("response.completed", {"response": self._end(self.output, stats)})]

    def failed(self, error: ApiError) -> list[str]:
        body = self.body("failed", self.output) | {
            "error": {"code": error.code or error.type, "message": error.message}
        }
        return [self._event("response.failed", {"response": body})]


class Running(Protocol):
    """What a streamed answer needs of the server's job (app.Job)."""

    queue: asyncio.Queue[JobEvent]
    generated: int

    def end(self, status: int, stats: Stats | None = None, outcome: str = "", text: str | None = None) -> None: ...


async def events(job: Running, answer: Answer) -> AsyncIterator[str]:
    """The answer's events as the job's come."""
    for chunk in answer.start():
        yield chunk
    while True:
        got = await job.queue.get()
        if isinstance(got, SequenceReasoning):
            job.generated = got.generated
            chunks = answer.thinking(got.text)
        elif isinstance(got, SequenceText):
            job.generated = got.generated
            chunks = answer.text_events(got.text)
        elif isinstance(got, SequenceDone):
            for chunk in answer.finish(got.stats):
                yield chunk
            job.end(200, got.stats, text=got.text)
            return
        else:
            error = api_error(got.error)
            for chunk in answer.failed(error):
                yield chunk
            job.end(error.status, outcome=error.message)
            return
        for chunk in chunks:
            yield chunk
