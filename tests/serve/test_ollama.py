"""ollama's API through `localrun serve`, driven with the official `ollama`
client: chat and generate (whole, streamed as NDJSON), options, format,
tools, think, embed, the model listings, and errors in ollama's shape."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import llama_cpp
import numpy as np
import ollama
import pytest

from localrun.errors import InvalidRequestError
from localrun.serve import ollama as api
from scripts.bench_router import register_pulled
from tests.serve.conftest import Server, start
from tests.serve.test_tools import SCHEMAS, TOOLS
from tests.tinymodel import THINK_TOKENS, THINKING_CHATML, write_tiny_model

KEY = "ollama-key-31"
MODEL = "tiny-long:latest"  # the served id is tiny-long: ollama's default tag is taken
QUESTION = [{"role": "user", "content": "What's the weather in Lisbon?"}]
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def server(long_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A chat model with room for tools, a thinking model and an embedding model, behind a key."""
    models = tmp_path_factory.mktemp("ollamamodels")
    thinker = write_tiny_model(
        models / "thinker.gguf", chat_template=THINKING_CHATML, extra_tokens=THINK_TOKENS, n_ctx_train=1024
    )
    embed = write_tiny_model(models / "mean-embed.gguf", pooling=llama_cpp.LLAMA_POOLING_TYPE_MEAN)
    home = tmp_path_factory.mktemp("home")
    args = ["-m", str(long_model), "-m", str(thinker), "-m", str(embed), "--ctx", "8192", "--parallel", "2"]
    yield from start(home, *args, "--api-key", KEY)


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[ollama.Client]:
    with ollama.Client(host=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as client:
        yield client


def _post(server: Server, path: str, body: dict[str, Any], key: str = KEY) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120)


# ---------------------------------------------------------- the models --


def test_list_show_ps_and_version(server: Server, client: ollama.Client, long_model: Path) -> None:
    listed = {m.model: m for m in client.list().models}
    assert set(listed) == {"tiny-long:latest", "thinker:latest", "mean-embed:latest"}
    tiny = listed["tiny-long:latest"]
    assert tiny.size == long_model.stat().st_size
    assert tiny.details is not None and tiny.details.format == "gguf" and tiny.details.family == "llama"
    assert tiny.digest and len(tiny.digest) == 64

    shown = client.show("tiny-long")
    assert shown.capabilities == ["completion", "tools"]
    assert shown.template is not None and "<|im_start|>" in shown.template
    assert shown.modelinfo is not None and shown.modelinfo["general.architecture"] == "llama"
    assert shown.modelinfo["llama.context_length"] == 32768
    assert client.show("thinker").capabilities == ["completion", "tools", "thinking"]
    assert client.show("mean-embed:latest").capabilities == ["embedding"]

    running = {m.model: m for m in client.ps().models}
    assert set(running) == set(listed)  # all given with -m: loaded, and never unloaded
    assert running["tiny-long:latest"].context_length == 8192
    assert running["tiny-long:latest"].expires_at is not None and running["tiny-long:latest"].expires_at.year == 9999

    version = httpx.get(server.url + "/api/version", headers={"Authorization": f"Bearer {KEY}"})
    assert version.status_code == 200 and version.json() == {"version": api.VERSION}


# ------------------------------------------------------ chat, generate --


def test_chat_whole_and_streamed(client: ollama.Client) -> None:
    options = {"num_predict": 12, **GREEDY}
    whole = client.chat(model=MODEL, messages=QUESTION, options=options)
    assert whole.done and whole.done_reason == "length" and whole.eval_count == 12
    assert whole.model == MODEL and whole.message.role == "assistant" and whole.message.content
    assert whole.prompt_eval_count and whole.prompt_eval_count > 10 and whole.total_duration
    parts = list(client.chat(model=MODEL, messages=QUESTION, options=options, stream=True))
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    assert parts[-1].eval_count == 12 and parts[-1].done_reason == "length"


