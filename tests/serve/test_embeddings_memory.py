"""Embeddings on the model's own engine thread: several requests' inputs in
one run, the embedding context counted in what the model holds, and the
server's memory and threads given back once the model unloads (issue 54:
after embeddings, within 10% of before the first load)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import llama_cpp
import numpy as np
import pytest

from localrun.runtime.embed import Embedder
from localrun.runtime.engine import Engine
from localrun.serve.served import ModelPlan, ServedModel, load_models
from scripts.bench_router import register_pulled
from tests.serve.conftest import Server, start
from tests.serve.test_served import planned
from tests.tinymodel import write_tiny_model

TEXTS = ["the cat sat on the mat", "hello there", "a quick brown fox jumps over the lazy dog"] * 8


def _status(pid: int, field: str) -> int:
    found = re.search(rf"^{field}:\s+(\d+)", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE)
    assert found, field
    return int(found.group(1))


@pytest.fixture(scope="module")
def pooled(tiny_model: Path) -> Iterator[ServedModel]:
    """The tiny chat model served with --pooling mean: an embedding context beside its slots."""
    (model,) = load_models([ModelPlan("pooled", frozenset(), planned(tiny_model), pooling="mean")])
    try:
        yield model
    finally:
        model.close()


def test_the_embedding_context_is_counted_in_what_the_model_holds(pooled: ServedModel) -> None:
    embedder = pooled.embedder
    assert embedder is not None and embedder.buffers  # its context's buffers, as llama.cpp logged them
    own = sum(b.total for b in embedder.buffers)
    assert all(b.model == 0 for b in embedder.buffers)  # the weights are the engine's, counted once
    assert isinstance(pooled.engine, Engine)  # loaded in process
    engine = sum(b.total for b in pooled.engine.buffers)
    assert sum(pooled.held.values()) == engine + own and own > 0


def test_embeddings_decode_on_the_engine_thread_several_requests_in_one_run(
    pooled: ServedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    embedder = pooled.embedder
    assert embedder is not None
    tokens = embedder.tokenize(TEXTS)
    alone = [pooled.local_worker().embed_now([t])[0] for t in tokens[:3]]
    runs: list[tuple[str, int]] = []
    real_run = Embedder.run

    def watched(self: Embedder, inputs: list[list[int]], progress: object = None) -> list[np.ndarray]:
        runs.append((threading.current_thread().name, len(inputs)))
        return real_run(self, inputs)

    monkeypatch.setattr(Embedder, "run", watched)
    with pooled.local_worker()._cond:  # the engine thread waits on it for work: both jobs are there when it looks
        first = pooled.local_worker().embed(tokens[:2])
        second = pooled.local_worker().embed(tokens[2:3])
    together = first.result(timeout=60) + second.result(timeout=60)
    assert runs == [("localrun-pooled", 3)]  # one run, on the model's own thread
    for a, b in zip(alone, together, strict=True):
        assert np.allclose(a, b, atol=1e-4)  # alone as packed with another request's inputs


@pytest.fixture(scope="module")
def two_embedders(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Two embedding models, pulled, served on demand one at a time and unloaded after a second idle."""
    models = tmp_path_factory.mktemp("embedmodels")
    mean = llama_cpp.LLAMA_POOLING_TYPE_MEAN
    first = write_tiny_model(models / "first-embed.gguf", pooling=mean, n_embd=256, n_ff=512, n_ctx_train=2048)
    second = write_tiny_model(models / "second-embed.gguf", pooling=mean, n_embd=128, n_ff=256, seed=3)
    home = tmp_path_factory.mktemp("home")
    register_pulled(home, {"first:test": first, "second:test": second})
    yield from start(home, "--models-max", "1", "--parallel", "1", "--idle-unload", "1s", "--no-log")


def _loaded(server: Server) -> list[str]:
    body = httpx.get(server.url + "/v1/models", timeout=30).json()
    return [m["id"] for m in body["data"] if m["status"]["value"] != "unloaded"]


def test_memory_and_threads_come_back_after_embeddings_and_the_unload(two_embedders: Server) -> None:
    pid = two_embedders.proc.pid
    time.sleep(1.0)  # the server settled after it started listening
    rss_before, threads_before = _status(pid, "VmRSS"), _status(pid, "Threads")
    client = two_embedders.client()
    for turn in range(4):
        name = ("first:test", "second:test")[turn % 2]
        result = client.embeddings.create(model=name, input=TEXTS)
        assert result.model == name and len(result.data) == len(TEXTS)
        assert _loaded(two_embedders) == [name]  # --models-max 1: the other one unloaded
    deadline = time.monotonic() + 60
    while _loaded(two_embedders) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _loaded(two_embedders) == []
    time.sleep(0.5)  # the threads the unload ended have exited
    rss_after, threads_after = _status(pid, "VmRSS"), _status(pid, "Threads")
    # no decode ran on a thread that outlives the model (a pool's thread keeps its OpenMP team)
    assert threads_after == threads_before
    assert rss_after <= rss_before * 1.10, f"{rss_before / 1024:.0f} MiB before, {rss_after / 1024:.0f} MiB after"
