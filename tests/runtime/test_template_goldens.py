"""Every vendored chat template renders byte for byte as llama-server ``--jinja``
renders it: the golden files (tests/data/template_goldens*, made by
scripts/template_goldens.py with llama.cpp's own renderer) hold, per template
and conversation, the prompt llama-server answered on ``POST /apply-template``
(or that it refused the conversation). ``template_goldens_heldout`` and
``template_goldens_heldout2`` hold other conversations, made the same way: the
second was made after the renderer was done, and passed on its first run."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest

from localrun.errors import LocalrunError
from localrun.runtime.chat_request import render_request
from tests.vendored import template, templates

DATA = Path(__file__).resolve().parent.parent / "data"
SETS = ("template_goldens", "template_goldens_heldout", "template_goldens_heldout2")

# (set, template, scenario) -> why localrun's render differs from llama.cpp's there:
# such a case must still differ (a fixed one is taken off this list)
CONTINUED_WITH_REASONING = (  # templates llama.cpp finds a reasoning section in (its autoparser)
    "Apriel-1.6-15b-Thinker-fixed",
    "Bielik-11B-v3.0-Instruct",
    "ByteDance-Seed-OSS",
    "Cohere2MoE",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use",
    "GLM-4.6",
    "GLM-4.7-Flash",
    "HuggingFaceTB-SmolLM3-3B",
    "Kimi-K2-Instruct",
    "Kimi-K2-Thinking",
    "Kimi-K3",
    "LFM2-8B-A1B",
    "LFM2.5-8B-A1B",
    "LFM2.5-Instruct",
    "MiniMax-M2",
    "MiniMax-M3",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
    "NVIDIA-Nemotron-Nano-v2",
    "Qwen-QwQ-32B",
    "Qwen-Qwen3-0.6B",
    "Qwen3.5-4B",
    "Reka-Edge",
    "Spark2.5",
    "StepFun3.5-Flash",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
    "deepseek-ai-DeepSeek-V3.1",
    "deepseek-ai-DeepSeek-V3.2",
    "deepseek-ai-DeepSeek-V4-Flash-0731",
    "deepseek-ai-DeepSeek-V4",
    "google-gemma-4-31B-it-interleaved",
    "google-gemma-4-31B-it",
    "ibm-granite-granite-3.3-2B-Instruct",
    "inclusionai-ling-3.0-flash",
    "llama-cpp-deepseek-r1",
    "llama-cpp-rwkv-world",
    "meetkai-functionary-medium-v3.2",
    "mistralai-Ministral-3-14B-Reasoning-2512",
    "moonshotai-Kimi-K2",
    "muse-glimmer",
    "openai-gpt-oss-120b",
    "openbmb-MiniCPM5-1B",
    "poolside-Laguna-S-2.1",
    "poolside-Laguna-XS-2.1",
    "poolside-Laguna-XS.2",
    "unsloth-mistral-Devstral-Small-2507",
)
KNOWN: dict[tuple[str, str, str], str] = {
    ("template_goldens", name, "prefill"): "a conversation ending with the assistant's message: llama-server "
    "continues it after an empty reasoning section, in the markers its template analysis finds; localrun "
    "continues it after the turn's opening alone"
    for name in CONTINUED_WITH_REASONING
}


def _goldens() -> list[Any]:
    params = []
    for name in SETS:
        folder = DATA / name
        scenarios = json.loads((folder / "scenarios.json").read_text(encoding="utf-8"))
        for path in sorted(folder.glob("*.json")):
            if path.name != "scenarios.json":
                params.append(
                    pytest.param(name, path, scenarios, id=f"{name.removeprefix('template_goldens_')}:{path.stem}")
                )
    return params


def test_every_vendored_template_has_goldens() -> None:
    for name in SETS:
        made = {p.stem for p in (DATA / name).glob("*.json")} - {"scenarios"}
        assert made == {n.removesuffix(".jinja") for n in templates()}, name


def _outcome(source: str, golden: dict[str, Any], body: dict[str, Any], expected: dict[str, str]) -> str | None:
    """None where localrun renders what llama-server did (or refuses what it refused), else how it differs."""
    now = datetime.datetime.fromisoformat(golden["date"])
    try:
        prompt = render_request(source, body, bos_token=golden["bos_token"], eos_token=golden["eos_token"], now=now)
    except LocalrunError as exc:
        return None if "error" in expected else f"refused ({exc.message}), llama-server rendered it"
    if "error" in expected:
        return f"rendered, llama-server refused it ({expected['error']})"
    if prompt == expected["prompt"]:
        return None
    at = next((i for i, (a, b) in enumerate(zip(prompt, expected["prompt"], strict=False)) if a != b), len(prompt))
    theirs, ours = expected["prompt"][at - 40 : at + 60], prompt[at - 40 : at + 60]
    return f"differs at {at}: llama-server {theirs!r}, localrun {ours!r}"


@pytest.mark.parametrize(("set_name", "path", "scenarios"), _goldens())
def test_renders_as_llama_server(set_name: str, path: Path, scenarios: dict[str, Any]) -> None:
    golden = json.loads(path.read_text(encoding="utf-8"))
    source = template(golden["template"])
    wrong: dict[str, str] = {}
    for scenario, expected in golden["cases"].items():
        differs = _outcome(source, golden, scenarios[scenario], expected)
        known = (set_name, path.stem, scenario) in KNOWN
        if known and differs is None:
            wrong[scenario] = f"renders as llama-server now: take it off KNOWN ({KNOWN[set_name, path.stem, scenario]})"
        elif differs is not None and not known:
            wrong[scenario] = differs
    assert not wrong, "\n".join(f"{scenario}: {why}" for scenario, why in wrong.items())
