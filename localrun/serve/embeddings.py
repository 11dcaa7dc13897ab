"""``POST /v1/embeddings`` (OpenAI's) and ``POST /v1/rerank`` (llama-server's
and Jina's shape) over the served embedding models' embedders
(`localrun.runtime.embed`), beside the chat models of the same server.

Embeddings: ``input`` a string, a list of strings, a list of token ids or a
list of such lists; ``encoding_format`` float or base64 (little-endian
float32, as OpenAI sends it); ``dimensions`` for a Matryoshka model (its
vector cut and renormalized; another model takes only its own width).
Rerank: ``query``, ``documents`` (strings, or ``{"text": ...}``), ``top_n``,
``return_documents``; results best first with their ``index`` and
``relevance_score``.
"""

from __future__ import annotations

import base64
import time
from typing import Any

import numpy as np
from fastapi import FastAPI, Request

from localrun.errors import InvalidRequestError
from localrun.runtime.embed import Embedder, truncated
from localrun.serve.events import OnEvent, RequestDone
from localrun.serve.router import ModelTable, take_keep_alive
from localrun.serve.schemas import json_object, refuse_unknown
from localrun.serve.served import Handler, ServedModel

EMBEDDING_FIELDS = frozenset({"model", "input", "encoding_format", "dimensions", "user"})
RERANK_FIELDS = frozenset({"model", "query", "documents", "top_n", "return_documents"})


async def served_model(table: ModelTable, body: dict[str, Any]) -> ServedModel:
    """The served model a request names, loaded if need be (with the body's
    ``keep_alive``, taken out of it): the one place these endpoints look a model up."""
    keep_alive = take_keep_alive(body)
    return await table.ready(body.get("model"), keep_alive)


def embedder_of(model: ServedModel) -> Embedder:
    if model.embedder is None:
        raise InvalidRequestError(  # the answer puts the hint in parentheses after the message: none in either
            f"{model.id} is not an embedding model: its file declares no pooling",
            "model",
            hint="name an embedding model, e.g. nomic-embed-text:v1.5, "
            "or start serve with --pooling mean to pool any model",
        )
    return model.embedder


def _is_tokens(value: Any) -> bool:
    return (
        isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


def _inputs(value: Any) -> list[str] | list[list[int]]:
    """``input`` as texts or as token lists; anything else is named."""
    if isinstance(value, str):
        return [value]
    if _is_tokens(value):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            return list(value)
        if all(_is_tokens(v) for v in value):
            return list(value)
    if value == [] or value is None:
        raise InvalidRequestError("'input' is empty: give a string or a list of strings", "input")
    raise InvalidRequestError("'input' must be a string, a list of strings or of token id lists", "input")


def _dimensions(value: Any, embedder: Embedder, model: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= embedder.width:
        raise InvalidRequestError(f"'dimensions' must be from 1 to {embedder.width} for {model}", "dimensions")
    if value != embedder.width and not embedder.matryoshka:
        raise InvalidRequestError(
            f"{model} makes {embedder.width}-dimension vectors and was not trained to be cut shorter", "dimensions"
        )
    return value if value != embedder.width else None


def _encode(vector: np.ndarray, encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return [float(x) for x in vector]


def embeddings(model: ServedModel, body: dict[str, Any], *, truncate: bool = False) -> dict[str, Any]:
    """The OpenAI embeddings response for ``body`` (called off the event loop:
    it tokenizes there, and waits while the model's engine thread decodes).
    An input over the context is an error, or with ``truncate`` (ollama's)
    cut to fit it."""
    refuse_unknown(body, EMBEDDING_FIELDS)
    embedder = embedder_of(model)
    encoding = body.get("encoding_format", "float") or "float"
    if encoding not in ("float", "base64"):
        raise InvalidRequestError("'encoding_format' must be float or base64", "encoding_format")
    dimensions = _dimensions(body.get("dimensions"), embedder, model.id)
    inputs = _inputs(body.get("input"))
    if isinstance(inputs[0], str):
        tokens = embedder.tokenize([str(text) for text in inputs], fit=truncate)
    else:
        cut = embedder.n_ctx if truncate else None
        tokens = [embedder.check([int(t) for t in item][:cut], i, len(inputs)) for i, item in enumerate(inputs)]
    result = embedder.embed_tokens(tokens, run=model.local_worker().embed_now)
    vectors = result.vectors if dimensions is None else [truncated(v, dimensions) for v in result.vectors]
    data = [
        {"object": "embedding", "index": i, "embedding": _encode(vector, encoding)} for i, vector in enumerate(vectors)
    ]
    usage = {"prompt_tokens": result.tokens, "total_tokens": result.tokens}
    return {"object": "list", "data": data, "model": model.id, "usage": usage}


def _documents(value: Any) -> list[str]:
    if not isinstance(value, list) or not value:
        raise InvalidRequestError("'documents' must be a non-empty list", "documents")
    texts = []
    for document in value:
        text = document.get("text") if isinstance(document, dict) else document
        if not isinstance(text, str):
            raise InvalidRequestError('each document is a string or {"text": ...}', "documents")
        texts.append(text)
    return texts


def rerank(model: ServedModel, body: dict[str, Any]) -> dict[str, Any]:
    """The rerank response for ``body``: documents by relevance to the query, best first."""
    refuse_unknown(body, RERANK_FIELDS)
    embedder = embedder_of(model)
    query = body.get("query")
    if not isinstance(query, str):
        raise InvalidRequestError("'query' must be a string", "query")
    documents = _documents(body.get("documents"))
    top_n = body.get("top_n", len(documents))
    if not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 1:
        raise InvalidRequestError("'top_n' must be a positive integer", "top_n")
    scores, tokens = embedder.rerank(query, documents, run=model.local_worker().embed_now)
    order = sorted(range(len(documents)), key=lambda i: -scores[i])[:top_n]
    results: list[dict[str, Any]] = []
    for i in order:
        result: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if body.get("return_documents"):
            result["document"] = {"text": documents[i]}
        results.append(result)
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return {"object": "list", "model": model.id, "results": results, "usage": usage}


def register(app: FastAPI, table: ModelTable, on_event: OnEvent | None) -> None:
    """The embeddings and rerank routes on ``app``."""

    async def answer(request: Request, handler: Handler) -> dict[str, Any]:
        t0 = time.perf_counter()
        body = json_object(await request.body())
        model = await served_model(table, body)
        # tokenized where the model is (on a thread that ends with the request), decoded on its engine thread
        response = await model.call(handler, body)
        if on_event is not None:
            prompt_tokens = int(response["usage"]["prompt_tokens"])
            elapsed = time.perf_counter() - t0
            on_event(RequestDone(request.method, request.url.path, 200, model.id, prompt_tokens, elapsed_s=elapsed))
        return response

    @app.post("/v1/embeddings")
    async def embeddings_route(request: Request) -> dict[str, Any]:
        return await answer(request, embeddings)

    @app.post("/v1/rerank")
    @app.post("/rerank")
    async def rerank_route(request: Request) -> dict[str, Any]:
        return await answer(request, rerank)