def test_options_reach_the_sampler(client: ollama.Client) -> None:
    hot = {"num_predict": 10, "temperature": 1.5, "top_p": 1.0}
    first = client.chat(model=MODEL, messages=QUESTION, options={**hot, "seed": 7}).message.content
    again = client.chat(model=MODEL, messages=QUESTION, options={**hot, "seed": 7}).message.content
    other = client.chat(model=MODEL, messages=QUESTION, options={**hot, "seed": 8}).message.content
    assert first == again and other != first
    stopped = client.generate(model=MODEL, prompt="hi", options={"num_predict": 40, **GREEDY}).response or ""
    cut = stopped[5:7]  # a stop string inside the greedy reply ends it before there
    short = client.generate(model=MODEL, prompt="hi", options={"num_predict": 40, "stop": [cut], **GREEDY})
    assert len(cut) == 2 and short.done_reason == "stop" and short.response is not None
    assert cut not in short.response and stopped.startswith(short.response)


def test_repeat_last_n_is_the_penalty_window(client: ollama.Client) -> None:
    """A strong repeat penalty changes the greedy reply; a window of 0 turns it
    off, and a window of the whole context (-1) holds the reply as 64 does."""
    base = {"num_predict": 48, **GREEDY}

    def reply(**options: Any) -> str:
        return client.generate(model=MODEL, prompt="hi", raw=True, options=base | options).response or ""

    plain = reply()
    penalized = reply(repeat_penalty=3.0)
    assert penalized != plain
    assert reply(repeat_penalty=3.0, repeat_last_n=0) == plain
    assert reply(repeat_penalty=3.0, repeat_last_n=-1) == penalized  # the 48 tokens fit either window
    assert reply(repeat_penalty=3.0, repeat_last_n=1) != penalized


def test_num_keep_is_refused_unless_it_keeps_all(client: ollama.Client) -> None:
    """The server never shifts the context nor cuts a prompt: nothing counts
    the tokens num_keep would keep, so a count is refused, not ignored."""
    with pytest.raises(ollama.ResponseError) as caught:
        client.generate(model=MODEL, prompt="hi", options={"num_keep": 4, "num_predict": 2})
    assert caught.value.status_code == 400 and caught.value.error.startswith("options.num_keep")
    assert "never shifts the context" in caught.value.error
    kept = client.generate(model=MODEL, prompt="hi", options={"num_keep": -1, "num_predict": 2, **GREEDY})
    assert kept.done and kept.eval_count == 2


def test_generate_templated_raw_and_streamed(client: ollama.Client) -> None:
    options = {"num_predict": 8, **GREEDY}
    whole = client.generate(model=MODEL, prompt="Once upon a time", system="be brief", options=options)
    assert whole.done and whole.eval_count == 8 and whole.response
    parts = list(
        client.generate(model=MODEL, prompt="Once upon a time", system="be brief", options=options, stream=True)
    )
    assert "".join(p.response or "" for p in parts) == whole.response and parts[-1].done
    raw = client.generate(model=MODEL, prompt="Once upon a time", raw=True, options=options)
    assert raw.prompt_eval_count is not None and whole.prompt_eval_count is not None
    assert raw.prompt_eval_count < whole.prompt_eval_count  # no template, no system prompt around it


def test_streaming_is_the_default_as_ndjson(server: Server) -> None:
    body = {"model": MODEL, "messages": QUESTION, "options": {"num_predict": 5}}
    with httpx.stream(
        "POST", server.url + "/api/chat", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=120
    ) as response:
        assert response.headers["content-type"] == "application/x-ndjson"
        lines = [json.loads(line) for line in response.iter_lines() if line]
    assert len(lines) > 1 and lines[-1]["done"] is True and lines[-1]["eval_count"] == 5
    assert all(line["done"] is False for line in lines[:-1])


def test_format_json_schema_is_followed(server: Server, client: ollama.Client) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer", "maximum": 99}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    options = {"num_predict": 80, "temperature": 1.0, "seed": 3}
    reply = client.chat(model=MODEL, messages=[{"role": "user", "content": "a person"}], format=schema, options=options)
    assert reply.done_reason == "stop"
    jsonschema.validate(json.loads(reply.message.content or ""), schema)
    loose = client.generate(model=MODEL, prompt="a person", format="json", options=options)
    openai = server.client().chat.completions.create(
        model="tiny-long",
        messages=[{"role": "user", "content": "a person"}],
        response_format={"type": "json_object"},
        max_tokens=80,
        temperature=1.0,
        seed=3,
    )
    assert loose.response and loose.response == openai.choices[0].message.content and loose.response.startswith("{")


