"""The served models in process: slots sized in the memory budget, several
models sharing it, and a request's `model` finding one of them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from localrun.assemble import Assembled, Slots, assemble
from localrun.errors import InvalidRequestError, ModelNotFoundError, UsageError
from localrun.gguf.info import describe
from localrun.gguf.reader import read_gguf
from localrun.runtime.devices import Device
from localrun.serve.prompts import prepare
from localrun.serve.router import ModelTable
from localrun.serve.schemas import ChatRequest
from localrun.serve.served import ModelPlan, ServedModel, load_models
from localrun.settings import Options, resolve
from localrun.store.registry import load as load_registry

FAKE_HOST = Device("CPU", "fake", "cpu", 0, 0)  # nothing known of memory but the budget given


def planned(model: Path, budget: int = 0, **options: Any) -> Assembled:
    """A server's plan for ``model``: slots in ``budget`` bytes (0: unknown)."""
    settings = resolve(Options(threads=1, memory_budget=budget or None, **options))
    return assemble(model, settings, workload=Slots(), devices=[FAKE_HOST], use_wisdom=False)


def plan(model: Path, ident: str = "tiny", budget: int = 0, **kw: Any) -> ModelPlan:
    return ModelPlan(ident, frozenset(), planned(model, budget), **kw)


def test_slots_fit_the_memory_budget(tiny_model: Path) -> None:
    shape = describe(read_gguf(tiny_model))
    three = shape.memory_needed(3 * 512, "f16", "f16") + 1000  # three slots of 512 and a little
    sized = planned(tiny_model, three)
    assert (sized.seq_ctx, sized.parallel) == (512, 3)  # llama-server's 4 does not fit
    assert sized.config.n_ctx == 3 * 512 and sized.config.sample_on == "host"  # the logits are made on the CPU
    assert planned(tiny_model, three, parallel=2).parallel == 2
    unknown = resolve(Options(threads=1))
    tuned = replace(unknown, parallel=6, sources={**unknown.sources, "parallel": "wisdom"})
    as_tuned = assemble(tiny_model, tuned, workload=Slots(), devices=[FAKE_HOST], use_wisdom=False)
    assert as_tuned.parallel == 6  # nothing known of memory: as tuned
    assert planned(tiny_model, ctx="300").seq_ctx == 512  # llama.cpp's step of 256
    with pytest.raises(UsageError, match="--parallel 5 with 512-token slots does not fit"):
        planned(tiny_model, three, parallel=5)
    with pytest.raises(UsageError, match="not even one slot"):
        planned(tiny_model, shape.weights_bytes)


def held_alone(model: Path) -> int:
    """What the model holds with a server's four slots, as llama.cpp logs its buffers."""
    (alone,) = load_models([plan(model, "alone", 10**9)])
    try:
        return sum(alone.held.values())
    finally:
        alone.close()


@pytest.fixture
def two(tiny_model: Path) -> Iterator[list[ServedModel]]:
    """Two models in a budget that holds the first with llama-server's four
    slots and the second with two: the second is planned against what the
    first measurably holds, not against a prediction of it."""
    shape = describe(read_gguf(tiny_model))
    per_slot = shape.memory_needed(2 * 512, "f16", "f16") - shape.memory_needed(512, "f16", "f16")
    budget = held_alone(tiny_model) + shape.memory_needed(2 * 512, "f16", "f16") + per_slot // 2
    first = replace(plan(tiny_model, "tiny", budget), names=frozenset({"qwen2.5-coder:1.5b"}))
    second = replace(first, id="other", names=frozenset())
    models = load_models([first, second])
    yield models
    for model in models:
        model.close()


def test_models_share_the_memory_budget(two: list[ServedModel]) -> None:
    assert [m.worker.parallel for m in two] == [4, 2]
    assert two[0].held["CPU"] > 0  # llama.cpp's log said what the first holds


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
    assert model.local_worker().run.prompt_cache is not None  # on by default

    def chat(*messages: tuple[str, str]) -> ChatRequest:
        return ChatRequest.model_validate({"messages": [{"role": r, "content": c} for r, c in messages]})

    a, _ = prepare(model, chat(("system", "be terse"), ("user", "hi")), 0)
    b, _ = prepare(model, chat(("system", "be terse"), ("user", "something else entirely")), 1)
    assert 0 < a.shared == b.shared < len(a.tokens)
    assert a.tokens[: a.shared] == b.tokens[: b.shared]
    assert prepare(model, chat(("user", "hi")), 2)[0].shared == 0
    (off,) = load_models([plan(tiny_model, prompt_cache=False)])
    try:
        assert off.local_worker().run.prompt_cache is None
    finally:
        off.close()
