"""ollama's API on the same engines: ``/api/chat`` and ``/api/generate``
(NDJSON streaming by default, one JSON object with ``stream: false``),
``/api/embed`` and the older ``/api/embeddings``, ``/api/tags``, ``/api/ps``,
``/api/show`` and ``/api/version``.

A thin translation: a chat or generate body becomes the OpenAI-shaped
`ChatRequest` (or, ``raw``, the `CompletionRequest`) the rest of the server
runs, admitted and answered by the app's own request path (`register` is
given it), so tools, ``format`` (a schema or ``json``), thinking and the
slots are the OpenAI endpoints' own; the reply goes back in ollama's words.
Errors are ollama's ``{"error": "..."}`` (the app shapes them by path).

A model is named as the router resolves it (id, alias, file name), or
ollama's way with a ``:latest`` tag it lacks; the reply repeats the name
the request gave."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, Literal, Protocol, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from localrun import store
from localrun.errors import InvalidRequestError, ModelNotFoundError
from localrun.events import SequenceDone, SequenceReasoning, SequenceText, Stats, TokenChoice
from localrun.gguf.info import ModelInfo, describe
from localrun.gguf.reader import GGUFInfo, read_gguf
from localrun.runtime.reasoning import reasoning_for
from localrun.runtime.sampling import PARAMETERS
from localrun.serve import embeddings
from localrun.serve.errors import api_error
from localrun.serve.events import Notice, OnEvent, RequestDone
from localrun.serve.responses import chat_logprobs, finish_reason, timings
from localrun.serve.router import ModelTable, parse_duration
from localrun.serve.schemas import (
    ChatRequest,
    CompletionRequest,
    json_object,
    media_refused,
    parse_data,
    refuse_unknown,
    renamed,
)
from localrun.serve.served import ServedModel
from localrun.serve.tools import CallDelta, ToolStream, ToolUse, new_id, split_reply
from localrun.serve.worker import JobEvent
from localrun.structured.tools import Call

VERSION = "0.12.6"  # the ollama API version answered as (clients check features by it)
NDJSON = "application/x-ndjson"
LATEST = ":latest"  # ollama's default tag

CHAT_FIELDS = frozenset(
    {"model", "messages", "tools", "format", "options", "stream", "keep_alive", "think", "logprobs", "top_logprobs"}
    | {"tool_choice"}  # localrun's: OpenAI's tool_choice (ollama's is auto)
)
GENERATE_FIELDS = frozenset(
    {"model", "prompt", "suffix", "system", "template", "context", "stream", "raw", "format", "images", "options"}
    | {"keep_alive", "think", "logprobs", "top_logprobs"}
)
EMBED_FIELDS = frozenset({"model", "input", "truncate", "options", "keep_alive", "dimensions"})
EMBEDDINGS_FIELDS = frozenset({"model", "prompt", "options", "keep_alive"})
MESSAGE_FIELDS = frozenset({"role", "content", "images", "thinking", "tool_calls", "tool_name", "tool_call_id"})

# ollama's options and the chat request's fields they set: chat's `/set` parameters, and three more
OPTIONS = {name: field for name, (field, _) in PARAMETERS.items()} | {
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "stop": "stop",
}
# set when a model loads (here: by `serve`'s flags) or at a value that changes nothing: taken, said once
TAKEN_OPTIONS = frozenset(
    {"num_ctx", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all", "vocab_only", "use_mmap"}
    | {"use_mlock", "embedding_only", "numa", "num_thread", "penalize_newline"}
    | {"mirostat_tau", "mirostat_eta"}
)
NEUTRAL = {"mirostat": 0, "typical_p": 1.0, "tfs_z": 1.0}  # samplers llama.cpp's server path here leaves out
# num_keep: the prompt's first tokens kept when ollama shifts (or cuts) a context that is full. This
# server never shifts nor cuts (a prompt over the context is an error): all of it is kept, as -1 asks
KEEP_ALL = -1
THINK = {True: "medium", False: "none", "low": "low", "medium": "medium", "high": "high"}
# a chat field's complaint, named as ollama's body has it
RENAMED = {
    "max_tokens": "options.num_predict",
    "response_format": "format",
    "reasoning_effort": "think",
    "prompt": "prompt",
    **{ours: f"options.{theirs}" for theirs, ours in OPTIONS.items() if ours != "max_tokens"},
}

Kind = Literal["chat", "generate"]
Piece = Callable[[int], bytes]
Render = Callable[[SequenceDone], dict[str, Any]]


class OllamaJob(Protocol):
    """What this module reads of the app's admitted request (`app.Job`)."""

    model: ServedModel
    queue: asyncio.Queue[JobEvent]
    generated: int

    def end(self, status: int, stats: Stats | None = None, outcome: str = "", text: str | None = None) -> None: ...


