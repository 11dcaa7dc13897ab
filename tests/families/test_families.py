"""Every architecture the catalogue names loads and decodes: a tiny random-weight
model of each family (`tests.synthmodels`: its real tensor layout, tokenizer
kind, special tokens and chat template) through `show`, `generate`, `chat` and
`serve`, so that no first `pull` of a family meets a code path that never ran."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from gguf import GGUFReader

from localrun.events import SequenceDone
from localrun.gguf.info import describe
from localrun.gguf.reader import read_gguf
from localrun.runtime.batch.scheduler import BatchRequest, run_batch
from localrun.runtime.engine import Engine
from localrun.runtime.generate import generate
from localrun.runtime.prompt import build_prompt
from localrun.runtime.sampling import SamplingParams
from localrun.runtime.templates import render_chat
from localrun.speculative import Speculation
from localrun.speculative.control import FixedController
from localrun.speculative.draftmodel import DraftModelDrafter
from tests.helpers import cli, collect, engine_config
from tests.serve.conftest import Server, start
from tests.synthmodels import (
    BY_NAME,
    FAMILIES,
    N_CTX_TRAIN,
    N_EMBD,
    N_HEAD,
    N_HEAD_KV,
    WINDOW,
    Family,
    write_family_model,
)

NAMES = [f.name for f in FAMILIES]
GREEDY = SamplingParams(temperature=0.0)
N = 6  # tokens to generate: enough to pass the prompt and decode a few steps


@pytest.fixture(scope="session")
def family_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each family's model, and as ``NAME-ends`` one that ends every reply at once."""
    directory = tmp_path_factory.mktemp("families")
    models = {f.name: write_family_model(f, directory / f"{f.name}.gguf") for f in FAMILIES}
    ending = {f"{f.name}-ends": write_family_model(f, directory / f"{f.name}-ends.gguf", ends=True) for f in FAMILIES}
    return models | ending


