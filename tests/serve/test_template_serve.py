"""Chat templates in `localrun serve`, with the official clients: a template
that raises for the request is a 400 naming its message on every endpoint
that renders, ``/apply-template`` shows the prompt a chat completion
evaluates (the tool block included), ``--template FILE`` replaces the GGUF's
template, and a GGUF without one gets the one its architecture implies."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import openai
import pytest
from gguf import GGUFWriter

from localrun.runtime.engine import Vocabulary
from tests.helpers import cli
from tests.serve.conftest import Server, start
from tests.synthmodels import BY_NAME, write_family_model
from tests.tinymodel import write_tiny_model
from tests.vendored import template

NEMO_MESSAGE = "Tool call IDs should be alphanumeric strings with length 9"
CALL_HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Rome?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_abc", "content": "sunny"},
]
TWO_USERS = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("served")
    nemo = write_tiny_model(folder / "nemo.gguf", chat_template=template("mistralai-Mistral-Nemo-Instruct-2407"))
    with pytest.MonkeyPatch.context() as patch:  # a Gemma 3 whose converter wrote no chat template
        patch.setattr(GGUFWriter, "add_chat_template", lambda self, text: None)
        gemma = write_family_model(BY_NAME["gemma3"], folder / "gemma3-bare.gguf")
    plain = write_tiny_model(folder / "plain.gguf", chat_template=None)
    jinja = folder / "brackets.jinja"
    jinja.write_text("{% for m in messages %}[[{{ m.role }}: {{ m.content }}]]{% endfor %}")
    return {"nemo": nemo, "gemma": gemma, "plain": plain, "jinja": jinja}


@pytest.fixture(scope="module")
def mixed(files: dict[str, Path], long_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    home = tmp_path_factory.mktemp("home")
    models = ("-m", str(files["nemo"]), "-m", str(files["gemma"]), "-m", str(long_model))
    yield from start(home, *models, "--parallel", "1", "--ctx", "4096")


@pytest.fixture(scope="module")
def filed(files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    home = tmp_path_factory.mktemp("home")
    yield from start(home, "-m", str(files["plain"]), "--template", str(files["jinja"]), "--parallel", "1")


def _apply(server: Server, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + "/apply-template", json=body, timeout=60)


def test_a_template_that_raises_is_a_400_naming_its_message(mixed: Server) -> None:
    client = mixed.client()
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="nemo", messages=CALL_HISTORY, max_tokens=2)  # type: ignore[arg-type]
    assert raised.value.status_code == 400 and NEMO_MESSAGE in str(raised.value.body)
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="nemo", messages=TWO_USERS, max_tokens=2, stream=True)  # type: ignore[arg-type]
    assert "alternate" in str(raised.value.body)
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model="nemo", input=TWO_USERS, max_output_tokens=16)  # type: ignore[arg-type]
    assert "alternate" in str(raised.value.body)
    claude = anthropic.Anthropic(base_url=mixed.url, api_key="none", max_retries=0, timeout=60)
    with claude, pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(model="nemo", max_tokens=2, messages=TWO_USERS)  # type: ignore[arg-type]
    assert "alternate" in str(refused.value.body)
    response = _apply(mixed, {"model": "nemo", "messages": CALL_HISTORY})
    assert response.status_code == 400 and NEMO_MESSAGE in response.json()["error"]["message"]
    assert "Traceback" not in mixed.log
    # a conversation the template takes is served
    reply = client.chat.completions.create(model="nemo", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert reply.usage is not None and reply.usage.completion_tokens == 2


def test_apply_template_is_the_prompt_a_completion_evaluates_tool_block_and_all(
    mixed: Server, long_model: Path
) -> None:
    body: dict[str, Any] = {"model": "tiny-long", "messages": [{"role": "user", "content": "Weather in Rome?"}]}
    prompt = _apply(mixed, body | {"tools": TOOLS}).json()["prompt"]
    assert "get_weather" in prompt and "The weather in a city" in prompt  # described in the system prompt
    assert prompt != _apply(mixed, body).json()["prompt"]
    reply = mixed.client().chat.completions.create(
        model="tiny-long",
        messages=body["messages"],
        tools=TOOLS,  # type: ignore[arg-type]
        max_tokens=1,
    )
    assert reply.usage is not None
    with Vocabulary(long_model) as vocabulary:
        counted = len(vocabulary.tokenize(prompt, add_special=vocabulary.add_bos))
    assert reply.usage.prompt_tokens == counted


def test_a_gguf_without_a_template_gets_its_architectures(mixed: Server) -> None:
    body = {"model": "gemma3-bare", "messages": [{"role": "system", "content": "Be brief."}, *TWO_USERS[:1]]}
    response = _apply(mixed, body)
    assert response.status_code == 200, response.text
    assert response.json()["prompt"] == "<start_of_turn>user\nBe brief.\n\na<end_of_turn>\n<start_of_turn>model\n"
    said = [line for line in mixed.lines if "gemma3-bare" in line and "chat template" in line]
    assert len(said) == 1 and "built-in gemma template" in said[0], mixed.log
    reply = mixed.client().chat.completions.create(model="gemma3-bare", messages=TWO_USERS[:1], max_tokens=2)  # type: ignore[arg-type]
    assert reply.usage is not None and reply.usage.completion_tokens == 2


def test_serve_template_file_replaces_the_ggufs(filed: Server) -> None:
    response = _apply(filed, {"messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 200 and response.json()["prompt"] == "[[user: hi]]"
    reply = filed.client().chat.completions.create(
        model="plain", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert reply.usage is not None and reply.usage.completion_tokens == 2
    assert not [line for line in filed.lines if "no chat template" in line]


def test_serve_refuses_a_template_file_that_does_not_compile(files: dict[str, Path], tmp_path: Path) -> None:
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% if messages %}")
    res = cli("serve", "-m", str(files["plain"]), "--port", "0", "--template", str(broken))
    assert res.returncode == 2 and "not a Jinja template" in res.stderr
    res = cli("serve", "-m", str(files["plain"]), "--port", "0", "--template", str(tmp_path / "none.jinja"))
    assert res.returncode == 2 and "no such file" in res.stderr
