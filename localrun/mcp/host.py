"""The MCP servers of one session, behind a plain (blocking) interface.

The `mcp` SDK is async; a command's decode loop is not. `ToolHost` runs one
event loop on a thread of its own: each server is a task there that opens
its connection (a started process over stdio, or streamable HTTP), lists the
tools, and holds the connection until the host closes. The CLI calls
`start`, `call` and `close` from its own thread. A server that cannot
start, or lists a tool that cannot be used, is one line in `problems`; the
session goes on with the rest. Closing ends every connection: a stdio
server's input is closed, then the process group is ended (the SDK's own
shutdown), so no process outlives the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import tempfile
import threading
import time
from collections.abc import Coroutine
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import IO, Any, TextIO, TypeVar

from localrun.mcp.servers import ServerSpec

T = TypeVar("T")

START_TIMEOUT = 30.0  # seconds for a server to start and list its tools
CLOSE_TIMEOUT = 10.0  # beyond the SDK's own steps to end a stdio server (stdin closed, SIGTERM, SIGKILL)
RESULT_LIMIT = 64_000  # characters of one result given back to the model (the rest is cut, and said)


@dataclass(frozen=True)
class Tool:
    """A server's tool as the model is offered it: ``name`` is `<server>_<tool>`."""

    name: str
    server: str
    tool: str  # its own name on the server
    description: str
    parameters: dict[str, Any]
    read_only: bool = False  # the server marks it as changing nothing

    def declared(self) -> dict[str, Any]:
        """OpenAI's tool object, as a chat template takes it."""
        function = {"name": self.name, "description": self.description, "parameters": _untitled(self.parameters)}
        return {"type": "function", "function": function}


def _untitled(schema: Any) -> Any:
    """A JSON Schema without its ``title`` annotations (what pydantic, and so
    the MCP SDK, adds: ``"title": "stock_levelArguments"``): they say nothing
    the names do not, and a small model takes one for the tool's name
    (Qwen2.5-Coder 0.5B wrote ``office_colleague_deskArguments``, a call of
    no tool, left as text). A property named ``title`` stays."""
    if isinstance(schema, list):
        return [_untitled(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("default", "const", "enum", "examples"):  # values, not schemas
            out[key] = value
        elif key in ("properties", "$defs", "definitions", "patternProperties") and isinstance(value, dict):
            out[key] = {name: _untitled(sub) for name, sub in value.items()}
        else:
            out[key] = _untitled(value)
    return out


@dataclass(frozen=True)
class ToolResult:
    """What a call gave back: ``text`` goes to the model as the tool's message."""

    text: str
    status: str  # ok, error (the tool's own, or the server failed), timeout, refused
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass
class _Server:
    spec: ServerSpec
    stop: asyncio.Event
    client: Any = None  # mcp.Client once connected
    task: asyncio.Task[None] | None = None
    errlog: TextIO | None = None
    tools: list[Tool] = field(default_factory=list)
    gone: str | None = None  # why the connection ended, once it has


def _qualified(server: str, tool: str) -> str:
    return f"{server}_{tool}"


def _stderr_tail(errlog: IO[str] | None) -> str:
    """The last line a server wrote to stderr (what it said before it failed)."""
    if errlog is None:
        return ""
    with contextlib.suppress(OSError, ValueError):
        errlog.flush()
        errlog.seek(0)
        lines = [line.strip() for line in errlog.read().splitlines() if line.strip()]
        if lines:
            return lines[-1][:300]
    return ""


def _describe(exc: BaseException) -> str:
    """An exception from a connection in one line (a task group's group: its first)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, FileNotFoundError):
        return f"{exc.filename or 'the command'}: no such program"
    if isinstance(exc, PermissionError):
        return f"{exc.filename or 'the command'}: not allowed to run it"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:300]


def result_text(result: Any) -> str:
    """A call's result as text for the model: its text content; JSON of its structured content where it has no text."""
    import json

    parts: list[str] = []
    for block in getattr(result, "content", None) or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource" and hasattr(block.resource, "text"):
            parts.append(block.resource.text)
        else:
            parts.append(f"[{kind} content not shown]")
    structured = getattr(result, "structured_content", None)
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False))
    text = "\n".join(parts)
    if len(text) > RESULT_LIMIT:
        text = text[:RESULT_LIMIT] + f"\n[... {len(text) - RESULT_LIMIT} more characters cut]"
    return text


