"""The embedding runner on tiny models whose files declare a pooling."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from localrun.assemble import assemble
from localrun.errors import ContextOverflowError, InvalidRequestError, UsageError
from localrun.runtime.devices import Device
from localrun.runtime.embed import Embedder, open_embedder, truncated
from localrun.settings import Options, resolve
from tests.synthmodels import FAMILIES, write_family_model
from tests.tinymodel import write_tiny_model

FAKE_HOST = Device("CPU", "fake", "cpu", 0, 0)
TEXTS = ["the cat sat on the mat", "hello there", "a", "the quick brown fox jumps over the lazy dog"]


def _open(path: Path, pooling: str | None = None, n_seq: int = 128, ctx: str | None = None) -> Embedder:
    run = assemble(path, resolve(Options(threads=1, ctx=ctx)), devices=[FAKE_HOST], use_wisdom=False)
    return open_embedder(run.config, run.info, pooling, run.settings.n_ctx, n_seq)


@pytest.fixture(scope="module")
def mean_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("embed") / "mean.gguf", pooling=llama_cpp.LLAMA_POOLING_TYPE_MEAN)


@pytest.fixture(scope="module")
def embedder(mean_model: Path) -> Iterator[Embedder]:
    with _open(mean_model) as embedder:
        yield embedder


def test_vectors_have_the_model_width_and_unit_length(embedder: Embedder) -> None:
    result = embedder.embed(TEXTS)
    assert embedder.pooling_name == "mean" and embedder.width == 64
    assert len(result.vectors) == len(TEXTS)
    for vector in result.vectors:
        assert vector.shape == (64,)
        assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-5
    assert result.tokens == sum(len(embedder.engine.tokenize(t)) for t in TEXTS)


def test_a_batch_gives_each_input_what_it_gets_alone(embedder: Embedder) -> None:
    together = embedder.embed(TEXTS * 3).vectors
    for i, text in enumerate(TEXTS * 3):
        alone = embedder.embed([text]).vectors[0]
        assert np.allclose(together[i], alone, atol=2e-3), text
    assert not np.allclose(together[0], together[1], atol=1e-2)  # different texts, different vectors


def test_inputs_are_packed_into_several_decodes_in_order(mean_model: Path) -> None:
    with _open(mean_model, n_seq=3) as small:  # 512 is no multiple of 3: the context grows to one
        assert small.n_ctx == 513
        groups = small._groups([[1]] * 7)
        assert [len(g) for g in groups] == [3, 3, 1]
        assert [i for g in groups for i in g] == list(range(7))
        many = small.embed(TEXTS * 2).vectors
    with _open(mean_model) as wide:
        assert all(np.allclose(a, b, atol=2e-3) for a, b in zip(many, wide.embed(TEXTS * 2).vectors, strict=True))


def test_empty_and_over_long_inputs_are_refused_with_numbers(embedder: Embedder) -> None:
    with pytest.raises(InvalidRequestError, match="input 1 is empty"):
        embedder.embed(["fine", ""])
    with pytest.raises(InvalidRequestError, match="no input"):
        embedder.embed([])
    with pytest.raises(ContextOverflowError) as overflow:
        embedder.embed(["hi " * 600])
    assert overflow.value.n_ctx == embedder.n_ctx == 512
    assert overflow.value.n_prompt is not None and overflow.value.n_prompt > 512
    assert "512" in overflow.value.message


def test_a_generative_model_needs_a_pooling_asked_for(tmp_path: Path) -> None:
    plain = write_tiny_model(tmp_path / "plain.gguf")
    with pytest.raises(UsageError, match="not an embedding model") as refused:
        _open(plain)
    assert refused.value.hint is not None and "--pooling mean" in refused.value.hint
    with _open(plain, "last") as last, _open(plain, "mean") as mean:
        assert last.pooling_name == "last" and mean.pooling_name == "mean"
        assert not np.allclose(last.embed(["the cat sat"]).vectors[0], mean.embed(["the cat sat"]).vectors[0])
    with pytest.raises(UsageError, match="unknown pooling"):
        _open(plain, "max")


def test_a_model_without_a_rank_head_does_not_rerank(embedder: Embedder) -> None:
    with pytest.raises(InvalidRequestError, match="no rank head"):
        embedder.rerank("query", ["document"])


def test_a_truncated_vector_is_the_prefix_at_unit_length() -> None:
    vector = np.array([3.0, 4.0, 12.0], dtype=np.float32)
    cut = truncated(vector, 2)
    assert np.allclose(cut, [0.6, 0.8]) and abs(float(np.linalg.norm(cut)) - 1) < 1e-6


def test_a_reranker_scores_each_document_alone(tmp_path: Path) -> None:
    qwen3 = next(f for f in FAMILIES if f.name == "qwen3")
    with _open(write_family_model(qwen3, tmp_path / "rank.gguf", rank_head=True)) as ranker:
        assert ranker.ranks and ranker.width == 2  # yes and no
        documents = ["a cat is an animal", "the stock market", "cats purr"]
        scores, tokens = ranker.rerank("what is a cat", documents)
        assert all(0.0 < s < 1.0 for s in scores) and len(set(scores)) == 3  # P(yes), a softmax over yes/no
        reversed_scores, _ = ranker.rerank("what is a cat", documents[::-1])
        assert np.allclose(reversed_scores[::-1], scores, atol=2e-3)  # no document sees another
        assert tokens > sum(len(ranker.engine.tokenize(d)) for d in documents)
        with pytest.raises(InvalidRequestError, match="reranker"):
            ranker.embed(["hello"])
        with pytest.raises(InvalidRequestError, match="document 1 is empty"):
            ranker.rerank("q", ["fine", ""])
