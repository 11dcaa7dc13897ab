"""The HTTP API: OpenAI's /v1/models, /v1/chat/completions, /v1/completions
and /v1/responses, Anthropic's /v1/messages, and /health, over the served
models' engine threads.

A request is parsed and checked (an unsupported field is refused by name),
its prompt tokenized off the event loop, and handed to its model's worker;
the worker's events come back through an asyncio queue and go out whole or
as server-sent events. A client that goes away, streaming or not, has its
request cancelled at once: its slot is free for the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localrun.errors import AuthenticationError, InvalidRequestError, LocalrunError
from localrun.events import SequenceDone, SequenceReasoning, SequenceText, Stats, TokenChoice
from localrun.serve import anthropic, apply_template, embeddings, metrics, ollama, responses_api
from localrun.serve.errors import ApiError, api_error, http_error
from localrun.serve.events import Notice, OnEvent, RequestDone
from localrun.serve.prompts import prepare
from localrun.serve.responses import DONE, Kind, Reply, sse
from localrun.serve.responses_request import turn_request
from localrun.serve.router import HoldRequests, ModelTable, model_named, split_keep_alive
from localrun.serve.schemas import ChatRequest, CompletionRequest, json_object, parse
from localrun.serve.served import ServedModel
from localrun.serve.tools import CallDelta, ToolStream, ToolUse, call_objects, split_reply
from localrun.serve.worker import Failed, JobEvent

MAX_BODY = 16 * 2**20  # bytes a request body may have
OPEN_PATHS = frozenset({"/health"})  # answered without the API key
ANTHROPIC_PATHS = "/v1/messages"
OLLAMA_PATHS = "/api/"


@dataclass(frozen=True)
class AppSettings:
    api_key: str | None = None
    cors: tuple[str, ...] = ()  # origins allowed to call from a browser; none: no CORS headers at all
    max_body: int = MAX_BODY
    metrics: bool = True  # GET /metrics (Prometheus' format), behind the API key


# ------------------------------------------------------------- the guard --


def _error_response(error: ApiError, path: str) -> JSONResponse:
    """The error in OpenAI's shape, or Anthropic's or ollama's on their endpoints."""
    body = anthropic.error_body(error) if path.startswith(ANTHROPIC_PATHS) else error.body()
    if path.startswith(OLLAMA_PATHS):
        body = {"error": error.message}
    return JSONResponse(body, error.status, headers=error.headers)


async def _send_error(error: ApiError, scope: Scope, receive: Receive, send: Send) -> None:
    await _error_response(error, scope["path"])(scope, receive, send)


