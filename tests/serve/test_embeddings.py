"""/v1/embeddings and /v1/rerank on a real server, two embedding models
beside a chat model, through the official `openai` client."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import openai
import pytest

from tests.serve.conftest import Server, start
from tests.synthmodels import FAMILIES, write_family_model
from tests.tinymodel import SPECIALS, write_tiny_model

SENTENCES = ["the cat sat on the mat", "hello there", "a quick brown fox"]


@pytest.fixture(scope="module")
def embedding_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A mean-pooling model 64 wide, a last-token one 32 wide whose name makes
    it a Matryoshka family, a chat model with no pooling, and a reranker."""
    models = tmp_path_factory.mktemp("embedmodels")
    mean = write_tiny_model(models / "mean-embed.gguf", pooling=llama_cpp.LLAMA_POOLING_TYPE_MEAN)
    last = write_tiny_model(
        models / "last-embed.gguf",
        pooling=llama_cpp.LLAMA_POOLING_TYPE_LAST,
        n_embd=32,
        seed=1,
        name="tiny-qwen3-embedding",
    )
    qwen3 = next(f for f in FAMILIES if f.name == "qwen3")
    rank = write_family_model(qwen3, models / "rank.gguf", rank_head=True)
    home = tmp_path_factory.mktemp("home")
    yield from start(home, "-m", str(mean), "-m", str(last), "-m", str(tiny_model), "-m", str(rank), "--parallel", "1")


def _raw(server: Server, path: str, body: dict[str, Any]) -> Any:
    return server.client().post(path, body=body, cast_to=object)


def test_two_models_give_unit_vectors_of_their_width(embedding_server: Server) -> None:
    client = embedding_server.client()
    widths = {}
    for model, width in (("mean-embed", 64), ("last-embed", 32)):
        result = client.embeddings.create(model=model, input=SENTENCES)
        assert result.model == model and [d.index for d in result.data] == [0, 1, 2]
        for item in result.data:
            assert len(item.embedding) == width
            assert abs(float(np.linalg.norm(item.embedding)) - 1.0) < 1e-4
        assert result.usage.prompt_tokens == result.usage.total_tokens > len(SENTENCES)
        widths[model] = result.data[0].embedding
    one = client.embeddings.create(model="mean-embed", input=SENTENCES[0], encoding_format="float")
    assert np.allclose(one.data[0].embedding, widths["mean-embed"], atol=2e-3)  # alone as in a batch


def test_base64_is_the_float_vector(embedding_server: Server) -> None:
    floats = _raw(
        embedding_server, "/embeddings", {"model": "mean-embed", "input": "hello", "encoding_format": "float"}
    )
    packed = _raw(
        embedding_server, "/embeddings", {"model": "mean-embed", "input": "hello", "encoding_format": "base64"}
    )
    decoded = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(decoded, floats["data"][0]["embedding"], atol=1e-6)


def test_token_arrays_embed_as_their_text(embedding_server: Server) -> None:
    client = embedding_server.client()
    text = client.embeddings.create(model="mean-embed", input="hi", encoding_format="float").data[0].embedding
    tokens = [len(SPECIALS) + b for b in b"hi"]  # byte tokens follow the control tokens; no merge joins h and i
    by_tokens = client.embeddings.create(model="mean-embed", input=[tokens], encoding_format="float")
    assert np.allclose(by_tokens.data[0].embedding, text, atol=1e-4)


def test_dimensions_cut_a_matryoshka_model_only(embedding_server: Server) -> None:
    client = embedding_server.client()
    full = client.embeddings.create(model="last-embed", input="hello", encoding_format="float").data[0].embedding
    cut = client.embeddings.create(model="last-embed", input="hello", dimensions=8).data[0].embedding
    assert len(cut) == 8 and abs(float(np.linalg.norm(cut)) - 1.0) < 1e-4
    assert np.allclose(cut, np.array(full[:8]) / np.linalg.norm(full[:8]), atol=1e-4)
    with pytest.raises(openai.BadRequestError, match="not trained to be cut"):
        client.embeddings.create(model="mean-embed", input="hello", dimensions=8)
    with pytest.raises(openai.BadRequestError, match="from 1 to 32"):
        client.embeddings.create(model="last-embed", input="hello", dimensions=33)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"input": ""}, "empty"),
        ({"input": []}, "empty"),
        ({"input": ["fine", ""]}, "input 1 is empty"),
        ({"input": [1.5]}, "must be a string"),
        ({"input": "x", "encoding_format": "int8"}, "float or base64"),
        ({"input": "x", "pooling": "max"}, "not supported by this server: pooling"),
    ],
)
def test_bad_input_is_a_400_naming_it(embedding_server: Server, body: dict[str, Any], says: str) -> None:
    with pytest.raises(openai.BadRequestError, match=says):
        _raw(embedding_server, "/embeddings", {"model": "mean-embed", **body})


