"""`localrun serve -m ...`: the models given answer to their file's own name,
pulled models still load on demand beside them, and a model without a chat
template is said at start."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import openai
import pytest

from scripts.bench_router import register_pulled
from tests.serve.conftest import Server, start
from tests.tinymodel import write_tiny_model

ALPHA, BETA = "alpha:test", "beta:test"


@pytest.fixture(scope="module")
def given(tiny_model: Path, wide_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    home = tmp_path_factory.mktemp("home")
    register_pulled(home, {ALPHA: tiny_model, BETA: wide_model})
    files = tmp_path_factory.mktemp("files")
    local = shutil.copy(tiny_model, files / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    plain = write_tiny_model(files / "plain-base.gguf", chat_template=None)
    yield from start(home, "-m", str(local), "-m", ALPHA, "-m", str(plain), "--parallel", "1", "--ctx", "512")


def chat(client: openai.OpenAI, model: str) -> str:
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    return reply.model


def test_a_model_given_answers_to_its_file_name(given: Server) -> None:
    client = given.client()
    for name in ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m"):
        assert chat(client, name) == "qwen2.5-coder-0.5b-instruct-q4_k_m"
    for name in (ALPHA, "alpha.gguf", "alpha"):  # a pulled model given by its alias: its file's name too
        assert chat(client, name) == ALPHA


def test_pulled_models_still_load_on_demand_beside_the_ones_given(given: Server) -> None:
    statuses = {m["id"]: m["status"] for m in httpx.get(given.url + "/v1/models", timeout=30).json()["data"]}
    assert statuses[BETA]["value"] == "unloaded" and statuses[ALPHA]["pinned"] is True
    assert len([s for s in statuses.values() if s["pinned"]]) == 3  # alpha given with -m is not listed twice
    assert chat(given.client(), BETA) == BETA
    loaded = {m["id"]: m["status"] for m in httpx.get(given.url + "/v1/models", timeout=30).json()["data"]}
    assert loaded[BETA]["value"] == "loaded" and not loaded[BETA]["pinned"]


def test_a_model_without_a_chat_template_is_said_at_start(given: Server) -> None:
    said = [line for line in given.lines if "plain-base" in line and "chat template" in line]
    assert len(said) == 1, given.log
    assert "--template" in said[0] and "/v1/completions" in said[0]
    assert not any("qwen2.5-coder" in line and "chat template" in line for line in given.lines)
    with pytest.raises(openai.BadRequestError):  # as it says
        chat(given.client(), "plain-base")