@pytest.fixture(scope="session")
def unrelated_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each family again with other weights: its vocabulary, its drafts mostly wrong."""
    directory = tmp_path_factory.mktemp("unrelated")
    return {f.name: write_family_model(f, directory / f"{f.name}.gguf", seed=1) for f in FAMILIES}


def events(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines()]


def written(evs: list[dict[str, Any]]) -> str:
    """Everything the model wrote, whatever kind of text event carried it."""
    return "".join(e.get("text", "") for e in evs if e["type"] != "done")


@pytest.mark.parametrize("name", NAMES)
def test_show_reads_the_family(name: str, family_models: dict[str, Path]) -> None:
    family = BY_NAME[name]
    res = cli("show", str(family_models[name]), "--json", "--budget", "64MB")
    assert res.returncode == 0, res.stderr
    shown = json.loads(res.stdout)
    assert shown["architecture"] == family.arch_name
    assert (shown["layers"], shown["attention_heads"], shown["kv_heads"]) == (family.n_layer, N_HEAD, N_HEAD_KV)
    assert shown["context_length"] == N_CTX_TRAIN and shown["chat_template"] is True
    # keys and values of each KV head, in f16, in every layer (the head size written where it differs)
    assert shown["kv_bytes_per_token"]["f16"] == family.n_layer * N_HEAD_KV * 2 * family.head_dim * 2
    assert shown["max_context"]["f16"] == N_CTX_TRAIN  # a tiny model: the trained context fits in 64 MB
    info = describe(read_gguf(family_models[name]))
    # the sizes as the gguf package's own reader finds them (gpt-oss's experts in MXFP4 blocks)
    assert shown["weights_bytes"] == info.weights_bytes == sum(int(t.n_bytes) for t in GGUFReader(info.path).tensors)
    assert shown["quantization"] == ("MXFP4_MOE" if name == "gpt-oss" else "F32")
    assert 0 < info.layer_bytes * family.n_layer == info.block_bytes < info.weights_bytes
    assert info.output_bytes > 0  # tied families: the embeddings count as the output layer
    human = cli("show", str(family_models[name]))
    assert human.returncode == 0 and family.arch_name in human.stdout


@pytest.mark.parametrize("name", NAMES)
def test_the_template_renders_and_its_markers_tokenize_whole(name: str, family_models: dict[str, Path]) -> None:
    """The family's own template, as the GGUF carries it, renders the prompt, and
    each special token in the rendered text becomes that one token."""
    family = BY_NAME[name]
    with Engine(engine_config(family_models[name], n_ctx=2048)) as engine:
        assert engine.info.chat_template == family.chat_template
        # what the KV cache costs, as `show` and placement estimate it and as llama.cpp allocated it
        # (a sliding-window model's two caches together: llama-cpp-python keeps the window layers' full size)
        assert engine.kv_bytes_per_token == pytest.approx(describe(engine.info).kv_bytes_per_token("f16"), rel=0.01)
        assert (engine.bos_token, engine.eos_token) == (family.bos, family.eos)
        tokens = build_prompt(engine, "hello the world").tokens
        rendered = render_chat(
            family.chat_template, [{"role": "user", "content": "hello the world"}], bos_token=family.bos,
            eos_token=family.eos,
        )  # fmt: skip
        assert "hello the world" in rendered
        if engine.add_bos and not rendered.startswith(family.bos):
            rendered = family.bos + rendered
        ids = {engine.tokenize(text, add_special=False)[0]: text for text, _ in family.specials}
        assert len(ids) == len(family.specials)
        markers, plain = _split(rendered, sorted(ids.values(), key=len, reverse=True))
        assert markers, "the template writes no special token"
        assert [ids[t] for t in tokens if t in ids] == markers
        assert b"".join(engine.piece(t) for t in tokens if t not in ids).decode() == plain


def _split(text: str, markers: list[str]) -> tuple[list[str], str]:
    """The markers in ``text`` from left to right (the longest where two start
    at one place, as llama.cpp matches them), and the text between them."""
    found, plain, i = [], [], 0
    while i < len(text):
        marker = next((m for m in markers if text.startswith(m, i)), None)
        if marker is None:
            plain.append(text[i])
            i += 1
        else:
            found.append(marker)
            i += len(marker)
    return found, "".join(plain)


@pytest.mark.parametrize("name", NAMES)
def test_generate(name: str, family_models: dict[str, Path]) -> None:
    res = cli("generate", "-m", str(family_models[name]), "-n", str(N), "-t", "0", "--json", "hello the world")
    assert res.returncode == 0, res.stderr
    evs = events(res.stdout)
    done = evs[-1]
    assert done["type"] == "done" and done["stop_reason"] == "length"
    assert done["generated_tokens"] == N and done["prompt_tokens"] > 3
    assert written(evs)


@pytest.mark.parametrize("name", NAMES)
def test_speculation_is_lossless(name: str, family_models: dict[str, Path], unrelated_models: dict[str, Path]) -> None:
    """A draft model of the family: its copy (every draft kept) and one with other
    weights (drafts rolled back, the cache cut past Gemma's and gpt-oss's sliding
    window): the text is plain greedy decoding's."""
    greedy = GREEDY
    with Engine(engine_config(family_models[name], n_ctx=N_CTX_TRAIN)) as engine:
        prompt = engine.tokenize("hello the world")  # no template: this is about the architecture
        plain, _ = collect(generate(engine, prompt, greedy, max_tokens=3 * WINDOW))
        for draft_model in (family_models[name], unrelated_models[name]):
            drafter = DraftModelDrafter(draft_model, engine, eager=True, p_min=0.0)
            with Speculation([drafter], FixedController(0, 3)) as spec:
                text, stats = collect(spec.generate(engine, prompt, greedy, max_tokens=3 * WINDOW))
            assert text == plain
            assert stats.draft is not None and stats.draft.proposed > 3 * WINDOW // 4
            if draft_model == family_models[name]:
                assert stats.draft.accepted == stats.draft.proposed


@pytest.mark.parametrize("name", NAMES)
def test_batched_sequences_decode_as_each_alone(name: str, tmp_path: Path) -> None:
    """More prompts than slots, each slot's cache its own (a mixture of experts
    routes each row, a sliding window per sequence): each text is what its prompt
    gives alone. (gpt-oss's experts in F32 here: with MXFP4 ones a batched
    sequence parts from its lone run after some 40 tokens, at a near tie of the
    random weights, while with F32 ones all agree: llama.cpp's CPU kernels round
    a batch of MXFP4 rows otherwise than a single row.)"""
    model = write_family_model(BY_NAME[name], tmp_path / f"{name}.gguf", quantized=False)
    prompts = ["hello the world", "x", "on the other hand, the", "a b c d e f g"]
    n = 2 * WINDOW
    with Engine(engine_config(model, n_ctx=512)) as single:
        tokens = [single.tokenize(p) for p in prompts]
        expected = [collect(generate(single, t, GREEDY, max_tokens=n))[0] for t in tokens]
    config = engine_config(model, n_ctx=2 * 256, n_seq_max=2)
    with Engine(config) as engine:
        requests = [BatchRequest(i, t, GREEDY, max_tokens=n) for i, t in enumerate(tokens)]
        done = {ev.index: ev.text for ev in run_batch(engine, requests) if isinstance(ev, SequenceDone)}
    assert [done[i] for i in range(len(prompts))] == expected


