"""The requests the server takes: OpenAI's fields, checked, and each field it
does not support refused by name (never silently ignored)."""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from localrun.errors import InvalidRequestError

# fields a client may send that change nothing here
IGNORED = frozenset({"user", "metadata", "store", "service_tier", "cache_prompt"})
MAX_STOPS = 4


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class CalledFunction(_Strict):
    name: str
    arguments: str


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's past calls
    tool_call_id: str | None = None  # which call a tool message answers
    reasoning_content: str | None = None  # an assistant's past thinking (the template keeps or drops it)

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class _Generation(BaseModel):
    """What both endpoints share. Unknown fields are collected (``extra``) and
    refused by name in `unsupported`."""

    model_config = ConfigDict(strict=True, extra="allow")

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)  # llama.cpp's extensions
    min_p: float | None = Field(None, ge=0, le=1)
    repeat_penalty: float | None = Field(None, gt=0)
    seed: int | None = Field(None, ge=0, lt=2**32)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: dict[str, Any] | None = None
    # accepted at their neutral value only
    n: int | None = None
    logprobs: bool | int | None = None
    top_logprobs: int | None = None
    logit_bias: dict[str, Any] | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None

    def stops(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOPS:
            raise InvalidRequestError(f"stop: at most {MAX_STOPS} sequences", "stop")
        if any(not s for s in stops):
            raise InvalidRequestError("stop: an empty string matches nothing", "stop")
        return tuple(stops)

    def limit(self) -> int | None:
        return self.max_tokens

    def unsupported(self) -> list[str]:
        """The fields sent with a value this server cannot honour."""
        found = [name for name in self.model_extra or {} if name not in IGNORED]
        neutral: dict[str, tuple[object, ...]] = {
            "n": (None, 1),
            "logprobs": (None, False, 0),
            "top_logprobs": (None, 0),
            "logit_bias": (None, {}),
            "frequency_penalty": (None, 0, 0.0),
            "presence_penalty": (None, 0, 0.0),
        }
        found += [name for name, values in neutral.items() if getattr(self, name) not in values]
        return found


class ChatRequest(_Generation):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    # a reasoning model's thinking: how much ("none" asks it not to think, where its template has a switch),
    # the template's own switches (llama-server's chat_template_kwargs), and a budget of thinking tokens
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_budget_tokens: int | None = Field(None, ge=0)
    reasoning_format: Literal["none", "auto", "deepseek"] | None = None  # llama-server's: none keeps it in content

    def limit(self) -> int | None:
        if self.max_completion_tokens is not None and self.max_tokens is not None:
            return min(self.max_completion_tokens, self.max_tokens)
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Generation):
    prompt: str | list[str] | list[int]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def unsupported(self) -> list[str]:
        found = super().unsupported()
        found += [name for name, ok in (("echo", not self.echo), ("suffix", not self.suffix)) if not ok]
        if self.best_of not in (None, 1):
            found.append("best_of")
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str) and len(self.prompt) > 1:
            found.append("prompt")  # several prompts: one request each
        return found


R = TypeVar("R", bound=_Generation)


def json_object(body: bytes) -> dict[str, Any]:
    """A request body as a JSON object; anything else is an InvalidRequestError."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequestError("the body must be a JSON object")
    return data


def parse(kind: type[R], body: bytes) -> R:
    """The request in ``body``: malformed JSON, a wrong type or an unsupported
    field is an InvalidRequestError naming the field."""
    return parse_data(kind, json_object(body))


def parse_data(kind: type[R], data: dict[str, Any]) -> R:
    """The request in ``data`` (a parsed JSON object), checked as `parse` does."""
    try:
        request = kind.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        if first["type"] == "extra_forbidden":
            raise InvalidRequestError(f"{param}: this field is not supported", param) from None
        raise InvalidRequestError(f"{param}: {first['msg']}" if param else first["msg"], param) from None
    unsupported = request.unsupported()
    if unsupported:
        names = ", ".join(unsupported)
        raise InvalidRequestError(f"not supported by this server: {names}", unsupported[0])
    return request
