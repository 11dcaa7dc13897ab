"""`localrun template --parse` (a model's raw reply read as serve reads a
completion's), `--template FILE` on template, generate and chat, the built-in
gemma template, and a GGUF without a chat template (the architecture's, or
none) in every command."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gguf import GGUFWriter

from localrun.runtime.chat_request import render_request
from localrun.runtime.templates import BUILTIN_TEMPLATES, render_chat
from tests.helpers import cli
from tests.synthmodels import BY_NAME, write_family_model
from tests.tinymodel import write_tiny_model
from tests.vendored import template

QWEN3 = template("Qwen-Qwen3-0.6B")
NEMO = template("mistralai-Mistral-Nemo-Instruct-2407")


def tool(name: str, properties: dict[str, Any]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": list(properties)}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


WEATHER = tool("get_weather", {"city": {"type": "string"}})
TIME = tool("get_time", {"tz": {"type": "integer"}})
ENDS = ("</s>", "<|eot_id|>", "<|im_end|>")
ARGUMENTS: list[dict[str, Any]] = [
    {"city": "Zürich ☀"},  # unicode
    {"tz": 2},  # a number
]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("templates")
    return {
        "qwen3": write_tiny_model(folder / "qwen3.gguf", chat_template=QWEN3),
        "nemo": write_tiny_model(folder / "nemo.gguf", chat_template=NEMO),
        "plain": write_tiny_model(folder / "plain.gguf", chat_template=None),
    }


@pytest.fixture(scope="module")
def gemma3_without_template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A Gemma 3 GGUF whose converter wrote no chat template."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(GGUFWriter, "add_chat_template", lambda self, text: None)
        yield write_family_model(BY_NAME["gemma3"], tmp_path_factory.mktemp("gemma3") / "gemma3-bare.gguf")


def _parsed(*args: str, reply: str) -> tuple[dict[str, Any], str]:
    res = cli("template", "--parse", *args, input=reply)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout), res.stderr


def _calls(message: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])]


def _written(template_text: str, calls: list[tuple[str, dict[str, Any]]], *, ids: list[str] | None = None) -> str:
    """The part of an assistant turn with ``calls`` the model writes: the
    rendered conversation with the reply, less the prompt before it."""
    ids = ids or [f"call{i:05d}" for i in range(len(calls))]
    user = {"role": "user", "content": "Weather and time?"}
    reply = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a, ensure_ascii=False)}}
            for i, (n, a) in zip(ids, calls, strict=True)
        ],
    }
    prompt = render_chat(template_text, [user], bos_token="<s>", eos_token="</s>")
    whole = render_chat(template_text, [user, reply], bos_token="<s>", eos_token="</s>", add_generation_prompt=False)
    assert whole.startswith(prompt), (prompt, whole)
    written = whole[len(prompt) :].rstrip()
    for end in ENDS:  # the end-of-turn token stops generation: it is not in the text
        written = written.removesuffix(end)
    return written


# ------------------------------------------------------------- --parse --


def test_parse_reads_thinking_and_calls_as_openai_message(models: dict[str, Path]) -> None:
    reply = (
        "<think>\nThe user wants two things.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich ☀"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"tz": 2}}\n</tool_call>'
    )
    message, _ = _parsed("-m", str(models["qwen3"]), reply=reply)
    assert message["role"] == "assistant" and message["content"] is None
    assert message["reasoning_content"] == "The user wants two things."
    assert _calls(message) == [("get_weather", ARGUMENTS[0]), ("get_time", ARGUMENTS[1])]
    assert [(c["id"], c["type"]) for c in message["tool_calls"]] == [("call_0", "function"), ("call_1", "function")]
    assert all(isinstance(c["function"]["arguments"], str) for c in message["tool_calls"])


def test_parse_with_tools_keeps_an_undeclared_call_as_content_and_says_why(
    models: dict[str, Path], tmp_path: Path
) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([WEATHER]))
    reply = (
        'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"tz": 2}}\n</tool_call>'
    )
    message, stderr = _parsed("-m", str(models["qwen3"]), "--tools", str(tools), reply=reply)
    assert _calls(message) == [("get_weather", {"city": "Rome"})]
    assert "get_time" in message["content"] and message["content"].startswith("Checking.")
    assert "no function is named 'get_time'" in stderr
    # a call whose arguments break the declared parameters stays content too, as in serve
    bad = '<tool_call>\n{"name": "get_weather", "arguments": {"town": "Rome"}}\n</tool_call>'
    message, stderr = _parsed("-m", str(models["qwen3"]), "--tools", str(tools), reply=bad)
    assert "tool_calls" not in message and "get_weather" in message["content"] and "city" in stderr


def test_parse_follows_the_conversation_that_opened_the_thinking(models: dict[str, Path]) -> None:
    reply = "Plain answer, no thinking."
    message, _ = _parsed("-m", str(models["qwen3"]), "--think", "off", reply=reply)
    assert message == {"role": "assistant", "content": "Plain answer, no thinking."}


@pytest.mark.parametrize(
    "name", ["Qwen-Qwen3-0.6B", "mistralai-Mistral-Nemo-Instruct-2407", "meta-llama-Llama-3.1-8B-Instruct"]
)
def test_a_rendered_call_parses_back_through_a_template_file(name: str, tmp_path: Path) -> None:
    """The generated part of a rendered assistant turn with two calls, read
    with --template FILE alone (no model): the same calls come back."""
    text = template(name)
    jinja = tmp_path / f"{name}.jinja"
    jinja.write_text(text, encoding="utf-8")
    calls = [("get_weather", ARGUMENTS[0]), ("get_time", ARGUMENTS[1])]
    ids = ["abcdefgh1", "abcdefgh2"]  # nine letters and digits, as Mistral's template demands
    single = calls[:1] if "Llama-3.1" in name else calls  # Llama 3.1's template writes one call a turn
    written = _written(text, single, ids=ids[: len(single)])
    message, _ = _parsed("--template", str(jinja), reply=written)
    assert _calls(message) == single and message["content"] is None


def test_parse_with_a_template_that_takes_no_tools_reads_serves_hermes_calls(models: dict[str, Path]) -> None:
    reply = 'Sure.\n<tool_call>\n{"name": "get_time", "arguments": {"tz": -3}}\n</tool_call>'
    message, _ = _parsed("-m", str(models["plain"]), "--template", "chatml", reply=reply)
    assert message["content"] == "Sure." and _calls(message) == [("get_time", {"tz": -3})]


def test_parse_refusals(models: dict[str, Path]) -> None:
    res = cli("template", "--parse", "--source", "-m", str(models["qwen3"]), input="x")
    assert res.returncode == 2 and "--source" in res.stderr
    res = cli("template", "--parse", "--messages", "-", "-m", str(models["qwen3"]), input="x")
    assert res.returncode == 2 and "stdin" in res.stderr


# ------------------------------------------------------- --template FILE --


def test_template_file_replaces_the_ggufs(models: dict[str, Path], tmp_path: Path) -> None:
    jinja = tmp_path / "mine.jinja"
    jinja.write_text("{% for m in messages %}<<{{ m.role }}:{{ m.content }}>>{% endfor %}{{ eos_token }}")
    res = cli("template", "-m", str(models["qwen3"]), "--template", str(jinja), "Hi")
    assert res.returncode == 0, res.stderr
    assert res.stdout == "<<user:Hi>><|endoftext|>"  # the model's EOS text, with -m
    res = cli("template", "--template", str(jinja), "--source")
    assert res.returncode == 0 and res.stdout.startswith("{% for m in messages %}")


def test_template_file_errors(models: dict[str, Path], tmp_path: Path) -> None:
    missing = tmp_path / "nope.jinja"
    res = cli("template", "-m", str(models["qwen3"]), "--template", str(missing), "Hi")
    assert res.returncode == 2 and "no such file" in res.stderr and "chatml" in res.stderr
    res = cli("template", "-m", str(models["qwen3"]), "--template", str(tmp_path), "Hi")
    assert res.returncode == 2 and "is a folder" in res.stderr
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m.content }}")
    for command in (("template", "Hi"), ("generate", "-n", "1", "Hi"), ("chat",)):
        res = cli(*command, "-m", str(models["plain"]), "--template", str(broken), input="hi\n")
        assert res.returncode == 2, (command, res.stderr)
        assert "not a Jinja template" in res.stderr and "line 1" in res.stderr
    res = cli("generate", "-m", str(models["plain"]), "--raw", "--template", "chatml", "Hi")
    assert res.returncode == 2 and "--raw" in res.stderr


def _done(stdout: str) -> dict[str, Any]:
    record: dict[str, Any] = [json.loads(line) for line in stdout.splitlines() if '"done"' in line][-1]
    return record


def test_generate_and_chat_render_with_the_file(models: dict[str, Path], tmp_path: Path) -> None:
    jinja = tmp_path / "brackets.jinja"
    jinja.write_text("{% for m in messages %}[[{{ m.content }}]]{% endfor %}")
    res = cli("generate", "-m", str(models["plain"]), "--template", str(jinja), "-n", "2", "--json", "Hi")
    assert res.returncode == 0, res.stderr
    done = _done(res.stdout)
    assert done["settings"]["chat_template"] == {"value": str(jinja), "source": "option"}
    raw = _done(cli("generate", "-m", str(models["plain"]), "--raw", "-n", "2", "--json", "[[Hi]]").stdout)
    assert done["prompt_tokens"] == raw["prompt_tokens"]  # the file rendered the prompt: [[Hi]]
    res = cli("chat", "-m", str(models["plain"]), "--template", str(jinja), "-n", "2", input="hi\n")
    assert res.returncode == 0, res.stderr  # without it, a model without a template is refused


def test_a_template_that_raises_names_its_message(models: dict[str, Path], tmp_path: Path) -> None:
    two = tmp_path / "two.json"
    two.write_text(json.dumps([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]))
    res = cli("template", "-m", str(models["nemo"]), "--messages", str(two))
    assert res.returncode == 4
    assert "roles must alternate" in res.stderr and "hint:" in res.stderr and "--template" in res.stderr


# ----------------------------------------------------------- built-ins --


def test_builtin_gemma_puts_the_system_prompt_in_the_first_user_turn(models: dict[str, Path]) -> None:
    res = cli("template", "-m", str(models["plain"]), "--template", "gemma", "-s", "Be brief.", "Hi")
    assert res.returncode == 0, res.stderr
    assert res.stdout == (  # the tiny model's tokenizer adds no BOS: the template's stays
        "<|endoftext|><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    )
    turns = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    rendered = render_request(BUILTIN_TEMPLATES["gemma"], {"messages": turns}, bos_token="", eos_token="")
    assert rendered.count("S") == 1 and "<start_of_turn>system" not in rendered
    assert rendered.count("<start_of_turn>user") == 2


# ------------------------------------------------ a GGUF without a template --


def test_the_architecture_implies_gemma_in_every_command(gemma3_without_template: Path) -> None:
    model = str(gemma3_without_template)
    res = cli("template", "-m", model, "-s", "Be brief.", "Hi")
    assert res.returncode == 0, res.stderr
    assert res.stdout == "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    assert "built-in gemma template" in res.stderr and "gemma3" in res.stderr
    res = cli("generate", "-m", model, "-n", "2", "--json", "Hi")
    assert res.returncode == 0, res.stderr
    assert "built-in gemma template" in res.stderr
    done = _done(res.stdout)
    assert done["settings"]["chat_template"]["value"] == "gemma"
    res = cli("generate", "-m", model, "-n", "2", "--batch", "-", "--no-log", input="Hi\n")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["prompt_tokens"] == done["prompt_tokens"]  # the batch renders the same way
    res = cli("chat", "-m", model, "-n", "2", input="hi\n")
    assert res.returncode == 0, res.stderr
    assert "built-in gemma template" in res.stderr


def test_no_template_and_none_implied_generate_says_it_runs_raw_chat_refuses(models: dict[str, Path]) -> None:
    res = cli("generate", "-m", str(models["plain"]), "-n", "2", "--json", "Hi")
    assert res.returncode == 0, res.stderr
    assert "no chat template" in res.stderr and "as is" in res.stderr and "--template" in res.stderr
    assert _done(res.stdout)["settings"]["chat_template"]["value"] is None
    res = cli("generate", "-m", str(models["plain"]), "-n", "2", "--raw", "Hi")
    assert res.returncode == 0 and "no chat template" not in res.stderr  # --raw asked for it
    res = cli("chat", "-m", str(models["plain"]), input="hi\n")
    assert res.returncode == 2 and "no chat template" in res.stderr and "--template" in res.stderr
    res = cli("template", "-m", str(models["plain"]), "Hi")
    assert res.returncode == 2 and "--template" in res.stderr


def test_template_tools_show_the_block_serve_adds_for_a_template_without_tools(
    models: dict[str, Path], tmp_path: Path
) -> None:
    from localrun.serve.tools import conversation, tool_use

    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([WEATHER]))
    res = cli("template", "-m", str(models["plain"]), "--template", "chatml", "--tools", str(tools), "Hi")
    assert res.returncode == 0, res.stderr
    use = tool_use([WEATHER], None, None, BUILTIN_TEMPLATES["chatml"])
    assert use is not None and not use.native
    served = conversation([{"role": "user", "content": "Hi"}], use)  # what serve's chat prompt renders
    expected = render_chat(BUILTIN_TEMPLATES["chatml"], served, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    assert res.stdout == expected
    assert res.stdout.startswith("<|im_start|>system\n") and "get_weather" in res.stdout