J = TypeVar("J", bound=OllamaJob)


# ------------------------------------------------------------ requests --


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def resolve(table: ModelTable, name: Any) -> str:
    """The id of the model ``name`` names: as the router resolves names, or
    with a ``:latest`` tag (ollama's default) that the served name lacks."""
    if not isinstance(name, str) or not name:
        raise InvalidRequestError("model: required, the name of a model", "model")
    try:
        return str(table.describe_one(name)["id"])
    except ModelNotFoundError:
        if not name.endswith(LATEST):
            raise
        try:
            return str(table.describe_one(name.removesuffix(LATEST))["id"])
        except ModelNotFoundError:
            pass
        raise


def listed(model_id: str) -> str:
    """A model's name as ollama lists it: with a tag (``:latest`` where the id has none)."""
    return model_id if ":" in model_id else model_id + LATEST


def _options(options: Any, said: Callable[[str], None]) -> dict[str, Any]:
    """ollama's ``options`` as the chat request's fields; a load-time option
    (the server's flags decide those) is taken and said once, one that would
    change the answer unhonoured is refused by name."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise InvalidRequestError("options: an object", "options")
    out: dict[str, Any] = {}
    for name, value in options.items():
        if value is None:
            continue
        if name in OPTIONS:
            out[OPTIONS[name]] = value
        elif name == "num_keep":
            _num_keep(value)
        elif name in TAKEN_OPTIONS or (name in NEUTRAL and value == NEUTRAL[name]):
            said(name)
        else:
            raise InvalidRequestError(f"options.{name}: not supported by this server", f"options.{name}")
    # num_predict -1 (no limit) and -2 (fill the context), llama.cpp's seed -1 (a random one), no stops: none given
    return {k: v for k, v in out.items() if not (_negative(v) and k in ("max_tokens", "seed")) and v != []}


def _num_keep(value: Any) -> None:
    """``num_keep``: -1 (the whole prompt kept) is what this server does; any other count is refused."""
    if value != KEEP_ALL or isinstance(value, bool):
        raise InvalidRequestError(
            f"options.num_keep: this server never shifts the context nor cuts the prompt (one over the context "
            f"is an error), so it keeps no count of tokens; leave num_keep out, or give {KEEP_ALL} (all of it)",
            "options.num_keep",
        )


def _truncate(value: Any) -> bool:
    """``/api/embed``'s ``truncate``: an input over the context cut to fit it (true, ollama's default), or an error."""
    if value is None:
        return True
    if not isinstance(value, bool):
        raise InvalidRequestError("truncate: true or false", "truncate")
    return value


def _negative(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value < 0


def _format(fmt: Any) -> dict[str, Any]:
    """``format``: ``json`` or a JSON schema, as chat's `response_format` (enforced as `--schema` is)."""
    if fmt is None or fmt == "":
        return {}
    if fmt == "json":
        return {"response_format": {"type": "json_object"}}
    if isinstance(fmt, dict):
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt}}}
    raise InvalidRequestError('format: "json" or a JSON schema', "format")