def test_think_false_turns_thinking_off(client: ollama.Client) -> None:
    """The tiny thinker never closes its thinking: asked to think, all of the reply is thinking."""
    hello: Any = [{"role": "user", "content": "hello"}]
    options = {"num_predict": 10, **GREEDY}
    thinking = client.chat(model="thinker", messages=hello, options=options, think=True)
    assert thinking.message.thinking and not thinking.message.content
    plain = client.chat(model="thinker", messages=hello, options=options, think=False)
    assert plain.message.content and not plain.message.thinking
    streamed = list(client.chat(model="thinker", messages=hello, options=options, think=True, stream=True))
    assert "".join(p.message.thinking or "" for p in streamed) == thinking.message.thinking
    told = client.generate(model="thinker", prompt="hello", think=False, options={"num_predict": 6, **GREEDY})
    assert told.response and not told.thinking


# ---------------------------------------------------------------- tools --


def _check(calls: Any) -> None:
    assert calls
    for call in calls:
        assert call.function.name in SCHEMAS
        jsonschema.validate(dict(call.function.arguments), SCHEMAS[call.function.name])


def test_tool_calls_whole_streamed_and_a_loop(server: Server, client: ollama.Client) -> None:
    """ollama has no tool_choice (localrun takes OpenAI's): required makes the tiny model call, every call valid."""
    body = {"model": MODEL, "messages": QUESTION, "tools": TOOLS, "tool_choice": "required", "stream": False}
    body["options"] = {"num_predict": 200, "seed": 1, "temperature": 1.0}
    whole = ollama.ChatResponse.model_validate(_post(server, "/api/chat", body).json())
    _check(whole.message.tool_calls)
    assert whole.message.tool_calls is not None and len(whole.message.tool_calls) == 1  # required: one call
    with httpx.stream(
        "POST",
        server.url + "/api/chat",
        json=body | {"stream": True},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=120,
    ) as response:
        parts = [ollama.ChatResponse.model_validate_json(line) for line in response.iter_lines() if line]
    streamed = [c for p in parts for c in p.message.tool_calls or []]
    assert [c.function.model_dump() for c in streamed] == [c.function.model_dump() for c in whole.message.tool_calls]

    call = whole.message.tool_calls[0]
    history: Any = [
        *QUESTION,
        {"role": "assistant", "content": "", "tool_calls": [{"function": call.function.model_dump()}]},
        {"role": "tool", "content": json.dumps({"temperature": 18}), "tool_name": call.function.name},
    ]
    final = client.chat(model=MODEL, messages=history, tools=TOOLS, options={"num_predict": 12, **GREEDY})
    assert final.done and final.message.content is not None
    alone = client.chat(model=MODEL, messages=QUESTION, tools=TOOLS, options={"num_predict": 12, **GREEDY})
    assert final.prompt_eval_count and alone.prompt_eval_count and final.prompt_eval_count > alone.prompt_eval_count
    for reply in (final, alone):  # auto: any call made is a declared one with valid arguments
        if reply.message.tool_calls:
            _check(reply.message.tool_calls)


# ------------------------------------------------------------ embeddings --


def test_embed_is_the_embeddings_endpoints_vector(server: Server, client: ollama.Client) -> None:
    texts = ["the cat sat on the mat", "hello there"]
    embedded = client.embed(model="mean-embed", input=texts)
    assert embedded.model == "mean-embed" and len(embedded.embeddings) == 2
    assert [len(v) for v in embedded.embeddings] == [64, 64] and embedded.prompt_eval_count
    openai = server.client().embeddings.create(model="mean-embed", input=texts, encoding_format="float")
    for ours, theirs in zip(embedded.embeddings, openai.data, strict=True):
        assert np.allclose(ours, theirs.embedding, atol=1e-5)
    older = client.embeddings(model="mean-embed", prompt=texts[1])
    assert np.allclose(older.embedding, embedded.embeddings[1], atol=1e-5)
    with pytest.raises(ollama.ResponseError) as caught:
        client.embed(model=MODEL, input="hi")
    assert caught.value.status_code == 400 and "not an embedding model" in caught.value.error