@pytest.mark.parametrize("name", NAMES)
def test_a_reasoning_budget_closes_the_thinking(name: str, family_models: dict[str, Path]) -> None:
    """Where the template opens the thinking (DeepSeek's R1), a budget of 4 ends it
    within 5 tokens and the answer follows; where the template has no thinking
    markers at all, the budget does nothing, and a note says so."""
    family = BY_NAME[name]
    res = cli(
        "generate", "-m", str(family_models[name]), "-n", "12", "-t", "0", "--json", "--reasoning-budget", "4", "hi"
    )
    assert res.returncode == 0, res.stderr
    if not family.thinks:
        assert "note: --reasoning-budget does nothing here" in res.stderr and "does not think" in res.stderr
        assert events(res.stdout)[-1]["generated_tokens"] == 12
        return
    evs = events(res.stdout)
    if family.thinks == "opened":
        assert 0 < evs[-1]["reasoning_tokens"] <= 5
        assert "".join(e["text"] for e in evs if e["type"] == "token")  # the answer


@pytest.mark.parametrize("name", NAMES)
def test_chat_one_turn(name: str, family_models: dict[str, Path]) -> None:
    res = cli("chat", "-m", str(family_models[name]), "-n", str(N), "-t", "0", "--json", input="hello the world\n")
    assert res.returncode == 0, res.stderr
    evs = events(res.stdout)
    done = [e for e in evs if e["type"] == "done"]
    assert len(done) == 1 and done[0]["generated_tokens"] == N and done[0]["stop_reason"] == "length"
    assert written(evs)


@pytest.mark.parametrize("name", NAMES)
def test_a_reply_ends_at_the_familys_end_of_turn(name: str, family_models: dict[str, Path]) -> None:
    """The token a family ends its replies with ends the generation, and none of it is written."""
    model = str(family_models[f"{name}-ends"])
    res = cli("generate", "-m", model, "-n", str(N), "-t", "0", "--json", "hello the world")
    assert res.returncode == 0, res.stderr
    evs = events(res.stdout)
    assert evs[-1]["stop_reason"] == "eos" and evs[-1]["generated_tokens"] <= 1
    assert written(evs) == ""
    chat = cli("chat", "-m", model, "-n", str(N), "-t", "0", "--json", input="hello\nagain\n")
    assert chat.returncode == 0, chat.stderr
    turns = events(chat.stdout)
    assert [e["stop_reason"] for e in turns if e["type"] == "done"] == ["eos", "eos"]  # the second turn went on
    assert written(turns) == ""