class ToolHost:
    """The session's MCP servers: `start` them, `call` their tools, `close` them (also as a context manager)."""

    def __init__(self, specs: list[ServerSpec], *, start_timeout: float = START_TIMEOUT) -> None:
        self.specs = specs
        self.start_timeout = start_timeout
        self.problems: list[str] = []
        self._servers: dict[str, _Server] = {}
        self._tools: dict[str, tuple[_Server, Tool]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- the loop's thread --

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        assert self._loop is not None
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except FutureTimeout:
            future.cancel()
            raise

    def _ensure_loop(self) -> None:
        if self._loop is not None:
            return
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="localrun-mcp", daemon=True)
        self._thread.start()
        ready.wait()
        self._loop = loop

    # -- starting --

    def start(self) -> list[Tool]:
        """Start every server at once; the tools of those that started. Each failure is a line in `problems`."""
        if not self.specs:
            return []
        # the SDK logs a bad line from a server with a traceback: here each failure is one line
        quiet = logging.getLogger("mcp")
        if not quiet.handlers:
            quiet.addHandler(logging.NullHandler())
            quiet.propagate = False
        self._ensure_loop()
        self._run(self._start_all())
        return self.tools

    @property
    def tools(self) -> list[Tool]:
        return [tool for _, tool in self._tools.values()]

    async def _start_all(self) -> None:
        starts = []
        for spec in self.specs:
            server = _Server(spec, asyncio.Event())
            self._servers[spec.name] = server
            starts.append(self._start_one(server))
        await asyncio.gather(*starts)

    async def _start_one(self, server: _Server) -> None:
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        server.task = asyncio.create_task(self._hold(server, ready))
        try:
            await asyncio.wait_for(asyncio.shield(ready), self.start_timeout)
        except TimeoutError:
            self.problems.append(
                f"MCP server {server.spec.name}: did not start within {self.start_timeout:g} s; left out"
            )
            server.stop.set()
            server.task.cancel()
            with contextlib.suppress(BaseException):
                await server.task
            return
        except Exception as exc:
            said = _stderr_tail(server.errlog)
            reason = _describe(exc)
            if said and said not in reason:
                reason += f" (it said: {said})"
            self.problems.append(f"MCP server {server.spec.name}: cannot start: {reason}; left out")
            return
        self._adopt(server)

    async def _hold(self, server: _Server, ready: asyncio.Future[None]) -> None:
        """Open the connection, list the tools, and hold it until the host closes."""
        try:
            async with contextlib.AsyncExitStack() as stack:
                client = await stack.enter_async_context(self._client(server))
                server.client = client
                server.tools = self._read_tools(server.spec, await self._listing(client, server.spec))
                ready.set_result(None)
                await server.stop.wait()
        except BaseException as exc:
            if not ready.done():
                if isinstance(exc, asyncio.CancelledError):
                    ready.cancel()
                else:
                    ready.set_exception(exc)
            server.gone = _describe(exc) if not isinstance(exc, asyncio.CancelledError) else "closed"
            if not isinstance(exc, Exception):
                raise
        finally:
            server.client = None
            if server.gone is None:
                server.gone = "closed"

    def _client(self, server: _Server) -> Any:
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters

        spec = server.spec
        if spec.command is not None:
            server.errlog = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
            params = StdioServerParameters(command=spec.command, args=list(spec.args), env=dict(spec.env) or None,
                                           cwd=spec.cwd)  # fmt: skip
            return _Tracked(Client(_stdio(params, server), mode="auto"), server)
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        http = create_mcp_http_client(headers=dict(spec.headers) or None)
        assert spec.url is not None
        return _Tracked(Client(streamable_http_client(spec.url, http_client=http), mode="auto"), server, http)

    async def _listing(self, client: Any, spec: ServerSpec) -> list[Any]:
        """The server's tools, page after page. A listing the SDK refuses (a tool
        it cannot read) is read again tool by tool: those it cannot read are left
        out, one line each, and the rest kept."""
        from pydantic import ValidationError

        try:
            listed, cursor = [], None
            while True:
                page = await client.list_tools(cursor=cursor)
                listed += page.tools
                cursor = page.next_cursor
                if not cursor:
                    return listed
        except ValidationError:
            return await self._listing_tool_by_tool(client, spec)

    async def _listing_tool_by_tool(self, client: Any, spec: ServerSpec) -> list[Any]:
        """The listing as the server sent it (the SDK checks a whole listing at once), each tool read apart."""
        import mcp_types as types
        from pydantic import ValidationError

        raw = await client.session._dispatcher.send_raw_request("tools/list", None, {})
        tools = []
        for entry in raw.get("tools") or []:
            try:
                tools.append(types.Tool.model_validate(entry, by_name=False))
            except ValidationError as exc:
                name = _qualified(spec.name, str(entry.get("name", "?")) if isinstance(entry, dict) else "?")
                error = exc.errors()[0]
                where = ".".join(str(p) for p in error["loc"])
                self.problems.append(f"MCP server {spec.name}: tool {name} cannot be read ({where}: {error['msg']}); "
                                     "the tool is left out")  # fmt: skip
        # the SDK lists the tools again before a call unless it holds a listing: it is given this one
        client.session._absorb_tool_listing(types.ListToolsResult(tools=tools), complete=True)
        return tools

    def _read_tools(self, spec: ServerSpec, listed: list[Any]) -> list[Tool]:
        from localrun.errors import UsageError
        from localrun.structured.spec import schema_spec

        tools = []
        for item in listed:
            name = _qualified(spec.name, item.name)
            schema = item.input_schema if isinstance(item.input_schema, dict) else None
            try:
                if schema is None or schema.get("type", "object") != "object":
                    raise UsageError(f"tool {name}: its input schema is not a JSON Schema of an object")
                schema_spec(schema, f"tool {name}")
            except UsageError as exc:
                self.problems.append(f"MCP server {spec.name}: {exc.message}; the tool is left out")
                continue
            annotations = getattr(item, "annotations", None)
            read_only = bool(getattr(annotations, "read_only_hint", False))
            tools.append(Tool(name, spec.name, item.name, item.description or "", schema, read_only))
        return tools

    def _adopt(self, server: _Server) -> None:
        for tool in server.tools:
            if tool.name in self._tools:
                self.problems.append(f"MCP server {server.spec.name}: a tool named {tool.name} is offered already")
                continue
            self._tools[tool.name] = (server, tool)

    # -- calling --

    def tool(self, name: str) -> Tool | None:
        held = self._tools.get(name)
        return held[1] if held else None

    def call(self, name: str, arguments: dict[str, Any], timeout: float) -> ToolResult:
        """Run a tool; whatever happens is a result (an error, a timeout), never an exception."""
        started = time.perf_counter()

        def done(text: str, status: str) -> ToolResult:
            return ToolResult(text, status, time.perf_counter() - started)

        held = self._tools.get(name)
        if held is None or held[0].client is None:
            stopped = held[0] if held is not None else None
            why = f"the {stopped.spec.name} server has stopped ({stopped.gone or 'closed'})" if stopped else ""
            return done(f"error: {why or 'no tool is named ' + name}", "error")
        server, tool = held
        try:
            result = self._run(self._call(server, tool.tool, arguments, timeout), timeout + 5)
        except (TimeoutError, FutureTimeout):
            return done(f"error: {name} did not answer within {timeout:g} s", "timeout")
        except Exception as exc:
            return done(self._failed(server, name, exc), "error")
        text = result_text(result)
        if getattr(result, "is_error", False):
            return done(f"error: {text or name + ' failed'}", "error")
        return done(text, "ok")

    @staticmethod
    def _failed(server: _Server, name: str, exc: Exception) -> str:
        from mcp_types import CONNECTION_CLOSED

        if getattr(exc, "code", None) == CONNECTION_CLOSED:  # the server ended: no later call can reach it
            server.client, server.gone = None, "its connection closed"
            return f"error: {name} failed: the {server.spec.name} server has stopped"
        return f"error: {name} failed: {_describe(exc)}"

    async def _call(self, server: _Server, tool: str, arguments: dict[str, Any], timeout: float) -> Any:
        return await asyncio.wait_for(server.client.call_tool(tool, arguments, read_timeout_seconds=timeout), timeout)

    # -- closing --

    def close(self) -> None:
        """End every connection and stop every server started; waits for them (bounded)."""
        if self._loop is None:
            return
        with contextlib.suppress(Exception):
            self._run(self._close_all(), CLOSE_TIMEOUT + 5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(5)
        self._loop = None
        for server in self._servers.values():
            if server.errlog is not None:
                with contextlib.suppress(OSError):
                    server.errlog.close()

    async def _close_all(self) -> None:
        tasks = []
        for server in self._servers.values():
            server.stop.set()
            if server.task is not None:
                tasks.append(server.task)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=2)

    def __enter__(self) -> ToolHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Tracked:
    """A client's connection, and the HTTP client it was given, closed with it."""

    def __init__(self, client: Any, server: _Server, http: Any = None) -> None:
        self.client, self.server, self.http = client, server, http

    async def __aenter__(self) -> Any:
        try:
            return await self.client.__aenter__()
        except BaseException:
            if self.http is not None:
                await self.http.aclose()
            raise

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.client.__aexit__(*exc)
        finally:
            if self.http is not None:
                await self.http.aclose()


def _stdio(params: Any, server: _Server) -> Any:
    """The SDK's stdio transport, with the server's stderr kept (for the line that says why it failed)."""
    from mcp.client.stdio import stdio_client

    return stdio_client(params, errlog=server.errlog or sys.stderr)
