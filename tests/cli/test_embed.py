"""`localrun embed`: lines in, one JSON vector a line out."""

from __future__ import annotations

import json
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from tests.helpers import cli
from tests.tinymodel import write_tiny_model


@pytest.fixture(scope="module")
def embed_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("embed") / "mean.gguf"
    return write_tiny_model(path, pooling=llama_cpp.LLAMA_POOLING_TYPE_MEAN)


def test_one_vector_per_line_in_order(embed_model: Path) -> None:
    lines = ["the cat sat", "hello there", "the cat sat"]
    result = cli("embed", "-m", str(embed_model), "--threads", "1", input="\n".join(lines) + "\n")
    assert result.returncode == 0, result.stderr
    vectors = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(vectors) == 3 and all(len(v) == 64 for v in vectors)
    assert all(abs(float(np.linalg.norm(v)) - 1) < 1e-4 for v in vectors)
    assert np.allclose(vectors[0], vectors[2], atol=1e-5) and not np.allclose(vectors[0], vectors[1], atol=1e-2)
    assert result.stderr == ""  # no progress off a terminal


def test_json_records_keep_their_ids(embed_model: Path) -> None:
    records = [{"text": "hello", "id": "a"}, {"text": "world"}]
    result = cli("embed", "-m", str(embed_model), "--json", input="\n".join(json.dumps(r) for r in records))
    assert result.returncode == 0, result.stderr
    out = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["index"] for r in out] == [0, 1] and out[0]["id"] == "a" and "id" not in out[1]
    plain = cli("embed", "-m", str(embed_model), input="hello\n")
    assert np.allclose(out[0]["vector"], json.loads(plain.stdout), atol=1e-5)


@pytest.mark.parametrize(
    ("stdin", "says"),
    [("", "stdin is empty"), ("one\n\nthree\n", "line 2 is empty"), ("word " * 700, "line 1 is")],
)
def test_bad_input_is_named(embed_model: Path, stdin: str, says: str) -> None:
    result = cli("embed", "-m", str(embed_model), input=stdin)
    assert result.returncode != 0 and says in result.stderr and result.stdout == ""


def test_json_lines_must_be_records(embed_model: Path) -> None:
    result = cli("embed", "-m", str(embed_model), "--json", input='{"text": "ok"}\n["no"]\n')
    assert result.returncode != 0 and 'line 2 has no "text"' in result.stderr


def test_a_missing_model_and_a_model_without_pooling(tmp_path: Path) -> None:
    missing = cli("embed", "-m", str(tmp_path / "none.gguf"), input="hello\n")
    assert missing.returncode != 0 and "not found" in missing.stderr
    plain = write_tiny_model(tmp_path / "plain.gguf")
    refused = cli("embed", "-m", str(plain), input="hello\n")
    assert refused.returncode != 0 and "not an embedding model" in refused.stderr and "--pooling" in refused.stderr
    pooled = cli("embed", "-m", str(plain), "--pooling", "mean", input="hello\n")
    assert pooled.returncode == 0 and len(json.loads(pooled.stdout)) == 64


def test_without_a_model_it_says_how_to_pick_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default model is for chat: nothing is looked up (let alone pulled) before the user picks one."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # never the network, whatever the command would look for
    refused = cli("embed", input="hello\n")
    assert refused.returncode == 2 and not refused.stdout
    error, hint = refused.stderr.splitlines()
    assert error == "error: embed needs an embedding model: give -m MODEL"
    assert "-m nomic-embed-text:v1.5" in hint and "Embeddings family" in hint and "--pooling mean" in hint
    pooled = cli("embed", "--pooling", "mean", input="hello\n")  # asked to pool: the default model, as said
    assert pooled.returncode == 3 and "qwen2.5-coder:1.5b is not downloaded" in pooled.stderr