@pytest.fixture(scope="module")
def family_server(family_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for every family: each model under its file's name."""
    models = [arg for path in family_models.values() for arg in ("-m", str(path))]
    yield from start(tmp_path_factory.mktemp("home"), *models, "--ctx", "8192", "--parallel", "1")


@pytest.mark.parametrize("name", NAMES)
def test_serve_one_chat_completion(name: str, family_server: Server, family_models: dict[str, Path]) -> None:
    server = family_server
    client = server.client()
    messages: Any = [{"role": "user", "content": "hello the world"}]
    reply = client.chat.completions.create(model=name, messages=messages, max_tokens=N, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == N
    message = choice.message
    assert (message.content or "") + str((message.model_extra or {}).get("reasoning_content") or "")
    # the same template and tokenizer as the command line: the same prompt
    res = cli("chat", "-m", str(family_models[name]), "-n", "1", "-t", "0", "--json", input="hello the world\n")
    assert reply.usage.prompt_tokens == events(res.stdout)[-1]["prompt_tokens"]
    chunks = list(
        client.chat.completions.create(model=name, messages=messages, max_tokens=N, temperature=0, stream=True)
    )
    assert chunks[-1].choices == [] or chunks[-1].choices[0].finish_reason == "length"
    streamed = "".join(
        (c.choices[0].delta.content or "") + str((c.choices[0].delta.model_extra or {}).get("reasoning_content") or "")
        for c in chunks
        if c.choices
    )
    assert streamed == (message.content or "") + str((message.model_extra or {}).get("reasoning_content") or "")
    ends = client.chat.completions.create(model=f"{name}-ends", messages=messages, max_tokens=N, temperature=0)
    assert ends.choices[0].finish_reason == "stop" and not ends.choices[0].message.content
    # the Anthropic API: the same prompt, the same stop
    with anthropic.Anthropic(base_url=server.url, api_key=server.key, max_retries=0, timeout=120) as claude:
        answer = claude.messages.create(model=name, max_tokens=N, messages=messages, extra_body={"temperature": 0})
        assert answer.stop_reason == "max_tokens" and answer.usage.output_tokens == N
        usage = answer.usage
        assert usage.input_tokens + (usage.cache_read_input_tokens or 0) == reply.usage.prompt_tokens
        ended = claude.messages.create(
            model=f"{name}-ends", max_tokens=N, messages=messages, extra_body={"temperature": 0}
        )
        assert ended.stop_reason == "end_turn" and not any(getattr(b, "text", "") for b in ended.content)


def test_every_family_has_its_own_layout() -> None:
    """The families differ where their real files do (a guard on the synthesizer itself)."""
    from tests.synthmodels import layer_specs, tensor_name

    def names(family: Family) -> set[str]:
        return {tensor_name(family, kind, suffix, 0) for kind, suffix, _ in layer_specs(family)}

    assert "blk.0.attn_sinks.weight" in names(BY_NAME["gpt-oss"])
    assert "blk.0.ffn_gate_exps.weight" in names(BY_NAME["qwen3moe"]) & names(BY_NAME["gpt-oss"])
    assert "blk.0.attn_qkv.weight" in names(BY_NAME["phi3"])
    assert "blk.0.attn_q.bias" in names(BY_NAME["qwen2"]) - names(BY_NAME["llama3"])
    assert "blk.0.post_ffw_norm.weight" in names(BY_NAME["gemma3"])
    assert "blk.0.attn_k_norm.weight" in names(BY_NAME["qwen3"]) - names(BY_NAME["smollm3"])
    assert BY_NAME["gemma3"].head_dim != N_EMBD // N_HEAD  # a head size apart from the width, as in Gemma and Qwen3


WEATHER: Any = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",  # gpt-oss's template adds it to a string: it must be there
            "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris"]}}, "required": ["city"]},
        },
    }
]


@pytest.mark.parametrize("name", NAMES)
def test_serve_a_required_tool_call(name: str, family_server: Server) -> None:
    """A tool the family's template offers, a call required: the call is written in
    the family's format, parsed back and valid (the schema leaves one argument)."""
    server = family_server
    messages: Any = [{"role": "user", "content": "the weather in Paris?"}]
    reply = server.client().chat.completions.create(
        model=name,
        messages=messages,
        tools=WEATHER,
        tool_choice="required",
        max_tokens=200,
        temperature=0,
        extra_body={"reasoning_budget_tokens": 8},  # the call comes after the thinking: close it soon
    )
    calls = reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "tool_calls" and calls
    for call in calls:
        assert call.type == "function" and call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_a_remote_conversation_keeps_an_empty_reply() -> None:
    """What a remote chat sends alternates too (a server's Gemma template refuses two user messages in a row)."""
    from typing import cast

    from localrun.remote.backend import RemoteModel
    from localrun.remote.chat import RemoteChat
    from localrun.runtime.sampling import SamplingParams

    chat = RemoteChat(cast(RemoteModel, None), SamplingParams(), turns=[("hello", ""), ("again", "yes")])
    assert chat.messages("more") == [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "yes"},
        {"role": "user", "content": "more"},
    ]


UNDESCRIBED_FAIL: dict[str, str] = {}  # the templates render as llama.cpp does (system merged, undefined as '')


@pytest.mark.parametrize("name", NAMES)
def test_serve_a_tool_without_a_description(name: str, family_server: Server, request: pytest.FixtureRequest) -> None:
    """A tool with a name and parameters only (a description is optional in the API)."""
    if name in UNDESCRIBED_FAIL:
        request.applymarker(pytest.mark.xfail(reason=UNDESCRIBED_FAIL[name], strict=True))
    bare: Any = [
        {"type": "function", "function": {k: v for k, v in WEATHER[0]["function"].items() if k != "description"}}
    ]
    messages: Any = [{"role": "user", "content": "the weather in Paris?"}]
    reply = family_server.client().chat.completions.create(
        model=name, messages=messages, tools=bare, max_tokens=N, temperature=0
    )
    assert reply.choices[0].finish_reason in ("length", "tool_calls")