def test_an_input_over_the_context_is_a_400_with_the_numbers(embedding_server: Server) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        embedding_server.client().embeddings.create(model="mean-embed", input=["ok", "word " * 700])
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["code"] == "context_length_exceeded" and error["n_ctx"] == 512 and error["n_prompt_tokens"] > 512
    assert "input 1" in error["message"]


def test_a_chat_model_makes_no_embeddings_and_still_chats(embedding_server: Server) -> None:
    client = embedding_server.client()
    with pytest.raises(openai.BadRequestError, match="not an embedding model") as refused:
        client.embeddings.create(model="tiny", input="hello")
    error = refused.value.body
    assert isinstance(error, dict) and error["param"] == "model"
    message = error["message"]  # the hint in one pair of parentheses, naming the option that pools any model
    assert message.startswith("tiny is not an embedding model: its file declares no pooling (")
    assert "--pooling mean" in message and message.count("(") == message.count(")") == 1
    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert reply.usage is not None and reply.usage.completion_tokens == 2


def test_rerank_needs_a_rank_head(embedding_server: Server) -> None:
    with pytest.raises(openai.BadRequestError, match="no rank head"):
        _raw(embedding_server, "/rerank", {"model": "mean-embed", "query": "q", "documents": ["a", "b"]})
    with pytest.raises(openai.BadRequestError, match="documents"):
        _raw(embedding_server, "/rerank", {"model": "mean-embed", "query": "q", "documents": []})


def test_rerank_orders_documents_by_relevance(embedding_server: Server) -> None:
    documents = ["a cat is an animal", "the stock market", "cats purr", "bread and butter"]
    body = {"model": "rank", "query": "what is a cat", "documents": documents}
    whole = _raw(embedding_server, "/rerank", body)
    results = whole["results"]
    assert sorted(r["index"] for r in results) == [0, 1, 2, 3] and whole["model"] == "rank"
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True) and whole["usage"]["prompt_tokens"] > 0
    top = _raw(embedding_server, "/rerank", {**body, "top_n": 2, "return_documents": True})["results"]
    assert [r["index"] for r in top] == [r["index"] for r in results[:2]]
    assert [r["document"]["text"] for r in top] == [documents[r["index"]] for r in top]
    as_objects = [{"text": d} for d in documents]
    same = _raw(embedding_server, "/rerank", {**body, "documents": as_objects})["results"]
    assert [r["index"] for r in same] == [r["index"] for r in results]
    with pytest.raises(openai.BadRequestError, match="reranker"):
        embedding_server.client().embeddings.create(model="rank", input="hello")


def test_pooling_asked_embeds_with_generative_models(tiny_model: Path, tmp_path: Path) -> None:
    """`serve --pooling mean`: every model served makes vectors, generative
    ones too (as `localrun embed --pooling mean` does), and still chats."""
    wider = write_tiny_model(tmp_path / "wider.gguf", n_embd=128, n_head=4, seed=3)
    for server in start(tmp_path / "home", "-m", str(tiny_model), "-m", str(wider), "--pooling", "mean"):
        client = server.client()
        for model, width in (("tiny", 64), ("wider", 128)):
            result = client.embeddings.create(model=model, input=SENTENCES)
            assert [len(d.embedding) for d in result.data] == [width] * len(SENTENCES)
            assert all(abs(float(np.linalg.norm(d.embedding)) - 1.0) < 1e-4 for d in result.data)
        reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert reply.usage is not None and reply.usage.completion_tokens == 2