def test_embed_truncate_cuts_an_input_over_the_context_or_refuses_it(client: ollama.Client) -> None:
    """ollama's default cuts an input to the context (its first tokens kept);
    truncate false makes one over it an error."""
    head = "the cat sat on the mat " * 800  # more tokens than the context holds
    cut = client.embed(model="mean-embed", input=[head + "and then it rained", head + "a different ending"])
    assert np.allclose(cut.embeddings[0], cut.embeddings[1], atol=1e-6)  # only what is past the context differs
    other = client.embed(model="mean-embed", input="a dog " + head)
    assert not np.allclose(other.embeddings[0], cut.embeddings[0])
    with pytest.raises(ollama.ResponseError) as caught:
        client.embed(model="mean-embed", input=head, truncate=False)
    assert caught.value.status_code == 400 and "the context holds" in caught.value.error
    fits = client.embed(model="mean-embed", input="hello there", truncate=False)
    assert np.allclose(fits.embeddings[0], client.embed(model="mean-embed", input="hello there").embeddings[0])


# --------------------------------------------------------------- errors --


def test_errors_in_ollamas_shape(server: Server, client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model="no-such-model", messages=QUESTION)
    assert caught.value.status_code == 404 and "no-such-model" in caught.value.error
    raw = _post(server, "/api/chat", {"model": "no-such-model:7b", "messages": QUESTION})
    assert raw.status_code == 404 and list(raw.json()) == ["error"] and isinstance(raw.json()["error"], str)
    with pytest.raises(ollama.ResponseError) as caught:
        client.show("no-such-model")
    assert caught.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model=MODEL, messages=QUESTION, options={"mirostat": 2})
    assert caught.value.status_code == 400 and "options.mirostat" in caught.value.error
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model=MODEL, messages=QUESTION, options={"temperature": -1})
    assert caught.value.status_code == 400 and caught.value.error.startswith("options.temperature")
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model=MODEL, messages=[{"role": "user", "content": "what?", "images": ["iVBORw0KGgo="]}])
    assert "images are not supported by this model" in caught.value.error
    assert _post(server, "/api/show", {"model": MODEL}, key="wrong").status_code == 401
    wrong = httpx.get(server.url + "/api/tags", headers={"Authorization": "Bearer wrong"})
    assert wrong.status_code == 401 and list(wrong.json()) == ["error"]


def test_no_prompt_loads_the_model(client: ollama.Client) -> None:
    loaded = client.generate(model=MODEL)
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""
    chat = client.chat(model="thinker", messages=[])
    assert chat.done and chat.done_reason == "load"
    with pytest.raises(ollama.ResponseError) as caught:  # given with -m: it stays
        client.generate(model=MODEL, keep_alive=0)
    assert caught.value.status_code == 400 and "stays loaded" in caught.value.error


