"""`localrun serve` through the official `openai` client: the endpoints,
streaming and not, the fields, the errors, backpressure and disconnects."""

from __future__ import annotations

import http.client
import json
import re
import signal
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import openai
import pytest

from tests.helpers import cli
from tests.serve.conftest import Server, start

GREEDY: dict[str, Any] = {"temperature": 0}


def ask(server: Server, prompt: str, **kw: Any) -> Any:
    messages: Any = [{"role": "user", "content": prompt}]
    return server.client().chat.completions.create(model="tiny", messages=messages, **kw)


def streamed(server: Server, prompt: str, **kw: Any) -> tuple[str, list[Any]]:
    chunks = list(ask(server, prompt, stream=True, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


def raw(server: Server, method: str, path: str, body: bytes | None = None, **headers: str) -> tuple[int, Any, Any]:
    """(status, JSON body, headers) of a request sent as is."""
    url = urlsplit(server.url)
    conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=60)
    try:
        conn.request(method, path, body, {"Content-Type": "application/json", **headers})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null"), response.headers
    finally:
        conn.close()


def health(server: Server) -> dict[str, Any]:
    status, body, _ = raw(server, "GET", "/health")
    assert status == 200
    return dict(body)


def idle(server: Server) -> dict[str, Any]:
    """/health once no request is running or waiting (polled: the end of a request is asynchronous)."""
    for _ in range(600):
        state = health(server)
        if not state["slots_processing"] and not state["queued"]:
            return state
        time.sleep(0.05)
    raise AssertionError(f"the server stays busy: {state}")


def generate_text(model: Path, prompt: str, *args: str) -> str:
    """What `localrun generate` writes for ``prompt``, greedy, without speculation."""
    res = cli("generate", "-m", str(model), "-t", "0", "--spec", "none", "--json", *args, prompt)
    assert res.returncode == 0, res.stderr
    events = [json.loads(line) for line in res.stdout.splitlines()]
    return "".join(e["text"] for e in events if e["type"] == "token")


# ----------------------------------------------------------- endpoints --


def test_models_and_health(server: Server) -> None:
    models = server.client().models.list().data
    assert [m.id for m in models] == ["tiny"]
    meta = models[0].model_extra["meta"]  # type: ignore[index]
    assert meta["n_ctx"] == 512 and meta["parallel"] == 2
    assert health(server)["slots_idle"] == 2


def test_chat_greedy_equals_generate_whole_and_streamed(server: Server, tiny_model: Path) -> None:
    whole = ask(server, "hello there", max_tokens=16, **GREEDY)
    text, chunks = streamed(server, "hello there", max_completion_tokens=16, **GREEDY)
    assert whole.choices[0].message.content == text == generate_text(tiny_model, "hello there", "-n", "16")
    assert whole.choices[0].finish_reason == chunks[-1].choices[0].finish_reason == "length"
    assert whole.usage is not None and whole.usage.completion_tokens == 16
    final = chunks[-1]  # usage on the last chunk although the client did not ask for it
    assert final.usage is not None and final.usage.completion_tokens == 16
    assert final.usage.prompt_tokens == whole.usage.prompt_tokens > 0
    timings = whole.model_extra["timings"]
    assert timings["prompt_n"] + timings["cache_n"] == whole.usage.prompt_tokens
    assert timings["predicted_n"] == 16


def test_slots_sampling_in_the_graph_answer_as_the_host_does(server: Server, tiny_model: Path, tmp_path: Path) -> None:
    """serve --spec none --sample-on device: two requests at once each sample
    in llama.cpp's graph (the runner's log says a chain was attached for
    each), one with log-probabilities on the host after them; the
    replies, greedy and seeded, are the host's (`generate --spec none`, the
    host-sampling server)."""
    from concurrent.futures import ThreadPoolExecutor

    args = ("-m", str(tiny_model), "--parallel", "2", "--spec", "none", "--sample-on", "device", "--verbose")
    seeded: dict[str, Any] = {"temperature": 1.5, "seed": 7}  # top-p sorts the candidates: the host's draws
    asks: list[tuple[str, dict[str, Any]]] = [("hello there", GREEDY), ("in the", seeded), ("on the", GREEDY)]
    for device in start(tmp_path / "home", *args):
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(ask, device, prompt, max_tokens=16, **options) for prompt, options in asks[:2]]
            replies = [f.result() for f in futures]
        probed = ask(device, asks[2][0], max_tokens=16, logprobs=True, **asks[2][1])
        attached = re.findall(r"set_sampler: seq_id = \d+, sampler = 0x0*[1-9a-f]", device.log)  # not a detach
        assert len(attached) == 2  # the two plain requests' chains, not the one asking for log-probabilities
    hot = ("-t", "1.5", "--seed", "7")  # the seeded reply as plain decoding samples it, on the host
    expected = [
        generate_text(tiny_model, "hello there", "-n", "16"),
        generate_text(tiny_model, "in the", "-n", "16", *hot),
    ]
    expected.append(ask(server, "on the", max_tokens=16, **GREEDY).choices[0].message.content)
    assert [r.choices[0].message.content for r in (*replies, probed)] == expected
    assert probed.choices[0].logprobs is not None and len(probed.choices[0].logprobs.content or []) == 16


