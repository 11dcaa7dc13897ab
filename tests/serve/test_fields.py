"""OpenAI's fields that llama.cpp honours are honoured here, through the
official `openai` client: logprobs and top_logprobs, n, frequency and
presence penalties, logit_bias. A field that changes nothing is taken (the
server says so once); an image is refused in words, not a validation dump."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.serve.conftest import Server
from tests.serve.test_serve import GREEDY, ask, raw, streamed
from tests.tinymodel import SPECIALS

X = len(SPECIALS) + ord("x")  # the tiny vocabulary's token for the byte "x"


def test_chat_logprobs_with_alternatives(server: Server) -> None:
    reply = ask(server, "hello", max_tokens=5, logprobs=True, top_logprobs=3, **GREEDY)
    assert reply.usage is not None
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    assert len(logprobs.content) == reply.usage.completion_tokens == 5
    for entry in logprobs.content:
        assert entry.logprob <= 0 and entry.bytes and len(entry.top_logprobs) == 3
        best = entry.top_logprobs[0]
        assert (best.token, best.logprob) == (entry.token, entry.logprob)  # greedy: the most likely is taken
        assert [t.logprob for t in entry.top_logprobs] == sorted((t.logprob for t in entry.top_logprobs), reverse=True)
    plain = ask(server, "hello", max_tokens=5, **GREEDY)
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == reply.choices[0].message.content


def test_streamed_logprobs_cover_every_token(server: Server) -> None:
    chunks = list(ask(server, "hello", max_tokens=6, logprobs=True, stream=True, **GREEDY))
    entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content or []]
    assert len(entries) == 6 and all(not e.top_logprobs for e in entries)


def test_completion_logprobs(server: Server) -> None:
    reply = server.client().completions.create(model="tiny", prompt="hello", max_tokens=4, logprobs=2, **GREEDY)
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None and logprobs.top_logprobs is not None
    assert len(logprobs.tokens) == 4 and all(len(top) <= 2 for top in logprobs.top_logprobs)
    assert logprobs.text_offset is not None and logprobs.text_offset[0] == 0


def test_n_gives_several_choices(server: Server) -> None:
    reply = ask(server, "hello", max_tokens=4, n=2, seed=7, temperature=1.5)
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.usage is not None and reply.usage.completion_tokens == 8
    greedy = ask(server, "hello", max_tokens=4, n=2, **GREEDY)
    assert greedy.choices[0].message.content == greedy.choices[1].message.content  # one distribution, no sampling

    chunks = list(ask(server, "hello", max_tokens=4, n=3, stream=True, stream_options={"include_usage": True}))
    ends = {c.choices[0].index: c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason}
    assert ends == {0: "length", 1: "length", 2: "length"}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12

    with pytest.raises(openai.BadRequestError) as caught:
        ask(server, "hello", max_tokens=2, n=17)
    assert caught.value.param == "n"


def test_logit_bias_moves_the_choice(server: Server) -> None:
    client = server.client()
    forced = client.completions.create(model="tiny", prompt="hello", max_tokens=4, logit_bias={str(X): 100}, **GREEDY)
    assert forced.choices[0].text == "xxxx"
    free = client.completions.create(model="tiny", prompt="hello", max_tokens=4, **GREEDY)
    assert free.choices[0].text != "xxxx"
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="tiny", prompt="hello", max_tokens=2, logit_bias={"hello": 5})
    assert caught.value.param == "logit_bias"


def test_penalties_change_a_repetitive_reply(server: Server) -> None:
    """Where greedy decoding repeats a token, presence and frequency penalties take another."""
    client = server.client()
    kw: dict[str, Any] = {"model": "tiny", "prompt": "hello", "max_tokens": 40}
    plain = client.completions.create(**kw, **GREEDY).choices[0].text
    assert len(set(plain)) < len(plain)  # it repeats itself
    penalized = client.completions.create(**kw, presence_penalty=2.0, frequency_penalty=2.0, **GREEDY)
    assert penalized.choices[0].text != plain
    chat = [ask(server, "hello", max_tokens=40, frequency_penalty=f, **GREEDY) for f in (0.0, 2.0)]
    assert chat[0].choices[0].message.content != chat[1].choices[0].message.content


def test_fields_that_change_nothing_are_taken_and_said_once(server: Server) -> None:
    extra: dict[str, Any] = {"context_management": {"edits": []}, "prompt_cache_key": "k"}
    for _ in range(2):
        reply = ask(server, "hi", max_tokens=2, n=1, logprobs=False, modalities=["text"], extra_body=extra)
        assert reply.choices[0].message.content is not None
    options: Any = {"include_usage": True, "include_obfuscation": False}
    assert streamed(server, "hi", max_tokens=2, stream_options=options)[1][-1].usage is not None
    said = [line for line in server.lines if "ignored in requests" in line]
    assert len(said) == 1 and "context_management" in said[0] and "prompt_cache_key" in said[0]


def test_an_image_is_refused_in_words(server: Server) -> None:
    content: Any = [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    ]
    with pytest.raises(openai.BadRequestError) as caught:
        server.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}])
    assert "images are not supported by this model" in caught.value.message
    assert caught.value.param == "messages"
    status, body, _ = raw(
        server,
        "POST",
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}',
    )
    assert status == 400 and body["error"]["message"].startswith("audio is not supported by this model")
