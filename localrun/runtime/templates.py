"""Chat templates: rendering a GGUF's Jinja template, and the built-in ones
for models that carry none (`chat --template NAME`)."""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from localrun.errors import BadModelError

Message = dict[str, str]


def _raise(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _tojson(value: Any, indent: int | None = None) -> str:
    """Jinja's ``tojson`` as Hugging Face templates expect it: no HTML escaping."""
    return json.dumps(value, ensure_ascii=False, indent=indent)


def render_chat(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    bos_token: str,
    eos_token: str,
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    switches: Mapping[str, Any] | None = None,
) -> str:
    """Render a GGUF chat template (Jinja, as Hugging Face tokenizers run it);
    ``tools`` (OpenAI's tool objects) go to templates that take them, and
    ``switches`` (``enable_thinking``, ``reasoning_effort``, ...) into the
    template's context as they are."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals.update(raise_exception=_raise, strftime_now=_strftime_now)
    env.filters["tojson"] = _tojson
    extra: dict[str, Any] = dict(switches or {})
    if tools:
        extra["tools"] = tools
    try:
        return env.from_string(template).render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            **extra,
        )
    except TemplateError as exc:
        raise BadModelError(
            f"the model's chat template failed: {exc}", hint="use --raw to send the prompt as is"
        ) from exc


BUILTIN_TEMPLATES: dict[str, str] = {
    "chatml": (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    "llama3": (
        "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
        "{{ m.content }}<|eot_id|>{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    ),
    "gemma": (
        "{{ bos_token }}{% for m in messages %}{% set role = 'model' if m.role == 'assistant' else 'user' %}"
        "<start_of_turn>{{ role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    ),
    "phi3": (
        "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    ),
}
