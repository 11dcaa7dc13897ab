"""The chat-format registry: one entry per family, each the family of some
vendored template, a template's format told once."""

from __future__ import annotations

import pytest

from localrun import chatformat
from tests.vendored import template, templates

# the families the registry once read with Hermes' finders, and others it tells apart by their markers
EXPECTED = {
    "Kimi-K2-Instruct": ("kimi-k2", "kimi-k2"),
    "LFM2.5-8B-A1B": ("lfm2.5", "lfm2"),
    "MiniMax-M2": ("minimax-m2", "minimax-m2"),
    "meetkai-functionary-medium-v3.2": ("functionary-v3.2", "functionary-v3.2"),
    "GigaChat3-10B-A1.8B": ("gigachat-v3", "gigachat-v3"),
    "Cohere2MoE": ("cohere2moe", "command-r"),
    "inclusionai-ling-3.0-flash": ("ling3", "glm"),
    "openbmb-MiniCPM5-1B": ("minicpm5", "minicpm"),
    "deepseek-ai-DeepSeek-V3.2": ("deepseek-v3.2", "deepseek-v3.2"),
    "GLM-4.6": ("glm", "glm"),
    "NVIDIA-Nemotron-Nano-v2": ("nemotron-v2", "nemotron-v2"),
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": ("qwen3-coder", "qwen3-coder"),
    "google-gemma-4-31B-it": ("gemma4", "gemma4"),
    "openai-gpt-oss-120b": ("gpt-oss", "gpt-oss"),
    "Qwen-Qwen3-0.6B": ("hermes", "hermes"),
}


@pytest.fixture(autouse=True, scope="module")
def vendored() -> None:
    templates()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_template_is_told_its_family_and_its_family_reads_its_calls(name: str) -> None:
    fmt = chatformat.of(template(name))
    assert (fmt.name, fmt.tools.name) == EXPECTED[name]
    assert fmt.own_tools


def test_every_entry_is_the_family_of_a_vendored_template_and_named_once() -> None:
    names = [fmt.name for fmt in (*chatformat.FORMATS, chatformat.HERMES)]
    assert len(names) == len(set(names))
    used = {chatformat.of(source).name for source in templates().values()}
    assert used == set(names)
    assert all(chatformat.named(name).name == name for name in names)


def test_a_templates_format_is_told_once_and_no_template_is_hermes_without_thinking() -> None:
    source = template("Qwen-Qwen3-0.6B")
    assert chatformat.of(source) is chatformat.of(source)
    assert chatformat.of(source).reasoning is not None
    assert chatformat.of(None) is chatformat.HERMES and chatformat.HERMES.reasoning is None
    assert chatformat.of("{{ messages }}") == chatformat.HERMES  # nothing it knows: Hermes, no thinking
