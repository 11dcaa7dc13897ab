"""HTTP to an OpenAI-compatible server: server-sent events, errors as
localrun's typed errors, and retries with backoff.

A request is retried when the server is busy (429, 502, 503, 504: after its
`Retry-After` when it sends one) or the connection is reset before an answer
starts; a server nothing listens for fails at once. An answer cut once it has started is a `StreamCutError`: the caller
keeps what came (generate) or asks again (--batch).
"""

from __future__ import annotations

import email.utils
import json
import random
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx2 as httpx

from localrun.errors import (
    ContextOverflowError,
    LocalrunError,
    ModelNotFoundError,
    RemoteError,
    RemoteUnavailableError,
    StreamCutError,
    UsageError,
)
from localrun.remote.config import Remote

BUSY = frozenset({429, 502, 503, 504})
CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Retry:
    """How often and how long to wait: ``attempts`` in all, the wait doubling
    from ``base_s`` up to ``max_s`` (with jitter), a server's Retry-After
    honoured up to ``max_retry_after_s``."""

    attempts: int = 5
    base_s: float = 0.5
    max_s: float = 30.0
    max_retry_after_s: float = 120.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        if retry_after is not None:
            return min(retry_after, self.max_retry_after_s)
        wait: float = min(self.base_s * 2**attempt, self.max_s)
        return wait * random.uniform(0.5, 1.0)


def retry_after(headers: httpx.Headers) -> float | None:
    """Seconds from a Retry-After header (a number or an HTTP date)."""
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


class _Busy(Exception):
    """An answer worth asking again for, after ``wait_s`` if the server said."""

    def __init__(self, error: LocalrunError, wait_s: float | None = None) -> None:
        self.error = error
        self.wait_s = wait_s


def _error_message(text: str) -> tuple[str, str | None]:
    """(message, code) from OpenAI's error body, or the text as it came."""
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        return text.strip()[:300], None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("message") or ""), error.get("code") if isinstance(error.get("code"), str) else None
    if isinstance(error, str):  # some servers send {"error": "..."}
        return error, None
    detail = body.get("detail") if isinstance(body, dict) else None
    return (str(detail) if detail else text.strip()[:300]), None


