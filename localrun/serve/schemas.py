"""The requests the server takes: OpenAI's fields, checked. What llama.cpp
honours is honoured (sampling, penalties, logit_bias, logprobs, n); a field
that cannot change the answer here is ignored, and the server says so once;
any other field it does not support is refused by name (never silently
ignored), as is content it cannot read (an image)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from localrun.errors import InvalidRequestError

# fields a client may send that change nothing here: taken, and said once
IGNORED = frozenset(
    {
        "user",
        "metadata",
        "store",
        "service_tier",
        "cache_prompt",
        "context_management",
        "prompt_cache_key",
        "safety_identifier",
        "prediction",  # predicted output: a speed hint, never the answer
    }
)
MAX_STOPS = 4
MAX_TOP_LOGPROBS = 20  # OpenAI's limit
MAX_CHOICES = 16  # `n`: completions of one request, decoded side by side
LOGIT_BIAS = 100.0  # OpenAI's range for each bias: -100 (never) to 100 (only)
MEDIA = {"image_url": "images are", "input_image": "images are", "input_audio": "audio is", "file": "files are"}
MEDIA_BLOCKS = {"image": "images are", "document": "documents are"}  # Anthropic's


def media_refused(kind: str | None) -> str | None:
    """What a content part of ``kind`` that only text could stand for gets: a sentence, not a schema's complaint."""
    said = MEDIA.get(kind or "") or MEDIA_BLOCKS.get(kind or "")
    return f"{said} not supported by this model: it reads text only" if said else None


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: bool | None = None  # padding against length side channels: nothing here needs it


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


class MediaPart(BaseModel):
    """A content part this server cannot read (an image, audio, a file): refused by `Message.media`."""

    model_config = ConfigDict(strict=True, extra="allow")
    type: Literal["image_url", "input_image", "input_audio", "file"]


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart | MediaPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's past calls
    tool_call_id: str | None = None  # which call a tool message answers
    reasoning_content: str | None = None  # an assistant's past thinking (the template keeps or drops it)

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content if isinstance(part, TextPart))

    def media(self) -> str | None:
        """The type of a content part only text could stand for ("image_url"), if any."""
        if isinstance(self.content, list):
            return next((part.type for part in self.content if isinstance(part, MediaPart)), None)
        return None


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
    repeat_last_n: int | None = Field(None, ge=-1)  # the tokens the penalties look back over (-1: the context)
    seed: int | None = Field(None, ge=0, lt=2**32)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: dict[str, Any] | None = None
    n: int | None = Field(None, ge=1, le=MAX_CHOICES)
    logprobs: bool | int | None = None  # chat: true or false; completions: how many alternatives (0 to 5)
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> bias, -100 to 100
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)

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
        return [name for name in self.model_extra or {} if name not in IGNORED]

    def ignored(self) -> list[str]:
        """The fields sent that change nothing here (`IGNORED`)."""
        return [name for name in self.model_extra or {} if name in IGNORED]

    def choices(self) -> int:
        return self.n or 1

    def top_logprobs_wanted(self) -> int | None:
        """How many alternatives each token's log-probability comes with; None: no log-probabilities."""
        if self.logprobs is True:  # chat's: the alternatives are top_logprobs
            return self.top_logprobs or 0
        if self.logprobs is None or self.logprobs is False:
            return None
        if not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequestError(f"logprobs: from 0 to {MAX_TOP_LOGPROBS}", "logprobs")
        return self.logprobs  # the completions API's: a count

    def biases(self, n_vocab: int) -> tuple[tuple[int, float], ...]:
        """`logit_bias` as (token id, bias) pairs; a key that is no token id of the model is refused."""
        pairs: list[tuple[int, float]] = []
        for key, bias in (self.logit_bias or {}).items():
            if not key.strip().lstrip("-").isdigit() or not 0 <= int(key) < n_vocab:
                raise InvalidRequestError(
                    f"logit_bias: {key!r} is not a token id of this model (0 to {n_vocab - 1})", "logit_bias"
                )
            if not -LOGIT_BIAS <= bias <= LOGIT_BIAS:
                raise InvalidRequestError(f"logit_bias: {bias} is outside -100 to 100", "logit_bias")
            pairs.append((int(key), float(bias)))
        return tuple(pairs)

    def logged_prompt(self) -> str | None:
        """What the run history keeps as the request's prompt."""
        return None


class ChatRequest(_Generation):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    modalities: list[str] | None = None  # ["text"] changes nothing; any other is refused
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    # a reasoning model's thinking: how much ("none" asks it not to think, where its template has a switch),
    # the template's own switches (llama-server's chat_template_kwargs), and a budget of thinking tokens
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_budget_tokens: int | None = Field(None, ge=0)
    reasoning_format: Literal["none", "auto", "deepseek"] | None = None  # llama-server's: none keeps it in content

    def unsupported(self) -> list[str]:
        found = super().unsupported()
        return [*found, "modalities"] if any(m != "text" for m in self.modalities or ()) else found

    def media(self) -> str | None:
        """A content part only text could stand for, in any message ("image_url"), if any."""
        return next((kind for m in self.messages if (kind := m.media()) is not None), None)

    def logged_prompt(self) -> str | None:
        """The last user message: what a chat turn's record keeps."""
        return next((m.text() for m in reversed(self.messages) if m.role == "user"), None)

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

    def logged_prompt(self) -> str | None:
        if isinstance(self.prompt, str):
            return self.prompt
        return str(self.prompt[0]) if self.prompt and isinstance(self.prompt[0], str) else None


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


def refuse_unknown(data: dict[str, Any], known: frozenset[str], where: str = "") -> None:
    """A field of ``data`` not in ``known`` refused by name (``where``: the
    path to ``data`` inside the body, as ``messages.0.``)."""
    unknown = [k for k in data if k not in known]
    if unknown:
        names = ", ".join(where + k for k in unknown)
        raise InvalidRequestError(f"not supported by this server: {names}", where + unknown[0])


def renamed(exc: InvalidRequestError, names: Mapping[str, str]) -> InvalidRequestError:
    """A chat request field's complaint with the field named as another API's
    body has it (``names``: the chat request's name of a field -> that API's)."""
    param = exc.param or ""
    head, dot, rest = param.partition(".")
    theirs = names.get(head)
    if theirs is None or head == theirs:
        return exc
    message = exc.message.replace(param, theirs + dot + rest, 1) if exc.message.startswith(param) else exc.message
    return InvalidRequestError(message, theirs + dot + rest)


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
    refused = media_refused(request.media()) if isinstance(request, ChatRequest) else None
    if refused is not None:
        raise InvalidRequestError(refused, "messages")
    unsupported = request.unsupported()
    if unsupported:
        names = ", ".join(unsupported)
        raise InvalidRequestError(f"not supported by this server: {names}", unsupported[0])
    return request