@pytest.fixture(scope="module")
def on_demand(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A pulled model, served on demand (no -m)."""
    home = tmp_path_factory.mktemp("home")
    register_pulled(home, {"alpha:test": tiny_model})
    yield from start(home, "--parallel", "1", "--ctx", "512")


def test_keep_alive_loads_holds_and_unloads_a_model_on_demand(on_demand: Server, tiny_model: Path) -> None:
    with ollama.Client(host=on_demand.url, timeout=120) as client:
        (listed,) = client.list().models  # read from the file, not loaded
        assert listed.model == "alpha:test" and listed.size == tiny_model.stat().st_size
        assert listed.details is not None and listed.details.quantization_level == "F32"
        assert client.show("alpha:test").capabilities == ["completion", "tools"]
        assert client.ps().models == []
        loaded = client.generate(model="alpha:test", keep_alive="1h")
        assert loaded.done_reason == "load"
        (running,) = client.ps().models
        assert running.model == "alpha:test" and running.size and running.context_length == 512
        assert running.expires_at is not None
        left = (running.expires_at - datetime.now(UTC)).total_seconds()
        assert 300 < left <= 3600  # the hour asked for, not the server's 5 minutes
        assert client.generate(model="alpha:test", keep_alive=0).done_reason == "unload"
        assert client.ps().models == []


@pytest.fixture(scope="module")
def from_folder(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A model in --models-dir, served on demand."""
    folder = tmp_path_factory.mktemp("ggufs")
    shutil.copy(tiny_model, folder / "first.gguf")
    yield from start(tmp_path_factory.mktemp("home"), "--models-dir", str(folder), "--parallel", "1", "--ctx", "512")


def test_a_models_dir_model_is_listed_with_its_file_before_it_loads(from_folder: Server, tiny_model: Path) -> None:
    with ollama.Client(host=from_folder.url, timeout=120) as client:
        listed = {m.model: m for m in client.list().models}
        assert client.ps().models == []  # nothing loaded: the listing read the file
        first = listed["first:latest"]
        assert first.size == tiny_model.stat().st_size
        assert first.details is not None and first.details.family == "llama"
        assert first.details.quantization_level == "F32"


# ------------------------------------------------------- the translation --


def test_messages_tie_each_result_to_its_call() -> None:
    given = [
        {"role": "user", "content": "weather and time?"},
        {
            "role": "assistant",
            "content": "",
            "thinking": "two calls",
            "tool_calls": [
                {"function": {"name": "get_weather", "arguments": {"city": "Lisbon", "unit": "celsius"}}},
                {"function": {"name": "get_time", "arguments": {"tz": 0}}},
            ],
        },
        {"role": "tool", "content": "12:00", "tool_name": "get_time"},
        {"role": "tool", "content": "18C", "tool_name": "get_weather"},
    ]
    out = api.messages(given)
    assistant = out[1]
    assert assistant["reasoning_content"] == "two calls" and assistant["content"] is None
    ids = {c["function"]["name"]: c["id"] for c in assistant["tool_calls"]}
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"city": "Lisbon", "unit": "celsius"}
    assert [m.get("tool_call_id") for m in out[2:]] == [ids["get_time"], ids["get_weather"]]


def test_options_map_and_refuse_by_name() -> None:
    said: list[str] = []
    mapped = api._options(
        {"num_predict": -1, "seed": -1, "temperature": 0.2, "num_ctx": 4096, "stop": ["\n"], "typical_p": 1.0},
        said.append,
    )
    assert mapped == {"temperature": 0.2, "stop": ["\n"]} and said == ["num_ctx", "typical_p"]
    assert api._options({"num_predict": 5, "top_k": 3}, said.append) == {"max_tokens": 5, "top_k": 3}
    assert api._options({"repeat_last_n": 16, "num_keep": -1}, said.append) == {"repeat_last_n": 16}
    for refused in ({"typical_p": 0.5}, {"tfs_z": 0.9}, {"bogus": 1}, {"num_keep": 4}, {"num_keep": True}):
        with pytest.raises(InvalidRequestError) as caught:
            api._options(refused, said.append)
        assert caught.value.param == f"options.{next(iter(refused))}"
    assert api._think(False) == {"reasoning_effort": "none"} and api._think("high") == {"reasoning_effort": "high"}
    with pytest.raises(InvalidRequestError):
        api._think("max")
    assert api._format("json") == {"response_format": {"type": "json_object"}}
    assert api.listed("qwen2.5-coder:1.5b") == "qwen2.5-coder:1.5b" and api.listed("tiny") == "tiny:latest"


def test_logprobs_come_with_each_token(client: ollama.Client) -> None:
    options = {"num_predict": 4, **GREEDY}
    whole = client.chat(model=MODEL, messages=QUESTION, options=options, logprobs=True, top_logprobs=2)
    assert whole.logprobs is not None and len(whole.logprobs) == 4
    assert "".join(p.token for p in whole.logprobs) == whole.message.content
    for token in whole.logprobs:
        assert token.logprob <= 0 and token.top_logprobs is not None and len(token.top_logprobs) == 2
        assert token.top_logprobs[0].logprob >= token.top_logprobs[1].logprob
    parts = list(client.chat(model=MODEL, messages=QUESTION, options=options, logprobs=True, stream=True))
    assert [p.token for part in parts for p in part.logprobs or []] == [p.token for p in whole.logprobs]