class RemoteClient:
    """One server's HTTP client (thread-safe: --batch shares it); the API key
    goes only into the Authorization header."""

    def __init__(
        self,
        remote: Remote,
        *,
        retry: Retry | None = None,
        connections: int = 64,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.remote = remote
        self.retry = retry or Retry()
        self.sleep = sleep
        headers = {"Authorization": f"Bearer {remote.api_key}"} if remote.api_key else {}
        self.http = httpx.Client(
            base_url=remote.url + "/",
            headers=headers,
            timeout=httpx.Timeout(remote.timeout_s, connect=CONNECT_TIMEOUT_S),
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> RemoteClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- errors --

    def scrub(self, text: str) -> str:
        """``text`` with the API key blotted out, should a server echo it."""
        key = self.remote.api_key
        return text.replace(key, "***") if key else text

    def error_for(self, status: int, text: str, path: str) -> LocalrunError:  # noqa: PLR0911  one per kind
        """The typed error for an answer with ``status``."""
        label = self.remote.label
        message, code = _error_message(self.scrub(text))
        message = message or f"HTTP {status}"
        lower = message.lower()
        if status in (401, 403):
            env = self.remote.api_key_env
            if self.remote.api_key is None:
                hint = f"set {env} to the server's API key" if env else "add api_key_env to the remote in models.toml"
            else:
                hint = f"check the key in {env}"
            return RemoteUnavailableError(f"{label} refused the request ({status}): {message}", hint=hint)
        if status == 404 and (code == "model_not_found" or "model" in lower):
            return ModelNotFoundError(f"{label}: {message}", hint="`localrun list` shows which models it serves")
        if status == 404:
            return RemoteError(f"{label} has no /{path} (404)", hint="give the API's base URL, ending in /v1")
        if code == "context_length_exceeded" or "context length" in lower or "maximum context" in lower:
            return ContextOverflowError(f"{label}: {message}", hint="shorten the prompt or lower --max-tokens")
        if status in (400, 413, 422):
            return UsageError(f"{label} refused the request: {message}")
        if status in BUSY:
            return RemoteError(
                f"{label} is busy ({status}) after {self.retry.attempts} tries: {message}",
                hint="try again later, or lower --parallel",
            )
        return RemoteError(f"{label} failed ({status}): {message}")

    def _unreachable(self, exc: Exception) -> RemoteError:
        reason = self.scrub(str(exc)) or type(exc).__name__
        named = self.remote.label != self.remote.url  # a [remotes.NAME] entry, which `localrun list` probes
        hint = "is it running? `localrun list` shows which remotes answer" if named else "is a server running there?"
        return RemoteUnavailableError(f"cannot reach {self.remote.label}: {reason}", hint=hint)

    def _timed_out(self) -> RemoteError:
        return RemoteError(
            f"{self.remote.label} sent nothing for {self.remote.timeout_s:g}s",
            hint="set a longer timeout for the remote in models.toml (timeout = SECONDS)",
        )

    # -- requests --

    def _with_retries(self, attempt_once: Callable[[], Any]) -> Any:
        for attempt in range(self.retry.attempts):
            try:
                return attempt_once()
            except _Busy as busy:
                if attempt == self.retry.attempts - 1:
                    raise busy.error from None
                self.sleep(self.retry.delay(attempt, busy.wait_s))
        raise AssertionError("unreachable")

    def models(self, *, timeout_s: float | None = None, retries: bool = True) -> list[dict[str, Any]]:
        """GET /models: what the server serves."""

        timeout = self.http.timeout if timeout_s is None else httpx.Timeout(timeout_s)

        def once() -> list[dict[str, Any]]:
            try:
                response = self.http.get("models", timeout=timeout)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                raise self._unreachable(exc) from None
            except httpx.TimeoutException:
                raise self._timed_out() from None
            except httpx.TransportError as exc:
                if retries:
                    raise _Busy(self._unreachable(exc)) from None
                raise self._unreachable(exc) from None
            if response.status_code != 200:
                error = self.error_for(response.status_code, response.text, "models")
                if retries and response.status_code in BUSY:
                    raise _Busy(error, retry_after(response.headers))
                raise error
            try:
                data = response.json().get("data")
            except (json.JSONDecodeError, AttributeError):
                data = None
            if not isinstance(data, list):
                raise RemoteError(f"{self.remote.label}/models is not an OpenAI model list")
            return [m for m in data if isinstance(m, dict)]

        result: list[dict[str, Any]] = self._with_retries(once)
        return result

    def stream(self, path: str, body: dict[str, Any]) -> Generator[dict[str, Any], None, None]:
        """POST ``body`` to ``path`` with ``stream: true``: each event's JSON
        until `[DONE]`. Retried until an answer starts; a cut after that is a
        StreamCutError."""
        for attempt in range(self.retry.attempts):
            last = attempt == self.retry.attempts - 1
            started = False
            try:
                with self.http.stream("POST", path, json=body) as response:
                    if response.status_code != 200:
                        response.read()
                        error = self.error_for(response.status_code, response.text, path)
                        if response.status_code in BUSY and not last:
                            self.sleep(self.retry.delay(attempt, retry_after(response.headers)))
                            continue
                        raise error
                    started = True
                    yield from self._events(response)
                    return
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # nothing listens there: no use asking again
                raise self._unreachable(exc) from None
            except httpx.TimeoutException:
                stalled = self._timed_out()
                if started:
                    raise StreamCutError(stalled.message, hint=stalled.hint) from None
                raise stalled from None
            except httpx.TransportError as exc:  # refused, reset, closed mid-answer
                if started:
                    raise StreamCutError(
                        f"the answer from {self.remote.label} was cut: {self.scrub(str(exc)) or type(exc).__name__}",
                        hint="the text before the cut was kept; try again",
                    ) from None
                if last:
                    raise self._unreachable(exc) from None
                self.sleep(self.retry.delay(attempt))

    def _events(self, response: httpx.Response) -> Iterator[dict[str, Any]]:
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue  # blank separators, comments, event names
            data = line[5:].strip()
            if data == "[DONE]":
                return
            try:
                event = json.loads(data)
            except json.JSONDecodeError:
                raise RemoteError(f"{self.remote.label} sent an event that is not JSON: {data[:80]!r}") from None
            if isinstance(event, dict) and "error" in event:
                message, _ = _error_message(self.scrub(data))
                raise RemoteError(f"{self.remote.label} failed mid-answer: {message}")
            if isinstance(event, dict):
                yield event
        raise StreamCutError(
            f"the answer from {self.remote.label} ended before its end",
            hint="the text before the cut was kept; try again",
        )


@dataclass(frozen=True)
class Probe:
    """Whether a remote answers GET /models, and with what: the model ids, or why not."""

    answers: bool
    models: tuple[str, ...] = ()
    error: str | None = None


PROBE_TIMEOUT_S = 3.0


def probe(remote: Remote, timeout_s: float = PROBE_TIMEOUT_S) -> Probe:
    """One quick GET /models, no retries (for `localrun list`)."""
    with RemoteClient(remote, retry=Retry(attempts=1)) as client:
        try:
            listed = client.models(timeout_s=timeout_s, retries=False)
        except LocalrunError as exc:
            return Probe(False, error=exc.message)
    return Probe(True, tuple(str(m.get("id")) for m in listed if m.get("id")))
