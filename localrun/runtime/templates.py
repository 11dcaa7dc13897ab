"""Chat templates: rendering a GGUF's Jinja template as llama.cpp's ``--jinja``
renderer does (common/chat.cpp), and the built-in ones for models that carry
none (`chat --template NAME`)."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from jinja2 import TemplateError

from localrun import chatformat
from localrun.errors import ChatTemplateError
from localrun.runtime.jinja_env import render
from localrun.runtime.template_caps import preserve_reasoning_switches, supports_thinking, template_caps
from localrun.runtime.template_input import template_messages, tool_fields

Message = dict[str, str]

# llama-server's default: templates that can keep earlier turns' reasoning keep it
PRESERVE_REASONING = {"preserve_reasoning": True}


def render_chat(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    bos_token: str,
    eos_token: str,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    switches: Mapping[str, Any] | None = None,
    now: datetime.datetime | None = None,
) -> str:
    """The prompt llama-server renders for an OpenAI-style conversation:
    ``messages`` (with ``tool_calls``, ``reasoning_content``, text parts),
    ``tools`` (OpenAI's tool objects), and ``switches`` (``enable_thinking``,
    ``reasoning_effort``, any other template variable, as llama-server's
    ``chat_template_kwargs``). ``now`` is the date the template may print."""
    caps = template_caps(template)
    fmt = chatformat.of(template)
    prepared = template_messages(messages, template, caps, fmt)
    offered = tool_fields(tools)
    moment = now or datetime.datetime.now()
    context: dict[str, Any] = {
        "messages": prepared,
        "bos_token": bos_token,
        "eos_token": eos_token,
        "enable_thinking": supports_thinking(template),
    }
    if offered:
        context["tools"] = offered
    given: dict[str, Any] = {"datetime": moment.strftime("%b %d %Y"), "date_string": moment.strftime("%d %b %Y")}
    given.update(PRESERVE_REASONING)
    given.update(switches or {})
    if isinstance(given["preserve_reasoning"], bool):  # its other names first: a switch given by name wins
        context.update(preserve_reasoning_switches(given["preserve_reasoning"]))
    if isinstance(given.get("reasoning_effort"), str) and given["reasoning_effort"]:
        context["reasoning_strength"] = given["reasoning_effort"]
    context.update(given)
    if add_generation_prompt:
        context["add_generation_prompt"] = True
    try:
        prompt = render(template, context, moment)
    except (TemplateError, TypeError, ValueError, LookupError, AttributeError, ArithmeticError) as exc:
        raise ChatTemplateError(f"the chat template failed: {exc}") from exc
    return fmt.finish(prompt, add_generation_prompt)


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
    "gemma": (  # Gemma has no system turn: the system prompt opens the first user turn, as Gemma's own does
        "{{ bos_token }}{% set ns = namespace(system='') %}{% for m in messages %}"
        "{% if m.role == 'system' %}{% set ns.system = ns.system + (m.content or '') | trim %}{% else %}"
        "{% set role = 'model' if m.role == 'assistant' else 'user' %}<start_of_turn>{{ role }}\n"
        "{% if ns.system and role == 'user' %}{{ ns.system }}\n\n{% set ns.system = '' %}{% endif %}"
        "{{ (m.content or '') | trim }}<end_of_turn>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    ),
    "phi3": (
        "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    ),
}