def test_completions_take_the_prompt_raw(server: Server, tiny_model: Path) -> None:
    client = server.client()
    whole = client.completions.create(model="tiny", prompt="the cat sat", max_tokens=12, **GREEDY)
    usage: Any = {"include_usage": True}
    chunks = list(
        client.completions.create(
            model="tiny", prompt="the cat sat", max_tokens=12, stream=True, stream_options=usage, **GREEDY
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert whole.choices[0].text == text == generate_text(tiny_model, "the cat sat", "--raw", "-n", "12")
    assert chunks[-1].choices == [] and chunks[-1].usage is not None  # include_usage: a last chunk of usage only
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 12


def test_stop_strings(server: Server) -> None:
    full = ask(server, "on the", max_tokens=40, **GREEDY).choices[0].message.content
    stop = full[10:13]
    cut = ask(server, "on the", max_tokens=40, stop=[stop], **GREEDY)
    assert cut.choices[0].message.content == full[: full.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    text, chunks = streamed(server, "on the", max_tokens=40, stop=stop, **GREEDY)
    assert text == full[: full.index(stop)] and chunks[-1].choices[0].finish_reason == "stop"


def test_seed_reproduces_a_sampled_reply(server: Server) -> None:
    hot: dict[str, Any] = {"temperature": 1.5, "top_p": 1.0, "max_tokens": 24}
    first = ask(server, "in the", seed=7, **hot).choices[0].message.content
    again = ask(server, "in the", seed=7, **hot).choices[0].message.content
    other = ask(server, "in the", seed=8, **hot).choices[0].message.content
    assert first == again
    assert other != first


def test_json_schema_response_is_valid(server: Server) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer", "maximum": 99}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}
    reply = ask(server, "a person", response_format=fmt, max_tokens=80, temperature=1.0, seed=3)
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content or ""), schema)
    text, _ = streamed(server, "a person", response_format=fmt, max_tokens=80, temperature=1.0, seed=3)
    assert text == reply.choices[0].message.content


def test_prefix_of_a_conversation_is_reused(server: Server) -> None:
    idle(server)
    first = ask(server, "hello there", max_tokens=8, **GREEDY)
    reply = first.choices[0].message.content
    messages: Any = [
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "and then?"},
    ]
    second = server.client().chat.completions.create(model="tiny", messages=messages, max_tokens=4, **GREEDY)
    assert first.usage is not None and second.usage is not None and second.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens


# -------------------------------------------------------------- refusals --


def test_over_long_prompt_is_refused_with_the_numbers(server: Server) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        ask(server, "word " * 600)
    body: Any = caught.value.body
    assert body["code"] == "context_length_exceeded"
    assert body["n_ctx"] == 512 and body["n_prompt_tokens"] > 512


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"extra_body": {"modalities": ["text", "audio"]}}, "modalities"),
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"extra_body": {"tools": [{"type": "retrieval"}]}}, "tools"),
        ({"extra_body": {"mystery": 1}}, "mystery"),
        ({"extra_body": {"temperature": "hot"}}, "temperature"),
    ],
)
def test_unsupported_or_wrong_fields_are_named(server: Server, fields: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        ask(server, "hi", max_tokens=2, **fields)
    assert caught.value.param == param
    assert param in caught.value.message


def test_model_must_be_one_served(server: Server, tiny_model: Path) -> None:
    client = server.client()
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="llama-9000", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.code == "model_not_found"
    for path in (str(tiny_model), "../tiny.gguf"):
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model=path, prompt="hi", max_tokens=2)
        assert refused.value.param == "model"


