"""A model on a remote server, yielding the same events as a local decode
loop: `TokenEvent` for each piece of streamed text, then `DoneEvent` with
`Stats`, so the same renderers, `--json` contract and exit codes apply.

Time to first token and the running rate are measured here, on the client;
the server's `usage` gives the token counts and its `timings` (llama-server,
`localrun serve`) the decode and prompt rates when present. What a remote
cannot tell (threads, drafting, tokens forced by a grammar) stays None.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from localrun.errors import ModelNotFoundError, StreamCutError
from localrun.events import DoneEvent, Event, ReasoningEvent, Stats, StopReason, TokenEvent
from localrun.remote.client import RemoteClient
from localrun.remote.config import Remote
from localrun.runtime.sampling import SamplingParams
from localrun.structured.spec import OutputSpec, json_problem

Message = dict[str, str]


def check_output(spec: OutputSpec, text: str, stop_reason: StopReason) -> tuple[bool | None, str | None]:
    """(valid, why not) of a remote's answer against the schema, checked
    here: a server that did not enforce it is caught. A grammar cannot be
    checked without the model's tokenizer (None)."""
    if spec.schema is None:
        return None, None
    problem = json_problem(spec.schema, text)
    if problem is None:
        return True, None
    return False, problem + (" (cut by --max-tokens)" if stop_reason == "length" else "")


def response_format(spec: OutputSpec) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": spec.schema, "strict": True}}


@dataclass(frozen=True)
class Request:
    """One generation: chat ``messages``, or a raw ``prompt`` (/completions)."""

    messages: list[Message] | None = None
    prompt: str | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    output: OutputSpec | None = None

    @property
    def path(self) -> str:
        return "chat/completions" if self.messages is not None else "completions"


def _stop_reason(finish: str | None, request: Request) -> StopReason:
    if finish == "length":
        return "length"
    return "stop" if request.stop and finish == "stop" else "eos"


class RemoteModel:
    """A remote's model: `open` checks the server answers and has it (or
    picks the first it lists), `generate` streams one answer as events.
    ``abort_requested`` (set by Ctrl-C) ends a stream at the next piece."""

    def __init__(self, remote: Remote, client: RemoteClient | None = None) -> None:
        self.remote = remote
        self.client = client or RemoteClient(remote)
        self.model_id = remote.model or ""
        self.abort_requested = False
        self.failure: StreamCutError | None = None  # why the last stream was cut, when it was

    def open(self) -> RemoteModel:
        listed = [str(m.get("id")) for m in self.client.models() if m.get("id")]
        if self.remote.model is None:
            if not listed:
                raise ModelNotFoundError(f"{self.remote.label} serves no model")
            self.model_id = listed[0]
        elif listed and self.remote.model not in listed:
            raise ModelNotFoundError(
                f"{self.remote.label} does not serve {self.remote.model!r}",
                hint=f"it serves: {', '.join(listed[:8])}",
            )
        return self

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> RemoteModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def title(self) -> str:
        return f"{self.model_id} @ {self.remote.label}"

    def body(self, request: Request) -> dict[str, Any]:
        """The request body: OpenAI's fields, llama.cpp's top_k/min_p (vLLM
        and SGLang take them too), repeat_penalty only when it is on."""
        s = request.sampling
        body: dict[str, Any] = {"model": self.model_id, "stream": True, "stream_options": {"include_usage": True}}
        if request.messages is not None:
            body["messages"] = request.messages
        else:
            body["prompt"] = request.prompt
        body |= {"temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k, "min_p": s.min_p}
        if s.repeat_penalty != 1.0:
            body["repeat_penalty"] = s.repeat_penalty
        if s.seed is not None:
            body["seed"] = s.seed
        if request.max_tokens is not None:
            body["max_tokens"] = request.max_tokens
        if request.stop:
            body["stop"] = list(request.stop)
        if request.output is not None and request.output.schema is not None:
            body["response_format"] = response_format(request.output)
        return body

    def generate(self, request: Request, *, keep_partial: bool = True) -> Iterator[Event]:
        """The answer as events. A stream cut after some text ends with a
        DoneEvent whose stop_reason is "error" (the text kept; `failure`
        says why) when ``keep_partial``; else, and before any text, it raises."""
        self.failure = None
        t0 = time.perf_counter()
        first: float | None = None
        last = t0
        pieces: list[str] = []
        thoughts = 0  # pieces of thinking (`reasoning_content`, or `reasoning` as some servers name it)
        usage: dict[str, Any] = {}
        timings: dict[str, Any] = {}
        finish: str | None = None
        stop_reason: StopReason | None = None
        events = self.client.stream(request.path, self.body(request))
        try:
            for chunk in events:
                usage = chunk.get("usage") or usage
                timings = chunk.get("timings") or timings
                for choice in chunk.get("choices") or ():
                    finish = choice.get("finish_reason") or finish
                    delta = (choice.get("delta") if request.messages is not None else choice) or {}
                    thinking = delta.get("reasoning_content") or delta.get("reasoning") or ""
                    text = delta.get("content" if request.messages is not None else "text") or ""
                    if not (text or thinking):
                        continue
                    last = time.perf_counter()
                    first = first if first is not None else last
                    made = len(pieces) + thoughts + 1
                    rate = (made - 1) / (last - first) if last > first else 0.0
                    if isinstance(thinking, str) and thinking:
                        thoughts += 1
                        yield ReasoningEvent(thinking, made, thoughts, first - t0, last - t0, rate)
                    if text:
                        pieces.append(text)
                        yield TokenEvent(text, len(pieces) + thoughts, first - t0, last - t0, rate)
                if self.abort_requested:
                    stop_reason = "interrupted"
                    break
        except StreamCutError as exc:
            if not (pieces and keep_partial):
                raise
            self.failure = exc
            stop_reason = "error"
        finally:
            events.close()  # closes the connection
        yield DoneEvent(
            self._stats(
                request,
                "".join(pieces),
                stop_reason or _stop_reason(finish, request),
                usage,
                timings,
                (t0, first, last),
                thoughts,
            )
        )

    def _stats(
        self,
        request: Request,
        text: str,
        stop_reason: StopReason,
        usage: dict[str, Any],
        timings: dict[str, Any],
        times: tuple[float, float | None, float],
        thoughts: int = 0,
    ) -> Stats:
        t0, first, last = times
        generated = int(usage.get("completion_tokens") or 0) if usage else 0
        # the thinking's tokens as the server counts them, else its streamed pieces (a token each, as a rule)
        reasoning = int((usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or thoughts)
        client_rate = (generated - 1) / (last - first) if first is not None and last > first and generated > 1 else 0.0
        details = usage.get("prompt_tokens_details") or {}
        valid, invalid = check_output(request.output, text, stop_reason) if request.output is not None else (None, None)
        return Stats(
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            generated_tokens=generated,
            ttft_s=(first - t0) if first is not None else 0.0,
            decode_tokens_per_s=float(timings.get("predicted_per_second") or client_rate),
            elapsed_s=time.perf_counter() - t0,
            stop_reason=stop_reason,
            prompt_tokens_per_s=float(timings.get("prompt_per_second") or 0.0),
            cached_tokens=int(details.get("cached_tokens") or timings.get("cache_n") or 0),
            valid=valid,
            invalid=invalid,
            reasoning_tokens=min(reasoning, generated) if generated else reasoning,
        )