def _think(think: Any) -> dict[str, Any]:
    """``think``: false turns thinking off (where the template has a switch), true or a level turns it on."""
    if think is None:
        return {}
    if isinstance(think, bool | str) and think in THINK:
        return {"reasoning_effort": THINK[think]}
    raise InvalidRequestError("think: true, false, low, medium or high", "think")


def _logprobs(data: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if data.get("logprobs") is not None:
        out["logprobs"] = data["logprobs"]
    if data.get("top_logprobs") is not None:
        out["top_logprobs"] = data["top_logprobs"]
    return out


def _no_images(images: Any, where: str) -> None:
    if images:
        raise InvalidRequestError(media_refused("image") or "images are not supported", where)


def _arguments(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments or {}, ensure_ascii=False)


def messages(given: Any) -> list[dict[str, Any]]:
    """ollama's messages as OpenAI's: an assistant's ``thinking`` as its
    `reasoning_content`, its ``tool_calls`` (arguments an object) with ids,
    and each ``tool`` message tied to a call (by ``tool_call_id``, else the
    first unanswered call of its ``tool_name``, else the first unanswered)."""
    if not isinstance(given, list):
        raise InvalidRequestError("messages: a list of messages", "messages")
    out: list[dict[str, Any]] = []
    open_calls: list[tuple[str, str]] = []  # (id, name) of the calls not answered yet
    for i, m in enumerate(given):
        where = f"messages.{i}"
        if not isinstance(m, dict):
            raise InvalidRequestError(f"{where}: a message is an object", where)
        refuse_unknown(m, MESSAGE_FIELDS, where + ".")
        _no_images(m.get("images"), where)
        role, content = m.get("role"), m.get("content")
        if role not in ("system", "user", "assistant", "tool"):
            raise InvalidRequestError(f"{where}.role: system, user, assistant or tool", where)
        if content is not None and not isinstance(content, str):
            raise InvalidRequestError(f"{where}.content: a string", where)
        message: dict[str, Any] = {"role": role, "content": content or ""}
        if role == "assistant":
            message |= _assistant(m, i, open_calls)
        elif role == "tool":
            answered = _answered(open_calls, m.get("tool_call_id"), m.get("tool_name"))
            if answered is not None:
                message["tool_call_id"] = answered
        out.append(message)
    return out


def _assistant(m: dict[str, Any], i: int, open_calls: list[tuple[str, str]]) -> dict[str, Any]:
    """An assistant message's thinking and calls as OpenAI's fields (each call left open, for its result)."""
    out: dict[str, Any] = {"reasoning_content": str(m["thinking"])} if m.get("thinking") else {}
    calls = []
    for j, call in enumerate(m.get("tool_calls") or []):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            where = f"messages.{i}.tool_calls.{j}"
            raise InvalidRequestError(f"{where}: a call has a function with a name", f"messages.{i}")
        call_id = str(call.get("id") or f"call_{i}_{j}")
        called = {"name": function["name"], "arguments": _arguments(function.get("arguments"))}
        calls.append({"id": call_id, "type": "function", "function": called})
        open_calls.append((call_id, function["name"]))
    if calls:
        out |= {"tool_calls": calls, "content": m.get("content") or None}
    return out


def _answered(open_calls: list[tuple[str, str]], call_id: Any, name: Any) -> str | None:
    """Which open call a tool message answers (taken off ``open_calls``)."""
    for want in (lambda c: c[0] == call_id, lambda c: c[1] == name, lambda c: True):
        found = next((c for c in open_calls if want(c)), None)
        if found is not None:
            open_calls.remove(found)
            return found[0]
    return str(call_id) if isinstance(call_id, str) else None


def _checked(
    kind: type[ChatRequest] | type[CompletionRequest], request: dict[str, Any]
) -> ChatRequest | CompletionRequest:
    try:
        return parse_data(kind, request)
    except InvalidRequestError as exc:
        raise renamed(exc, RENAMED) from None


@dataclass(frozen=True)
class Asked:
    """What an ollama request asks for: the request the server runs, and how to answer."""

    kind: Kind
    name: str  # the model as the request named it (the reply repeats it)
    request: ChatRequest | CompletionRequest | None  # None: load (or unload) the model, nothing more
    keep_alive: float | None
    stream: bool


def _common(data: dict[str, Any], said: Callable[[str], None]) -> dict[str, Any]:
    return (
        _options(data.get("options"), said) | _format(data.get("format")) | _think(data.get("think")) | _logprobs(data)
    )


def chat_request(table: ModelTable, body: bytes, said: Callable[[str], None]) -> Asked:
    """An ``/api/chat`` body as the chat request the server runs."""
    data = json_object(body)
    refuse_unknown(data, CHAT_FIELDS)
    model_id = resolve(table, data.get("model"))
    keep_alive = parse_duration(data["keep_alive"]) if data.get("keep_alive") is not None else None
    stream = data.get("stream") is not False
    if not data.get("messages"):  # ollama's way to load a model (or, keep_alive 0, to unload it)
        return Asked("chat", data["model"], None, keep_alive, stream)
    chat: dict[str, Any] = {"model": model_id, "messages": messages(data["messages"]), "stream": stream}
    chat |= _common(data, said)
    if data.get("tools"):
        choice = data.get("tool_choice")
        chat |= {"tools": data["tools"], "parallel_tool_calls": choice in (None, "auto")}
        if choice is not None:
            chat["tool_choice"] = choice
    elif data.get("tool_choice") is not None:
        chat["tool_choice"] = data["tool_choice"]
    return Asked("chat", data["model"], _checked(ChatRequest, chat), keep_alive, stream)


def generate_request(table: ModelTable, body: bytes, said: Callable[[str], None]) -> Asked:
    """An ``/api/generate`` body: the prompt in the model's chat template (a
    ``system`` message before it), or, ``raw``, as it is."""
    data = json_object(body)
    refuse_unknown(data, GENERATE_FIELDS)
    model_id = resolve(table, data.get("model"))
    keep_alive = parse_duration(data["keep_alive"]) if data.get("keep_alive") is not None else None
    stream = data.get("stream") is not False
    _no_images(data.get("images"), "images")
    for name, what in (("suffix", "a suffix (fill in the middle)"), ("template", "a template in the request")):
        if data.get(name):
            raise InvalidRequestError(f"{name}: {what} is not supported by this server", name)
    if data.get("context"):
        raise InvalidRequestError(
            "context: not supported by this server; send the conversation to /api/chat", "context"
        )
    prompt = data.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise InvalidRequestError("prompt: a string", "prompt")
    if not prompt:
        return Asked("generate", data["model"], None, keep_alive, stream)
    common = _common(data, said)
    if data.get("raw"):
        if "reasoning_effort" in common:
            raise InvalidRequestError("think: a raw prompt goes through no template to switch thinking", "think")
        return Asked(
            "generate",
            data["model"],
            _checked(CompletionRequest, {"model": model_id, "prompt": prompt, "stream": stream} | common),
            keep_alive,
            stream,
        )
    turns = ([{"role": "system", "content": data["system"]}] if data.get("system") else []) + [
        {"role": "user", "content": prompt}
    ]
    chat = {"model": model_id, "messages": turns, "stream": stream} | common
    return Asked("generate", data["model"], _checked(ChatRequest, chat), keep_alive, stream)


# ------------------------------------------------------------- replies --


def _ns(seconds: float) -> int:
    return max(int(seconds * 1e9), 0)


def _tool_call(index: int, call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            arguments = {}
    return {"id": "call_" + call_id, "function": {"index": index, "name": name, "arguments": arguments}}


@dataclass
class Answer:
    """One reply's shape, in pieces (streaming) or whole."""

    kind: Kind
    model: str  # as the request named it
    t0: float  # when the request came (perf_counter)
    load_s: float  # how long it waited for its model (and was admitted)
    piece: Piece | None = None  # a token's bytes, where log-probabilities were asked for

    def _head(self) -> dict[str, Any]:
        return {"model": self.model, "created_at": _now()}

    def _body(self, text: str, thinking: str | None, calls: list[dict[str, Any]]) -> dict[str, Any]:
        if self.kind == "generate":
            return {"response": text} | ({"thinking": thinking} if thinking else {})
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if thinking:
            message["thinking"] = thinking
        if calls:
            message["tool_calls"] = calls
        return {"message": message}

    def _logprobs(self, choices: Sequence[TokenChoice]) -> dict[str, Any]:
        if self.piece is None or not choices:
            return {}
        return {"logprobs": chat_logprobs(choices, self.piece)["content"]}

    def part(
        self,
        text: str = "",
        thinking: str | None = None,
        calls: list[dict[str, Any]] | None = None,
        logprobs: Sequence[TokenChoice] = (),
    ) -> dict[str, Any]:
        """A streamed piece: more text, thinking, or whole calls."""
        return self._head() | self._body(text, thinking, calls or []) | {"done": False} | self._logprobs(logprobs)

    def final(
        self,
        stats: Stats,
        text: str = "",
        thinking: str | None = None,
        calls: list[dict[str, Any]] | None = None,
        logprobs: Sequence[TokenChoice] = (),
    ) -> dict[str, Any]:
        """The last object: the reply's end and its figures (whole: its text too)."""
        figures = timings(stats)
        return (
            self._head()
            | self._body(text, thinking, calls or [])
            | {
                "done": True,
                "done_reason": finish_reason(stats),
                "total_duration": _ns(time.perf_counter() - self.t0),
                "load_duration": _ns(self.load_s),
                "prompt_eval_count": stats.prompt_tokens,
                "prompt_eval_duration": _ns(figures["prompt_ms"] / 1000),
                "eval_count": stats.generated_tokens,
                "eval_duration": max(_ns(figures["predicted_ms"] / 1000), 1 if stats.generated_tokens else 0),
            }
            | self._logprobs(logprobs)
        )

    def whole(self, done: SequenceDone, use: ToolUse | None) -> dict[str, Any]:
        content, calls = split_reply(done.text, use)
        return self.final(done.stats, content, done.reasoning or None, _calls(calls), done.logprobs)


def _calls(calls: list[Call]) -> list[dict[str, Any]]:
    return [_tool_call(i, new_id(), c.name, c.arguments) for i, c in enumerate(calls)]


def _deltas(deltas: list[CallDelta]) -> list[dict[str, Any]]:
    return [_tool_call(d.index, d.id, d.name, d.arguments) for d in deltas]


def line(data: dict[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False) + "\n"


async def _lines(job: OllamaJob, answer: Answer, use: ToolUse | None) -> AsyncIterator[str]:
    """The reply as ollama streams it: a JSON object a line, the last one ``done``."""
    held = ToolStream(use) if use is not None and use.choice is not None else None
    while True:
        event = await job.queue.get()
        if isinstance(event, SequenceReasoning):
            job.generated = event.generated
            yield line(answer.part(thinking=event.text))
        elif isinstance(event, SequenceText):
            job.generated = event.generated
            text, deltas = held.feed(event.text) if held is not None else (event.text, [])
            if text or deltas or event.logprobs:
                yield line(answer.part(text, calls=_deltas(deltas), logprobs=event.logprobs))
        elif isinstance(event, SequenceDone):
            if held is not None:
                rest, deltas, _ = held.finish()
                if rest or deltas:
                    yield line(answer.part(rest, calls=_deltas(deltas)))
            yield line(answer.final(event.stats))
            job.end(200, event.stats, text=event.text)
            return
        else:
            error = api_error(event.error)
            yield line({"error": error.message})
            job.end(error.status, outcome=error.message)
            return


# --------------------------------------------------------- the models --


@dataclass(frozen=True)
class Facts:
    """What ollama's listings say of a model, read from its file (no load needed)."""

    id: str
    size: int  # the file's bytes
    modified: float  # its time
    info: GGUFInfo | None
    shape: ModelInfo | None

    def digest(self) -> str:
        """An identity for the listing: the hash of the file's name, size and time (not of its contents)."""
        source = f"{self.info.path if self.info else self.id}:{self.size}:{self.modified}"
        return hashlib.sha256(source.encode()).hexdigest()

    def details(self) -> dict[str, Any]:
        family = self.shape.architecture if self.shape else ""
        return {
            "parent_model": "",
            "format": "gguf",
            "family": family,
            "families": [family] if family else [],
            "parameter_size": _parameters(self.shape.parameters) if self.shape else "",
            "quantization_level": self.shape.quantization if self.shape else "",
        }


def _parameters(count: int) -> str:
    if count >= 10**9:
        return f"{count / 1e9:.1f}B"
    if count >= 10**6:
        return f"{count / 1e6:.2f}M"
    return str(count)


_READ: dict[tuple[Path, int, float], tuple[GGUFInfo, ModelInfo]] = {}  # headers read, by file, size and time


def _path(table: ModelTable, model_id: str) -> Path | None:
    """The model's file: a loaded model's own, else a pulled model's in the
    store, else the one its plan names (`serve --models-dir`'s plans have a ``path``)."""
    loaded = next((m for m in table.models if m.id == model_id), None)
    if loaded is not None:
        return loaded.shape.path
    entry = table.registry.entries.get(model_id) if table.registry is not None else None
    if entry is not None:
        return store.locate(store.Target.from_entry(entry))
    planned = next((getattr(e.plan, "path", None) for e in table.entries if e.id == model_id), None)
    return planned if isinstance(planned, Path) else None


def facts(table: ModelTable, model_id: str) -> Facts:
    """The model's facts (off the event loop: it reads the file's header once)."""
    path = _path(table, model_id)
    if path is None or not path.is_file():
        return Facts(model_id, 0, time.time(), None, None)
    stat = path.stat()
    key = (path, stat.st_size, stat.st_mtime)
    if key not in _READ:
        info = read_gguf(path)
        _READ[key] = (info, describe(info))
    info, shape = _READ[key]
    return Facts(model_id, stat.st_size, stat.st_mtime, info, shape)


def _capabilities(model: ServedModel | None, fact: Facts) -> list[str]:
    template = model.template if model is not None else (fact.info.chat_template if fact.info else None)
    embeds = model.loaded.embeds if model is not None else False
    chat = model.chat if model is not None else True
    if fact.info is not None and model is None:
        from localrun.runtime.embed import makes_embeddings

        embeds = makes_embeddings(fact.info)
        chat = not embeds
    caps = ["completion"] if chat else []
    if chat and template:
        caps.append("tools")
        if reasoning_for(template, "", mode="on") is not None:
            caps.append("thinking")
    if embeds:
        caps.append("embedding")
    return caps


def _model_info(fact: Facts) -> dict[str, Any]:
    """The file's metadata as ollama's ``model_info``: its numbers and strings (arrays and the template left out)."""
    if fact.info is None:
        return {}
    kept = {
        key: value
        for key, value in fact.info.metadata.items()
        if isinstance(value, int | float | str | bool) and key != "tokenizer.chat_template"
    }
    if fact.shape is not None:
        kept["general.parameter_count"] = fact.shape.parameters
    return kept


def tags(table: ModelTable, ids: list[str]) -> dict[str, Any]:
    """``/api/tags``: every model served here (``ids``), loaded or not."""
    models = []
    for model_id in ids:
        fact = facts(table, model_id)
        name = listed(fact.id)
        models.append(
            {
                "name": name,
                "model": name,
                "modified_at": _iso(fact.modified),
                "size": fact.size,
                "digest": fact.digest(),
                "details": fact.details(),
            }
        )
    return {"models": models}


def ps(table: ModelTable, loaded: list[tuple[ServedModel, float | None]]) -> dict[str, Any]:
    """``/api/ps``: the models ``loaded`` now (each with the seconds until it
    unloads if left idle), what they hold, and when they unload."""
    models = []
    for model, left in loaded:
        fact = facts(table, model.id)
        held = model.held
        expires = _iso(time.time() + left) if left is not None else "9999-12-31T23:59:59Z"
        name = listed(model.id)
        models.append(
            {
                "name": name,
                "model": name,
                "size": sum(held.values()) or fact.size,
                "digest": fact.digest(),
                "details": fact.details(),
                "expires_at": expires,
                "size_vram": sum(size for device, size in held.items() if not device.upper().startswith("CPU")),
                "context_length": model.capacity,
            }
        )
    return {"models": models}


def show(table: ModelTable, model_id: str) -> dict[str, Any]:
    """``/api/show``: the model's template, details, metadata and capabilities."""
    fact = facts(table, model_id)
    loaded = next((m for m in table.models if m.id == model_id), None)
    template = loaded.template if loaded is not None else (fact.info.chat_template if fact.info else None)
    license_ = fact.info.metadata.get("general.license", "") if fact.info else ""
    return {
        "license": license_ if isinstance(license_, str) else "",
        "modelfile": "",
        "parameters": "",
        "template": template or "",
        "details": fact.details(),
        "model_info": _model_info(fact),
        "capabilities": _capabilities(loaded, fact),
        "modified_at": _iso(fact.modified),
    }


# -------------------------------------------------------------- routes --


class Said:
    """Options taken that change nothing here: the server says each once."""

    def __init__(self, on_event: OnEvent | None) -> None:
        self.on_event = on_event
        self.noted: set[str] = set()

    def __call__(self, name: str) -> None:
        if name not in self.noted and self.on_event is not None:
            self.noted.add(name)
            self.on_event(Notice(f"ignored in ollama requests: options.{name} (the server's flags decide it)"))


Read = Callable[[ModelTable, bytes, Callable[[str], None]], Asked]


class Routes(Generic[J]):
    """The handlers: ``admit`` and ``respond`` are the app's own request path
    (a request admitted to its model's worker, and its reply whole or
    streamed, ended and reported either way)."""

    def __init__(
        self,
        table: ModelTable,
        on_event: OnEvent | None,
        admit: Callable[
            [ModelTable, Request, ChatRequest | CompletionRequest, OnEvent | None, float | None],
            Awaitable[tuple[J, ToolUse | None]],
        ],
        respond: Callable[[J, Request, AsyncIterator[str] | None, Render], Awaitable[Response]],
    ) -> None:
        self.table = table
        self.on_event = on_event
        self.admit = admit
        self.respond = respond
        self.said = Said(on_event)

    def _done(self, request: Request, model: str, t0: float, prompt_tokens: int = 0) -> None:
        if self.on_event is not None:
            elapsed = time.perf_counter() - t0
            self.on_event(RequestDone(request.method, request.url.path, 200, model, prompt_tokens, elapsed_s=elapsed))

    async def load_only(self, request: Request, asked: Asked, t0: float) -> dict[str, Any]:
        """No prompt: load the model (ollama's preload), or with keep_alive 0 unload it."""
        model_id = resolve(self.table, asked.name)
        if asked.keep_alive == 0:
            await self.table.unload(model_id)
            reason = "unload"
        else:
            await self.table.ready(model_id, asked.keep_alive)
            reason = "load"
        body = {"message": {"role": "assistant", "content": ""}} if asked.kind == "chat" else {"response": ""}
        self._done(request, model_id, t0)
        return {"model": asked.name, "created_at": _now(), **body, "done": True, "done_reason": reason}

    async def run(self, request: Request, read: Read) -> Response:
        """``/api/chat`` or ``/api/generate``: the request read by ``read``, run as the OpenAI endpoints run theirs."""
        t0 = time.perf_counter()
        asked = read(self.table, await request.body(), self.said)
        if asked.request is None:
            return JSONResponse(await self.load_only(request, asked, t0))
        job, use = await self.admit(self.table, request, asked.request, self.on_event, asked.keep_alive)
        piece = job.model.engine.piece if asked.request.top_logprobs_wanted() is not None else None
        answer = Answer(asked.kind, asked.name, t0, time.perf_counter() - t0, piece)
        stream = _lines(job, answer, use) if asked.stream else None
        response = await self.respond(job, request, stream, lambda done: answer.whole(done, use))
        if stream is not None:
            response.headers["content-type"] = NDJSON
        return response

    async def embed(self, request: Request, legacy: bool) -> dict[str, Any]:
        """``/api/embed`` (or, ``legacy``, ``/api/embeddings``) through the embeddings endpoint's own handler."""
        t0 = time.perf_counter()
        data = json_object(await request.body())
        refuse_unknown(data, EMBEDDINGS_FIELDS if legacy else EMBED_FIELDS)
        _options(data.get("options"), self.said)
        model_id = resolve(self.table, data.get("model"))
        keep_alive = parse_duration(data["keep_alive"]) if data.get("keep_alive") is not None else None
        model = await self.table.ready(model_id, keep_alive)
        load_s = time.perf_counter() - t0
        openai: dict[str, Any] = {"model": model_id, "input": data.get("prompt") if legacy else data.get("input")}
        if data.get("dimensions") is not None:
            openai["dimensions"] = data["dimensions"]
        truncate = not legacy and _truncate(data.get("truncate"))  # the older endpoint has no truncate: never cut
        embed = functools.partial(embeddings.embeddings, truncate=truncate)
        # as /v1/embeddings runs it: where the model is loaded, decoded on its engine thread
        result = await model.call(embed, openai)
        vectors = [item["embedding"] for item in result["data"]]
        tokens = int(result["usage"]["prompt_tokens"])
        self._done(request, model.id, t0, tokens)
        if legacy:
            return {"embedding": vectors[0]}
        return {
            "model": data["model"],
            "embeddings": vectors,
            "total_duration": _ns(time.perf_counter() - t0),
            "load_duration": _ns(load_s),
            "prompt_eval_count": tokens,
        }


def register(app: FastAPI, routes: Routes[Any]) -> None:
    """ollama's routes on ``app``."""
    table = routes.table

    @app.post("/api/chat")
    async def chat_route(request: Request) -> Response:
        return await routes.run(request, chat_request)

    @app.post("/api/generate")
    async def generate_route(request: Request) -> Response:
        return await routes.run(request, generate_request)

    @app.post("/api/embed")
    async def embed_route(request: Request) -> dict[str, Any]:
        return await routes.embed(request, legacy=False)

    @app.post("/api/embeddings")
    async def embeddings_route(request: Request) -> dict[str, Any]:
        return await routes.embed(request, legacy=True)

    # what the table holds is read on the event loop; the files' headers off it
    @app.get("/api/tags")
    async def tags_route() -> dict[str, Any]:
        return await run_in_threadpool(tags, table, [d["id"] for d in table.describe()])

    @app.get("/api/ps")
    async def ps_route() -> dict[str, Any]:
        return await run_in_threadpool(ps, table, [(m, table.unloads_in(m.id)) for m in table.models])

    @app.post("/api/show")
    async def show_route(request: Request) -> dict[str, Any]:
        data = json_object(await request.body())
        refuse_unknown(data, frozenset({"model", "name", "verbose", "system", "template", "options"}))
        return await run_in_threadpool(show, table, resolve(table, data.get("model") or data.get("name")))

    @app.get("/api/version")
    async def version_route() -> dict[str, Any]:
        return {"version": VERSION}
