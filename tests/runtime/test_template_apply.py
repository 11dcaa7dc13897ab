"""The prompt a conversation renders to, where a user asks for it: `localrun serve`'s
``POST /apply-template`` (llama-server's endpoint) and `localrun template`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from localrun.assemble import Slots, assemble
from localrun.runtime.chat_request import render_request
from localrun.runtime.devices import Device
from localrun.runtime.model_template import model_template
from localrun.serve.app import create_app
from localrun.serve.router import ModelTable
from localrun.serve.served import ModelPlan, ServedModel, load_models
from localrun.settings import Options, resolve
from localrun.store.registry import load as load_registry
from tests.helpers import cli
from tests.tinymodel import write_tiny_model
from tests.vendored import template

HOST = Device("CPU", "fake", "cpu", 0, 0)  # nothing known of memory: the default slots

QWEN3 = template("Qwen-Qwen3-0.6B")
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALL: dict[str, Any] = {
    "messages": [
        {"role": "user", "content": "Weather in Rome?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ],
    "tools": [WEATHER],
}


@pytest.fixture(scope="module")
def qwen3_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("qwen3") / "qwen3-tiny.gguf", chat_template=QWEN3)


@pytest.fixture(scope="module")
def served(qwen3_model: Path) -> Iterator[ServedModel]:
    settings = resolve(Options(threads=1))
    run = assemble(qwen3_model, settings, workload=Slots(), devices=[HOST], use_wisdom=False)
    plan = ModelPlan("qwen3-tiny", frozenset(), run)
    (model,) = load_models([plan])
    try:
        yield model
    finally:
        model.close()


@pytest.fixture
def client(served: ServedModel) -> Iterator[TestClient]:
    """httpx against the app in this process."""
    with TestClient(create_app(ModelTable([served], load_registry())), base_url="http://127.0.0.1") as http:
        yield http


def _expected(body: dict[str, Any]) -> str:
    return render_request(QWEN3, body, bos_token="<|endoftext|>", eos_token="<|endoftext|>")


def test_apply_template_answers_the_prompt(client: TestClient) -> None:
    body = {"model": "qwen3-tiny", "messages": [{"role": "user", "content": "Hi"}]}
    response = client.post("/apply-template", json=body)
    assert response.status_code == 200, response.text
    assert response.json() == {"prompt": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"}


def test_apply_template_tool_call_and_switches(client: TestClient) -> None:
    response = client.post("/apply-template", json={**CALL, "chat_template_kwargs": {"enable_thinking": False}})
    prompt = response.json()["prompt"]
    # the arguments, sent as a JSON string, reach the template as an object it writes out again
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>' in prompt
    assert "<tool_response>\nsunny\n</tool_response>" in prompt
    assert '"name": "get_weather"' in prompt.split("<|im_start|>user")[0]  # offered in the system turn
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # thinking switched off
    assert prompt == _expected({**CALL, "chat_template_kwargs": {"enable_thinking": False}})
    effort_none = client.post("/apply-template", json={**CALL, "reasoning_effort": "none"})
    assert effort_none.json()["prompt"] == prompt


def test_apply_template_refuses_a_broken_body(client: TestClient) -> None:
    response = client.post("/apply-template", json={"messages": "hello"})
    assert response.status_code == 400
    assert "messages" in response.json()["error"]["message"]
    bad_args = {"messages": [CALL["messages"][0], {**CALL["messages"][1], "tool_calls": [{"type": "function"}]}]}
    assert client.post("/apply-template", json=bad_args).status_code == 400


def test_cli_prints_the_exact_prompt(qwen3_model: Path, tmp_path: Path) -> None:
    res = cli("template", "-m", str(qwen3_model), "Hi", "--system", "Be brief.")
    assert res.returncode == 0, res.stderr
    assert res.stdout == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    conversation = tmp_path / "call.json"
    conversation.write_text(json.dumps(CALL))
    res = cli("template", "-m", str(qwen3_model), "--messages", str(conversation), "--think", "off")
    assert res.returncode == 0, res.stderr
    assert res.stdout == _expected({**CALL, "chat_template_kwargs": {"enable_thinking": False}})
    messages = tmp_path / "messages.json"
    messages.write_text(json.dumps(CALL["messages"]))
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(CALL["tools"]))
    res = cli("template", "-m", str(qwen3_model), "--messages", str(messages), "--tools", str(tools))
    assert res.stdout == _expected(CALL)
    res = cli("template", "-m", str(qwen3_model), "Hi", "--no-generation-prompt")
    assert res.stdout == "<|im_start|>user\nHi<|im_end|>\n"


def test_cli_source_and_errors(qwen3_model: Path, tmp_path: Path) -> None:
    res = cli("template", "-m", str(qwen3_model), "--source")
    assert res.returncode == 0 and res.stdout.rstrip("\n") == QWEN3.rstrip("\n")
    res = cli("template", "-m", str(qwen3_model))
    assert res.returncode == 2 and "no conversation" in res.stderr
    res = cli("template", "-m", str(qwen3_model), "Hi", "--think", "maybe")
    assert res.returncode == 2 and "--think" in res.stderr
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    res = cli("template", "-m", str(qwen3_model), "--messages", str(broken))
    assert res.returncode == 2 and "not JSON" in res.stderr
    res = cli("template", "-m", str(qwen3_model), "Hi", "--template", "chatml")
    assert res.stdout == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_model_template_reads_the_gguf(qwen3_model: Path) -> None:
    found = model_template(qwen3_model)
    assert (found.source, found.bos_token, found.eos_token, found.add_bos) == (
        QWEN3,
        "<|endoftext|>",
        "<|endoftext|>",
        False,
    )
