"""The one place where errors become HTTP statuses and OpenAI's error body:
``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from localrun.errors import (
    AuthenticationError,
    BadModelError,
    ChatTemplateError,
    ContextOverflowError,
    EngineError,
    InvalidRequestError,
    LocalrunError,
    ModelNotFoundError,
    ServerBusyError,
    UsageError,
)

RETRY_AFTER_S = 1  # what a 503 asks the client to wait

# status, OpenAI's error type, code (None: none)
STATUS: dict[type[LocalrunError], tuple[int, str, str | None]] = {
    ContextOverflowError: (400, "invalid_request_error", "context_length_exceeded"),
    InvalidRequestError: (400, "invalid_request_error", None),
    UsageError: (400, "invalid_request_error", None),
    ChatTemplateError: (400, "invalid_request_error", None),  # the template raised for the request, as llama-server
    AuthenticationError: (401, "invalid_request_error", "invalid_api_key"),
    ModelNotFoundError: (404, "invalid_request_error", "model_not_found"),
    ServerBusyError: (503, "server_error", "server_busy"),
    BadModelError: (500, "server_error", None),
    EngineError: (500, "server_error", None),
}


@dataclass
class ApiError(Exception):
    """An error response: its status, OpenAI's error object and any headers."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # beside the four fields (llama-server's n_prompt_tokens)
    headers: dict[str, str] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return {"error": error | self.extra}


def api_error(exc: BaseException) -> ApiError:
    """The response for ``exc``: localrun's typed errors by their table row;
    anything else is a 500 that does not leak its details."""
    if isinstance(exc, ApiError):
        return exc
    if not isinstance(exc, LocalrunError):
        return ApiError(500, "internal error", "server_error")
    status, kind, code = next((STATUS[cls] for cls in type(exc).__mro__ if cls in STATUS), (500, "server_error", None))
    message = exc.message + (f" ({exc.hint})" if exc.hint and status < 500 else "")
    error = ApiError(status, message, kind, code=code)
    if isinstance(exc, InvalidRequestError):
        error.param = exc.param
    if isinstance(exc, ContextOverflowError) and exc.n_prompt is not None:
        error.extra = {"n_prompt_tokens": exc.n_prompt, "n_ctx": exc.n_ctx}
    if isinstance(exc, ServerBusyError):
        error.headers = {"Retry-After": str(RETRY_AFTER_S)}
    return error


def http_error(status: int, message: str) -> ApiError:
    """An error Starlette raised itself (no route, wrong method, body too large)."""
    codes = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
    return ApiError(
        status, message, "invalid_request_error" if status < 500 else "server_error", code=codes.get(status)
    )
