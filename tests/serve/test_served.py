"""The served models in process: slots sized in the memory budget, several
models sharing it, and a request's `model` finding one of them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from localrun.errors import InvalidRequestError, ModelNotFoundError, UsageError
from localrun.gguf.info import describe
from localrun.gguf.reader import read_gguf
from localrun.runtime.engine import EngineConfig
from localrun.runtime.placement import place
from localrun.serve.prompts import prepare
from localrun.serve.schemas import ChatRequest
from localrun.serve.served import ModelPlan, ModelTable, ServedModel, load_models, slots_for
from localrun.store.registry import load as load_registry


def plan(model: Path, ident: str = "tiny", **kw: object) -> ModelPlan:
    info = read_gguf(model)
    return ModelPlan(ident, frozenset(), EngineConfig(model_path=model, n_threads=1), info, **kw)  # type: ignore[arg-type]


def test_slots_fit_the_memory_budget(tiny_model: Path) -> None:
    shape = describe(read_gguf(tiny_model))
    three = shape.memory_needed(3 * 512, "f16", "f16") + 1000  # three slots of 512 and a little
    assert slots_for(plan(tiny_model), shape, three) == (512, 3)  # llama-server's 4 does not fit
    assert slots_for(plan(tiny_model, parallel=2), shape, three) == (512, 2)
    assert slots_for(plan(tiny_model, tuned=6), shape, 0) == (512, 6)  # nothing known of memory: as tuned
    assert slots_for(plan(tiny_model, slot_ctx=300), shape, 0)[0] == 512  # llama.cpp's step of 256
    with pytest.raises(UsageError, match="--parallel 5 with 512-token slots does not fit"):
        slots_for(plan(tiny_model, parallel=5), shape, three)
    with pytest.raises(UsageError, match="not even one slot"):
        slots_for(plan(tiny_model), shape, shape.weights_bytes)


@pytest.fixture
def two(tiny_model: Path) -> Iterator[list[ServedModel]]:
    """Two models in a budget that holds five slots in all: the first takes
    llama-server's four, the second what is left."""
    shape = describe(read_gguf(tiny_model))
    per_slot = shape.memory_needed(2 * 512, "f16", "f16") - shape.memory_needed(512, "f16", "f16")
    budget = shape.memory_needed(4 * 512, "f16", "f16") + shape.memory_needed(512, "f16", "f16") + per_slot // 2
    first = plan(tiny_model, "tiny")
    first = replace(
        first,
        names=frozenset({"qwen2.5-coder:1.5b"}),
        config=replace(first.config, placement=place((), memory_budget=budget)),
    )
    second = replace(first, id="other", names=frozenset())
    models = load_models([first, second])
    yield models
    for model in models:
        model.close()


def test_models_share_the_memory_budget(two: list[ServedModel]) -> None:
    assert [m.worker.parallel for m in two] == [4, 1]


def test_a_request_names_a_served_model(two: list[ServedModel], tiny_model: Path) -> None:
    table = ModelTable(two, load_registry())
    assert table.find("tiny") is two[0] and table.find("other") is two[1]
    assert table.find(None) is two[0]  # no model: the first
    assert table.find("qwen2.5-coder") is two[0]  # a registry alias of a name it answers to
    for path in (str(tiny_model), "tiny.gguf", "~/models/x", "a/b/c"):
        with pytest.raises(InvalidRequestError, match="file path"):
            table.find(path)
    for name in ("llama3.2:1b", "owner/repo:Q4_K_M", "nothing"):
        with pytest.raises(ModelNotFoundError):
            table.find(name)


def test_a_system_prompt_is_the_prefix_the_prompt_cache_keeps(two: list[ServedModel], tiny_model: Path) -> None:
    model = two[0]
    assert model.worker.run.prompt_cache is not None  # on by default

    def chat(*messages: tuple[str, str]) -> ChatRequest:
        return ChatRequest.model_validate({"messages": [{"role": r, "content": c} for r, c in messages]})

    a, _ = prepare(model, chat(("system", "be terse"), ("user", "hi")), 0)
    b, _ = prepare(model, chat(("system", "be terse"), ("user", "something else entirely")), 1)
    assert 0 < a.shared == b.shared < len(a.tokens)
    assert a.tokens[: a.shared] == b.tokens[: b.shared]
    assert prepare(model, chat(("user", "hi")), 2)[0].shared == 0
    (off,) = load_models([plan(tiny_model, prompt_cache=False)])
    try:
        assert off.worker.run.prompt_cache is None
    finally:
        off.close()
