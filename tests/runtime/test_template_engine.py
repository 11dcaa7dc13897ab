"""The pieces of llama.cpp's renderer that localrun reproduces, one by one: how
its Jinja engine prints values, what a template is found to support, and what
the conversation becomes before the template sees it."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from localrun import chatformat
from localrun.errors import BadModelError, UsageError
from localrun.runtime.chat_request import request_switches, strip_bos
from localrun.runtime.jinja_env import render, tojson
from localrun.runtime.template_caps import supports_thinking, template_caps
from localrun.runtime.template_input import message_fields, tool_fields
from localrun.runtime.templates import render_chat
from tests.vendored import template


@pytest.mark.parametrize(
    ("source", "printed"),
    [
        ("{{ none }}|{{ undefined_name }}|{{ {'a': 1} }}", "||"),  # nothing for none, undefined and objects
        ("{{ [1, 'b', true] }}", "1bTrue"),  # a list's items one after the other
        ("{{ 2.50 }} {{ 3 }} {{ false }}", "2.5 3 False"),
        ("{{ 'a' + missing + 'b' }}", "ab"),  # undefined joins text as nothing
        ("{{ missing.items() | length }}", "0"),
        ("{{ x | tojson }}", '{"k": [1, 2.5, "é"], "n": null}'),
        ("{{ x | tojson(indent=2) }}", '{\n  "k": [\n    1,\n    2.5,\n    "é"\n  ],\n  "n": null\n}'),
        ("{{ 'q' | safe + x.k | tojson }}", 'q[1, 2.5, "é"]'),  # no HTML escaping
        ("{{ strftime_now('%Y-%m-%d') }}", "2026-03-01"),
    ],
)
def test_values_print_as_llama_cpp_prints_them(source: str, printed: str) -> None:
    context = {"x": {"k": [1, 2.5, "é"], "n": None}}
    assert render(source, context, datetime.datetime(2026, 3, 1)) == printed


def test_tojson_separators_and_ascii() -> None:
    assert tojson({"a": [1, 2]}, separators=(",", ":")) == '{"a":[1,2]}'
    assert tojson("é", ensure_ascii=True) == '"\\u00e9"'


def test_caps_as_llama_cpp_finds_them() -> None:
    gemma2 = template_caps(template("google-gemma-2-2b-it"))
    assert not gemma2.system_role and not gemma2.tool_calls
    qwen3 = template_caps(template("Qwen-Qwen3-0.6B"))
    assert qwen3.system_role and qwen3.tools and qwen3.tool_calls and qwen3.object_arguments
    assert template_caps(template("GLM-4.7-Flash")).preserve_reasoning and not qwen3.preserve_reasoning
    assert template_caps(template("openai-gpt-oss-120b")).reasoning_effort and not qwen3.reasoning_effort
    assert not qwen3.typed_content and template_caps(template("Kimi-K2-Instruct")).typed_content


def test_thinking_default_follows_the_reasoning_section() -> None:
    assert supports_thinking(template("Qwen-Qwen3-0.6B"))
    assert supports_thinking(template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"))
    # Apertus reads enable_thinking but writes no reasoning section: llama-server leaves it off
    assert not supports_thinking(template("Apertus-8B-Instruct"))
    assert not supports_thinking(template("meta-llama-Llama-3.1-8B-Instruct"))


def test_system_merged_where_the_template_ignores_it() -> None:
    prompt = render_chat(
        template("google-gemma-2-2b-it"),
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        bos_token="<bos>",
        eos_token="<eos>",
    )
    assert prompt == "<bos><start_of_turn>user\nBe brief.\nHi<end_of_turn>\n<start_of_turn>model\n"


def test_message_fields_as_llama_cpp_rebuilds_them() -> None:
    call = {"type": "function", "id": "c1", "function": {"name": "f", "arguments": {"b": 1, "a": [2]}}}
    message = {"tool_calls": [call], "content": None, "role": "assistant", "reasoning_content": ""}
    assert message_fields(message) == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": '{"b":1,"a":[2]}'}, "id": "c1"}],
    }
    assert tool_fields([{"type": "function", "function": {"name": "now", "strict": True}}]) == [
        {"type": "function", "function": {"name": "now", "description": "", "parameters": {}}}
    ]
    with pytest.raises(UsageError):
        message_fields({"role": "user"})
    with pytest.raises(UsageError):
        tool_fields([{"type": "retrieval"}])


def test_arguments_that_are_not_json_are_refused() -> None:
    call = {"type": "function", "function": {"name": "f", "arguments": "{not json"}}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [call]}]
    with pytest.raises(UsageError, match="not JSON"):
        render_chat(template("Qwen-Qwen3-0.6B"), messages, bos_token="", eos_token="")


def test_template_raise_is_a_bad_model_error() -> None:
    messages = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(BadModelError, match="alternate"):
        render_chat(template("google-gemma-2-2b-it"), messages, bos_token="", eos_token="")


def test_families_and_request_switches() -> None:
    assert chatformat.of(template("openai-gpt-oss-120b")).name == "gpt-oss"
    assert chatformat.of(template("Qwen3-Coder")).name == "qwen3-coder"
    assert chatformat.of(template("Qwen-Qwen2.5-7B-Instruct")) == chatformat.HERMES
    assert request_switches({"reasoning_effort": "none", "chat_template_kwargs": {"x": 1}}) == {
        "x": 1,
        "enable_thinking": False,
    }
    assert request_switches({"reasoning_effort": "high"}) == {"reasoning_effort": "high"}
    with pytest.raises(UsageError):
        request_switches({"chat_template_kwargs": {"enable_thinking": "yes"}})
    assert strip_bos("<s>x", "<s>", add_bos=True) == "x"
    assert strip_bos("<s>x", "<s>", add_bos=False) == "<s>x"


def test_a_template_that_fails_in_python_terms_is_a_bad_model_error() -> None:
    with pytest.raises(BadModelError, match="chat template failed"):
        render_chat("{{ 'a' - 1 }}", [{"role": "user", "content": "x"}], bos_token="", eos_token="")


def test_a_last_assistant_message_is_continued() -> None:
    from localrun.runtime.chat_request import render_request

    chatml = template("Qwen-Qwen2.5-7B-Instruct")
    body = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]}
    prompt = render_request(chatml, body, bos_token="", eos_token="")
    assert prompt.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHel")
    call = {"type": "function", "function": {"name": "f", "arguments": "{}"}}
    with pytest.raises(UsageError, match="tool calls"):
        render_request(chatml, {"messages": [{"role": "assistant", "tool_calls": [call]}]}, bos_token="", eos_token="")
    twice = {"messages": [{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]}
    with pytest.raises(UsageError, match="2 or more"):
        render_request(chatml, twice, bos_token="", eos_token="")