def test_malformed_bodies_get_the_openai_error_shape(server: Server) -> None:
    for body in (b"{not json", b"[1, 2]", b'{"messages": "hi"}', b'{"messages": []}'):
        status, error, _ = raw(server, "POST", "/v1/chat/completions", body)
        assert status == 400, body
        assert set(error["error"]) >= {"message", "type", "param", "code"}
    status, error, _ = raw(server, "POST", "/v1/completions", b'{"prompt": "' + b"x" * (17 * 2**20) + b'"}')
    assert (status, error["error"]["code"]) == (413, "request_too_large")


def test_api_key(keyed: Server) -> None:
    with pytest.raises(openai.AuthenticationError) as caught:
        keyed.client("wrong").models.list()
    assert caught.value.status_code == 401 and caught.value.code == "invalid_api_key"
    status, _, _ = raw(keyed, "POST", "/v1/completions", b'{"prompt": "hi"}')
    assert status == 401
    assert raw(keyed, "GET", "/health")[0] == 200
    reply = keyed.client("sekrit-key-4242").completions.create(model="tiny", prompt="hi", max_tokens=3)
    assert reply.usage is not None and reply.usage.completion_tokens == 3
    assert keyed.stop(signal.SIGINT) == 0
    assert "sekrit" not in keyed.log and "API key required" in keyed.log


# ------------------------------------------------ backpressure, disconnects --


def test_a_disconnect_frees_its_slot(narrow: Server) -> None:
    before = idle(narrow)
    stream = narrow.client().completions.create(model="tiny-long", prompt="go", max_tokens=30000, stream=True)
    for _, _chunk in zip(range(3), stream, strict=False):
        pass
    assert health(narrow)["slots_processing"] == 1
    stream.close()
    after = idle(narrow)  # long before 30000 tokens could be generated
    assert after["requests_cancelled"] == before["requests_cancelled"] + 1
    assert after["requests_done"] == before["requests_done"]
    said = r"POST /v1/completions 499 \S+: prompt [1-9]\d*, (\d+) tokens, [\d.]+s, disconnected"
    deadline = time.monotonic() + 30
    while not (gone := re.findall(said, narrow.log)) and time.monotonic() < deadline:
        time.sleep(0.05)  # the log's line is written as the request ends, the slot may be free before
    assert gone and int(gone[-1]) >= 3, narrow.log  # the tokens it had before it left
    reply = narrow.client().completions.create(model="tiny-long", prompt="go", max_tokens=2)
    assert reply.choices[0].finish_reason == "length"


def test_a_full_queue_answers_503(narrow: Server) -> None:
    idle(narrow)
    client = narrow.client()
    running = client.completions.create(model="tiny-long", prompt="go", max_tokens=30000, stream=True)
    next(iter(running))  # it holds the one slot
    waiting = client.completions.create(model="tiny-long", prompt="wait", max_tokens=4, stream=True)
    try:
        with pytest.raises(openai.APIStatusError) as caught:
            client.completions.create(model="tiny-long", prompt="no room", max_tokens=4)
        assert caught.value.status_code == 503
        assert caught.value.response.headers["Retry-After"].isdigit()
        assert health(narrow)["queued"] == 1
    finally:
        running.close()
        waiting.close()
    idle(narrow)


def test_sigterm_ends_what_runs_after_the_grace_period_and_exits_cleanly(narrow: Server) -> None:
    idle(narrow)
    stream = narrow.client().completions.create(model="tiny-long", prompt="go", max_tokens=30000, stream=True)
    next(iter(stream))
    narrow.proc.send_signal(signal.SIGTERM)
    with pytest.raises(openai.APIError, match="shutting down"):
        for _ in stream:  # goes on through the grace period, then ends with the reason
            pass
    assert narrow.proc.wait(timeout=60) == 0, narrow.log
    assert "1 request(s) in flight get up to 1s" in narrow.log


# ---------------------------------------------------------------- the CLI --


def test_a_non_loopback_host_needs_a_key(tiny_model: Path) -> None:
    res = cli("serve", "-m", str(tiny_model), "--host", "0.0.0.0")
    assert res.returncode == 2 and "--api-key" in res.stderr
    res = cli("serve", "-m", str(tiny_model), "--api-key", "k", "--no-auth")
    assert res.returncode == 2


def test_an_unknown_pooling_is_refused_before_anything_loads(tiny_model: Path) -> None:
    res = cli("serve", "-m", str(tiny_model), "--pooling", "median")
    assert res.returncode == 2 and "unknown pooling 'median'" in res.stderr and "loading" not in res.stderr