class Guard:
    """Before any route: the API key (when the server has one) and the body size limit."""

    def __init__(self, app: ASGIApp, api_key: str | None, max_body: int, on_event: OnEvent | None = None) -> None:
        self.app = app
        self.key = api_key.encode() if api_key else None
        self.max_body = max_body
        self.on_event = on_event  # hears of what it answers itself, as of every other request

    async def _refuse(self, error: ApiError, scope: Scope, receive: Receive, send: Send) -> None:
        await _send_error(error, scope, receive, send)
        if self.on_event is not None:
            self.on_event(RequestDone(scope["method"], scope["path"], error.status, outcome=error.message))

    def _authorized(self, scope: Scope) -> bool:
        """`Authorization: Bearer KEY`, or Anthropic's `x-api-key: KEY`."""
        headers = dict(scope.get("headers") or [])
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        if self.key is None:
            return False
        if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key):
            return True
        return hmac.compare_digest(headers.get(b"x-api-key", b"").strip(), self.key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if (
            self.key
            and scope["path"] not in OPEN_PATHS
            and scope["method"] != "OPTIONS"
            and not self._authorized(scope)
        ):
            error = api_error(
                AuthenticationError("a valid API key is needed: Authorization: Bearer KEY (or x-api-key)")
            )
            await self._refuse(error, scope, receive, send)
            return
        too_large = http_error(413, f"the request body is over {self.max_body} bytes")
        length = dict(scope.get("headers") or []).get(b"content-length", b"0")
        if length.isdigit() and int(length) > self.max_body:
            await self._refuse(too_large, scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    raise too_large
            return message

        await self.app(scope, limited, send)


# ---------------------------------------------------------------- a job --


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class Job:
    """One admitted request: its events from the engine thread, and its end, reported once."""

    def __init__(
        self,
        model: ServedModel,
        index: int,
        prompt_tokens: int,
        request: Request,
        on_event: OnEvent | None,
        prompt: str | None = None,
    ) -> None:
        self.model = model
        self.index = index
        self.prompt_tokens = prompt_tokens
        self.prompt = prompt  # what the run history keeps of the request (its last user message)
        self.stats: Stats | None = None  # its figures, once it ended with them
        self.generated = 0  # tokens so far: what the log says of a request that ends without its stats
        self.queue: asyncio.Queue[JobEvent] = asyncio.Queue()
        self.loop = asyncio.get_running_loop()
        self.method, self.path = request.method, request.url.path
        self.t0 = time.perf_counter()
        self.on_event = on_event
        self.ended = False
        self.status, self.outcome = 0, ""  # as it ended
        self.text: str | None = None
        self.lead: Job | None = None  # the first choice of the request's `n`: it reports them all
        self.copies: list[Job] = []  # the other choices, for the first

    def deliver(self, event: JobEvent) -> None:
        """Called on the engine thread."""
        with contextlib.suppress(RuntimeError):  # the event loop has closed: nobody is listening
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)

    def notice(self, text: str) -> None:
        """Something of this request's the server's log should say (a tool call left as text)."""
        if self.on_event is not None:
            self.on_event(Notice(f"{self.model.id}: {text}"))

    def end(self, status: int, stats: Stats | None = None, outcome: str = "", text: str | None = None) -> None:
        if self.ended:
            return
        self.ended = True
        self.stats = stats
        self.status, self.outcome, self.text = status, outcome, text
        if stats is None:  # disconnected or failed: its slot goes to the next request
            self.model.worker.cancel(self.index)
        (self.lead or self).report()

    def report(self) -> None:
        """The request's line in the log, once it and every other choice of its `n` ended: the tokens
        of all, each choice's text, the first failure's status."""
        every = [self, *self.copies]
        if self.on_event is None or not all(job.ended for job in every):
            return
        stats, failed = self.stats, next((job for job in every if job.status != 200), self)
        texts = [job.text for job in every]
        if self.copies and any(t is not None for t in texts):
            response: str | None = "\n\n".join(f"[choice {i}]\n{t or ''}" for i, t in enumerate(texts))
        else:
            response = self.text
        self.on_event(
            RequestDone(
                self.method,
                self.path,
                failed.status,
                self.model.id,
                stats.prompt_tokens if stats else self.prompt_tokens,
                stats.cached_tokens if stats else 0,
                sum(job.stats.generated_tokens if job.stats else job.generated for job in every),
                stats.decode_tokens_per_s if stats else 0.0,
                time.perf_counter() - self.t0,
                failed.outcome or (failed.stats.stop_reason if failed.stats else ""),
                prompt=self.prompt,
                response=response,
                ttft_s=stats.ttft_s if stats and stats.generated_tokens else None,
            )
        )


class EventStream(Response):
    """Server-sent events from ``events``; the client going away stops them at
    once (whatever the server's ASGI version), and ``on_close`` learns whether it did."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[bool], None]) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})  # no body: no Content-Length
        self.events = events
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = False
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async with anyio.create_task_group() as group:

                async def watch() -> None:
                    nonlocal gone
                    await _until_disconnect(receive)
                    gone = True
                    group.cancel_scope.cancel()

                group.start_soon(watch)
                try:
                    async for chunk in self.events:
                        await send({"type": "http.response.body", "body": chunk.encode(), "more_body": True})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                except OSError:
                    gone = True
                group.cancel_scope.cancel()
        finally:
            aclose = getattr(self.events, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()
            self.on_close(gone)


async def _stream(job: Job, reply: Reply, include_usage: bool, use: ToolUse | None) -> AsyncIterator[str]:
    if reply.kind == "chat":
        yield reply.chunk("", first=True)
    held = ToolStream(use) if use is not None and use.choice is not None else None
    while True:
        event = await job.queue.get()
        if isinstance(event, SequenceText | SequenceReasoning):
            job.generated = event.generated
            for chunk in _chunks(reply, held, event):
                yield chunk
        elif isinstance(event, SequenceDone):
            reason = None
            if held is not None:
                rest, deltas, found = held.finish()
                for chunk in _pieces(reply, rest, deltas):
                    yield chunk
                reason = "tool_calls" if found else None
            yield reply.chunk(None, stats=event.stats, reason=reason)
            if include_usage:
                yield reply.chunk(None, stats=event.stats, only_usage=True)
            yield DONE
            job.end(200, event.stats, text=event.text)
            return
        else:
            error = api_error(event.error)
            yield sse({"error": error.body()["error"]})
            job.end(error.status, outcome=error.message)
            return


def _chunks(reply: Reply, held: ToolStream | None, event: SequenceText | SequenceReasoning) -> list[str]:
    """The chunks for more of the reply: thinking as `reasoning_content`, text, and calls as they are written."""
    if isinstance(event, SequenceReasoning):
        return [reply.chunk(None, reasoning=event.text)]
    text, deltas = held.feed(event.text) if held is not None else (event.text, [])
    return _pieces(reply, text, deltas, event.logprobs)


def _pieces(reply: Reply, text: str, calls: list[CallDelta], logprobs: Sequence[TokenChoice] = ()) -> list[str]:
    """The chunks for more of the reply: its text, then the calls finished with it."""
    first = [reply.chunk(text, logprobs=logprobs)] if text or logprobs else []
    return first + [reply.chunk(None, calls=[d.openai()]) for d in calls]


Render = Callable[[SequenceDone], dict[str, Any]]


async def _whole(job: Job, request: Request, render: Render) -> Response:
    """Wait for the end (or the client leaving, which cancels the request)."""
    result: SequenceDone | Failed | None = None
    async with anyio.create_task_group() as group:

        async def watch() -> None:
            await _until_disconnect(request.receive)
            group.cancel_scope.cancel()

        group.start_soon(watch)
        while result is None:
            event = await job.queue.get()
            if isinstance(event, SequenceText | SequenceReasoning):
                job.generated = event.generated
            else:
                result = event
        group.cancel_scope.cancel()
    if result is None:
        job.end(499, outcome="disconnected")
        return Response(status_code=499)
    if isinstance(result, Failed):
        error = api_error(result.error)
        job.end(error.status, outcome=error.message)
        return _error_response(error, request.url.path)
    job.end(200, result.stats, text=result.text)
    return JSONResponse(render(result))


# ---------------------------------------------------------------- the app --


def _error_handlers(app: FastAPI, on_event: OnEvent | None) -> None:
    """Every error in OpenAI's shape, reported like any other request."""

    def report(request: Request, status: int, outcome: str) -> None:
        if on_event is not None:
            on_event(RequestDone(request.method, request.url.path, status, outcome=outcome))

    async def on_api_error(request: Request, exc: Exception) -> Response:
        error = api_error(exc)
        report(request, error.status, error.message)
        return _error_response(error, request.url.path)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        error = http_error(exc.status_code, str(exc.detail))
        error.headers = dict(exc.headers or {})
        report(request, error.status, error.message)
        return _error_response(error, request.url.path)

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(LocalrunError, on_api_error)
    app.add_exception_handler(HTTPException, on_http_error)


async def _admit(
    table: ModelTable,
    request: Request,
    parsed: ChatRequest | CompletionRequest,
    on_event: OnEvent | None,
    keep_alive: float | None = None,
) -> tuple[Job, ToolUse | None]:
    """Prepare the request off the event loop and hand it to its model's worker."""
    jobs, use = await _admit_copies(table, request, parsed, on_event, 1, keep_alive)
    return jobs[0], use


_NOTED: set[str] = set()  # the ignored fields said so far (once each, per server)


def _note_ignored(parsed: ChatRequest | CompletionRequest, on_event: OnEvent | None) -> None:
    """Fields that change nothing here (`schemas.IGNORED`) are taken; the server says so once for each."""
    fresh = [name for name in parsed.ignored() if name not in _NOTED]
    if fresh and on_event is not None:
        _NOTED.update(fresh)
        on_event(Notice(f"ignored in requests: {', '.join(fresh)} (nothing here changes with it)"))


async def _admit_copies(
    table: ModelTable,
    request: Request,
    parsed: ChatRequest | CompletionRequest,
    on_event: OnEvent | None,
    copies: int,
    keep_alive: float | None = None,
) -> tuple[list[Job], ToolUse | None]:
    """The request prepared once and submitted ``copies`` times (`n`), each
    copy a job of its own with its own seed; the first reports the request, every choice in it."""
    _note_ignored(parsed, on_event)
    model = await table.ready(parsed.model, keep_alive)
    room = model.worker.parallel + model.worker.max_queue
    if copies > room:
        raise InvalidRequestError(f"n: at most {room} here ({model.worker.parallel} slots and the queue)", "n")
    index = model.worker.next_index()
    batch_request, use = await run_in_threadpool(prepare, model, parsed, index)
    jobs: list[Job] = []
    try:
        for copy in range(copies):
            if copy:
                seed = batch_request.sampling.seed
                sampling = replace(batch_request.sampling, seed=None if seed is None else (seed + copy) % 2**32)
                batch_request = replace(batch_request, index=model.worker.next_index(), sampling=sampling)
            job = Job(
                model,
                batch_request.index,
                len(batch_request.tokens),
                request,
                on_event if not copy else None,
                prompt=parsed.logged_prompt(),
            )
            if jobs:  # another choice: the first reports the request once every choice ended
                job.lead = jobs[0]
                jobs[0].copies.append(job)
            model.worker.submit(batch_request, job.deliver)
            jobs.append(job)
    except BaseException:
        for job in jobs:  # the copies admitted go too
            model.worker.cancel(job.index)
        raise
    return jobs, replace(use, warn=jobs[0].notice) if use is not None else None


async def _respond(job: Job, request: Request, stream: AsyncIterator[str] | None, render: Render) -> Response:
    """The whole reply, or ``stream``'s events; the request ends either way."""
    if stream is None:
        try:
            return await _whole(job, request, render)
        finally:
            job.end(500, outcome="failed")  # nothing when it ended already
    return EventStream(
        stream, lambda gone: job.end(499, outcome="disconnected") if gone else job.end(503, outcome="cancelled")
    )


async def _generate(table: ModelTable, request: Request, kind: Kind, on_event: OnEvent | None) -> Response:
    body, keep_alive = split_keep_alive(await request.body())
    parsed: ChatRequest | CompletionRequest = (
        parse(ChatRequest, body) if kind == "chat" else parse(CompletionRequest, body)
    )
    jobs, use = await _admit_copies(table, request, parsed, on_event, parsed.choices(), keep_alive)
    job = jobs[0]
    piece = job.model.engine.piece if parsed.top_logprobs_wanted() is not None else None
    replies = [Reply(kind, job.model.id, piece=piece)]
    replies += [replace(replies[0], choice=copy) for copy in range(1, len(jobs))]

    def renderer(reply: Reply) -> Render:
        def render(done: SequenceDone) -> dict[str, Any]:
            content, calls = split_reply(done.text, use)
            return reply.whole(content, done.stats, call_objects(calls), done.logprobs, done.reasoning)

        return render

    include_usage = parsed.stream_options is not None and parsed.stream_options.include_usage
    if len(jobs) > 1:
        return await _several(jobs, replies, request, parsed.stream, include_usage, use, renderer)
    reply = replies[0]
    stream = _stream(job, reply, include_usage, use) if parsed.stream else None
    return await _respond(job, request, stream, renderer(reply))


# ------------------------------------------------------------- n choices --


def _summed(stats: list[Stats]) -> Stats:
    """The figures of several completions of one prompt: the prompt counted once."""
    return replace(stats[0], generated_tokens=sum(s.generated_tokens for s in stats))


async def _merged(
    jobs: list[Job], streams: list[AsyncIterator[str]], reply: Reply, include_usage: bool
) -> AsyncIterator[str]:
    """The choices' events as they come, then one usage chunk (asked for) and one [DONE]."""
    queue: asyncio.Queue[str | None] = asyncio.Queue()

    async def pump(stream: AsyncIterator[str]) -> None:
        try:
            async for chunk in stream:
                if chunk != DONE:
                    queue.put_nowait(chunk)
        finally:
            queue.put_nowait(None)

    tasks = [asyncio.create_task(pump(stream)) for stream in streams]
    try:
        left = len(tasks)
        while left:
            chunk = await queue.get()
            if chunk is None:
                left -= 1
            else:
                yield chunk
        ended = [job.stats for job in jobs if job.stats is not None]
        if include_usage and ended:
            yield reply.chunk(None, stats=_summed(ended), only_usage=True)
        yield DONE
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()


async def _several(
    jobs: list[Job],
    replies: list[Reply],
    request: Request,
    stream: bool,
    include_usage: bool,
    use: ToolUse | None,
    renderer: Callable[[Reply], Render],
) -> Response:
    """`n` choices: the copies' events merged (streaming), or their responses
    as one, the prompt counted once in `usage`; the first error is the answer."""
    if stream:
        streams = [_stream(job, reply, False, use) for job, reply in zip(jobs, replies, strict=True)]

        def close(gone: bool) -> None:
            for job in jobs:
                job.end(499, outcome="disconnected") if gone else job.end(503, outcome="cancelled")

        return EventStream(_merged(jobs, streams, replies[0], include_usage), close)
    answers = await asyncio.gather(
        *(_respond(job, request, None, renderer(reply)) for job, reply in zip(jobs, replies, strict=True))
    )
    failed = next((answer for answer in answers if answer.status_code != 200), None)
    if failed is not None:
        return failed
    bodies = [json.loads(bytes(answer.body)) for answer in answers]
    merged = bodies[0]
    merged["choices"] = [body["choices"][0] for body in bodies]
    completion = sum(body["usage"]["completion_tokens"] for body in bodies)
    merged["usage"] |= {"completion_tokens": completion, "total_tokens": merged["usage"]["prompt_tokens"] + completion}
    return JSONResponse(merged)


async def _message_stream(job: Job, message: anthropic.Message) -> AsyncIterator[str]:
    yield message.start()
    while True:
        event = await job.queue.get()
        if isinstance(event, SequenceReasoning):
            job.generated = event.generated
            for chunk in message.thinking(event.text):
                yield chunk
        elif isinstance(event, SequenceText):
            job.generated = event.generated
            for chunk in message.text(event.text):
                yield chunk
        elif isinstance(event, SequenceDone):
            for chunk in message.finish(event.stats):
                yield chunk
            job.end(200, event.stats, text=event.text)
            return
        else:
            error = api_error(event.error)
            yield anthropic.event("error", {"error": anthropic.error_body(error)["error"]})
            job.end(error.status, outcome=error.message)
            return


async def _messages(table: ModelTable, request: Request, on_event: OnEvent | None) -> Response:
    """Anthropic's Messages API on the same engines."""
    body, keep_alive = split_keep_alive(await request.body())
    parsed = anthropic.chat_request(body)
    job, use = await _admit(table, request, parsed, on_event, keep_alive)
    message = anthropic.Message(job.model.id, parsed, use, job.prompt_tokens)
    stream = _message_stream(job, message) if parsed.stream else None
    return await _respond(job, request, stream, lambda done: message.whole(done.text, done.stats, done.reasoning))


async def _count_tokens(table: ModelTable, request: Request) -> dict[str, Any]:
    parsed = anthropic.chat_request(await request.body(), counting=True)
    model = await table.ready(parsed.model)
    batch_request, _ = await run_in_threadpool(prepare, model, parsed, -1)
    return {"input_tokens": len(batch_request.tokens)}


def _model_routes(app: FastAPI, table: ModelTable) -> None:
    """What is served and loaded, and loading and unloading by hand (llama-server's router)."""

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": table.describe()}

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> dict[str, Any]:
        return table.describe_one(name)

    @app.post("/models/load")
    async def load_model(request: Request) -> dict[str, Any]:
        name = model_named(json_object(await request.body()))
        await table.load(name)
        return {"success": True, "model": table.describe_one(name)}

    @app.post("/models/unload")
    async def unload_model(request: Request) -> dict[str, Any]:
        name = model_named(json_object(await request.body()))
        return {"success": True, "unloaded": await table.unload(name)}


async def _responses(
    table: ModelTable, request: Request, on_event: OnEvent | None, kept: responses_api.Kept
) -> Response:
    """OpenAI's Responses API on the same engines."""
    body, keep_alive = split_keep_alive(await request.body())
    turn = turn_request(body, kept.items)
    job, use = await _admit(table, request, turn.chat, on_event, keep_alive)
    answer = responses_api.Answer(job.model.id, turn, use, kept)
    stream = responses_api.events(job, answer) if turn.chat.stream else None
    return await _respond(job, request, stream, answer.whole)


def _response_routes(app: FastAPI, table: ModelTable, on_event: OnEvent | None) -> None:
    kept = responses_api.Kept()

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        return await _responses(table, request, on_event, kept)

    @app.get("/v1/responses/{response_id}")
    async def stored_response(response_id: str) -> dict[str, Any]:
        return kept.body(response_id)

    @app.delete("/v1/responses/{response_id}")
    async def drop_response(response_id: str) -> dict[str, Any]:
        return kept.drop(response_id)


def _routes(app: FastAPI, table: ModelTable, on_event: OnEvent | None) -> None:
    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _generate(table, request, "chat", on_event)

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        return await _messages(table, request, on_event)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> dict[str, Any]:
        return await _count_tokens(table, request)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _generate(table, request, "text", on_event)

    @app.post("/apply-template")
    async def apply_template_route(request: Request) -> dict[str, str]:
        return await apply_template.handle(table, await request.body())

    @app.get("/health")
    async def health() -> dict[str, Any]:
        status = table.status()
        return {
            "status": "ok",
            "server": "localrun",  # how `localrun launch` tells its own server from another on the port
            "slots_idle": status.slots - status.busy,
            "slots_processing": status.busy,
            "queued": status.queued,
            "requests_done": status.done,
            "requests_cancelled": status.cancelled,
        }


def create_app(table: ModelTable, settings: AppSettings | None = None, on_event: OnEvent | None = None) -> FastAPI:
    """The API over ``table``'s models; ``on_event`` hears of every request answered."""
    settings = settings or AppSettings()
    app = FastAPI(title="localrun", docs_url=None, redoc_url=None, openapi_url=None)
    counted = metrics.Metrics(table) if settings.metrics else None
    on_event = counted.tee(on_event) if counted is not None else on_event
    _error_handlers(app, on_event)
    _routes(app, table, on_event)
    _model_routes(app, table)
    _response_routes(app, table, on_event)
    embeddings.register(app, table, on_event)
    ollama.register(app, ollama.Routes(table, on_event, _admit, _respond))
    if counted is not None:
        metrics.register(app, counted)  # the last route: the others are what it counts by
    app.add_middleware(HoldRequests, table=table)
    app.add_middleware(Guard, api_key=settings.api_key, max_body=settings.max_body, on_event=on_event)
    if settings.cors:  # outermost: a preflight is answered, and errors carry the headers too
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors),
            allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type", "x-api-key", "anthropic-version"],
        )
    return app
