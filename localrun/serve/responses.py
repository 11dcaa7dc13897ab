"""OpenAI's response shapes: a completion, a stream chunk, `usage`, and the
`timings` object llama-server adds (prompt tokens, cached tokens, prompt ms,
decode tokens per second, and drafted and accepted tokens where the request
drafted)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from localrun.events import Stats, TokenChoice

Kind = Literal["chat", "text"]
Piece = Callable[[int], bytes]  # a token's bytes (`Engine.piece`)


def finish_reason(stats: Stats) -> str:
    return "length" if stats.stop_reason == "length" else "stop"


def usage(stats: Stats) -> dict[str, Any]:
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.generated_tokens,
        "total_tokens": stats.prompt_tokens + stats.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": stats.reasoning_tokens},
    }


def timings(stats: Stats) -> dict[str, Any]:
    evaluated = stats.prompt_tokens - stats.cached_tokens
    prompt_s = evaluated / stats.prompt_tokens_per_s if stats.prompt_tokens_per_s else stats.ttft_s
    decode_s = max(stats.generated_tokens - 1, 0) / stats.decode_tokens_per_s if stats.decode_tokens_per_s else 0.0
    return {
        "prompt_n": evaluated,
        "cache_n": stats.cached_tokens,
        "prompt_ms": round(prompt_s * 1000, 3),
        "prompt_per_second": round(stats.prompt_tokens_per_s, 3),
        "predicted_n": stats.generated_tokens,
        "predicted_ms": round(decode_s * 1000, 3),
        "predicted_per_second": round(stats.decode_tokens_per_s, 3),
        "ttft_ms": round(stats.ttft_s * 1000, 3),
    } | (
        {"draft_n": stats.draft.proposed, "draft_n_accepted": stats.draft.accepted}  # llama-server's names
        if stats.draft is not None
        else {}
    )


def _token(piece: Piece, token: int, logprob: float) -> dict[str, Any]:
    raw = piece(token)
    return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}


def chat_logprobs(choices: Sequence[TokenChoice], piece: Piece) -> dict[str, Any]:
    """OpenAI's chat `logprobs`: each token with its bytes and its alternatives."""
    content = [
        _token(piece, c.token, c.logprob) | {"top_logprobs": [_token(piece, t, lp) for t, lp in c.top]} for c in choices
    ]
    return {"content": content, "refusal": None}


def text_logprobs(choices: Sequence[TokenChoice], piece: Piece, offset: int = 0) -> dict[str, Any]:
    """The completions API's `logprobs`: parallel lists, the alternatives as {token: logprob}, and
    where each token starts in the text (from ``offset``)."""
    tokens = [piece(c.token).decode("utf-8", errors="replace") for c in choices]
    starts = []
    for text in tokens:
        starts.append(offset)
        offset += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": [c.logprob for c in choices],
        "top_logprobs": [{piece(t).decode("utf-8", errors="replace"): lp for t, lp in c.top} for c in choices],
        "text_offset": starts,
    }


@dataclass
class Reply:
    """One response's identity: its id, when it was made, which model, which
    endpoint; which choice it is (`n`), and how to spell a token (``piece``) for `logprobs`."""

    kind: Kind
    model: str
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))
    choice: int = 0
    piece: Piece | None = None
    offset: int = 0  # characters streamed so far: where the next token starts (completions' text_offset)

    def logprobs(self, choices: Sequence[TokenChoice]) -> dict[str, Any] | None:
        """The choice's `logprobs` for these tokens (None when they were not asked for)."""
        if self.piece is None or not choices:
            return None
        if self.kind == "chat":
            return chat_logprobs(choices, self.piece)
        found = text_logprobs(choices, self.piece, self.offset)
        self.offset = found["text_offset"][-1] + len(found["tokens"][-1])
        return found

    @property
    def object(self) -> str:
        return "chat.completion" if self.kind == "chat" else "text_completion"

    def _head(self, obj: str) -> dict[str, Any]:
        prefix = "chatcmpl-" if self.kind == "chat" else "cmpl-"
        return {"id": prefix + self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(
        self,
        text: str,
        stats: Stats,
        calls: list[dict[str, Any]] | None = None,
        logprobs: Sequence[TokenChoice] = (),
        reasoning: str = "",
    ) -> dict[str, Any]:
        """The non-streaming response (``calls``: OpenAI's `tool_calls`;
        ``reasoning``: a reasoning model's thinking, as `reasoning_content`)."""
        reason = "tool_calls" if calls else finish_reason(stats)
        choice: dict[str, Any] = {"index": self.choice, "finish_reason": reason, "logprobs": self.logprobs(logprobs)}
        if self.kind == "chat":
            choice["message"] = {"role": "assistant", "content": text or (None if calls else text)}
            if reasoning:
                choice["message"]["reasoning_content"] = reasoning
            if calls:
                choice["message"]["tool_calls"] = calls
        else:
            choice["text"] = text
        return self._head(self.object) | {"choices": [choice], "usage": usage(stats), "timings": timings(stats)}

    def chunk(
        self,
        text: str | None,
        *,
        first: bool = False,
        stats: Stats | None = None,
        only_usage: bool = False,
        calls: list[dict[str, Any]] | None = None,
        reason: str | None = None,
        reasoning: str | None = None,
        logprobs: Sequence[TokenChoice] = (),
    ) -> str:
        """One SSE event: new ``text`` or ``reasoning`` (thinking, as
        `reasoning_content`; chat: the role first); with ``stats``
        the last choice chunk, carrying finish_reason, usage and timings; with
        ``only_usage`` the `include_usage` chunk (no choices)."""
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        body = self._head(obj)
        if only_usage:
            assert stats is not None
            return sse(body | {"choices": [], "usage": usage(stats)})
        choice: dict[str, Any] = {
            "index": self.choice,
            "finish_reason": reason or (finish_reason(stats) if stats else None),
        }
        if logprobs and self.piece is not None:
            choice["logprobs"] = self.logprobs(logprobs)
        if self.kind == "chat":
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            if reasoning is not None:
                delta["reasoning_content"] = reasoning
            if calls is not None:
                delta["tool_calls"] = calls
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        body["choices"] = [choice]
        if stats is not None:
            body |= {"usage": usage(stats), "timings": timings(stats)}
        return sse(body)


def sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"
