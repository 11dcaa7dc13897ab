"""Turn the user's text into prompt tokens: the model's chat template, or raw."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localrun.errors import UsageError
from localrun.runtime.decoder import common_prefix
from localrun.runtime.templates import BUILTIN_TEMPLATES, Message, render_chat

if TYPE_CHECKING:
    from localrun.runtime.engine import Tokens


def chat_template(engine: Tokens, name: str | None = None) -> str:
    """The template a chat uses: ``name`` (a built-in) if given, else the GGUF's own."""
    if name is not None:
        if name not in BUILTIN_TEMPLATES:
            raise UsageError(f"unknown chat template {name!r}", hint=f"use one of {', '.join(BUILTIN_TEMPLATES)}")
        return BUILTIN_TEMPLATES[name]
    template = engine.info.chat_template
    if template is None:
        raise UsageError(
            f"{engine.info.name} has no chat template in its GGUF metadata",
            hint=f"give one with --template FILE (a Jinja chat template) or NAME ({', '.join(BUILTIN_TEMPLATES)})",
        )
    return template


def render_messages(
    engine: Tokens,
    template: str,
    messages: Sequence[Mapping[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    switches: Mapping[str, Any] | None = None,
) -> str:
    return render_chat(
        template, messages, bos_token=engine.bos_token, eos_token=engine.eos_token, tools=tools, switches=switches
    )


def reply_start(
    engine: Tokens,
    template: str,
    messages: Sequence[Mapping[str, Any]],
    text: str,
    tokens: Sequence[int],
    switches: Mapping[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> int | None:
    """Where, in ``tokens`` (``text``: the rendered ``messages``), the next turn's
    prompt parts from this one: that turn renders this reply, and a thinking
    template drops the thinking its generation prompt opened. Found by
    rendering the conversation once more as the next turn will (a reply, a
    user message); None where the template will not."""
    try:
        later = [{"role": "assistant", "content": "."}, {"role": "user", "content": "."}]
        replied = render_messages(engine, template, [*messages, *later], tools, switches)
    except Exception:  # a template that refuses the shape: no mark, nothing else changes
        return None
    shared = text[: common_prefix(text, replied)]
    n = common_prefix(tokenize_rendered(engine, shared), tokens)
    return n or None


def tokenize_rendered(engine: Tokens, rendered: str) -> list[int]:
    """Tokens of a rendered template, with a BOS unless the template wrote one."""
    bos = engine.bos_token
    return engine.tokenize(rendered, add_special=engine.add_bos and not (bos and rendered.startswith(bos)))


def compose(instruction: str | None, material: str | None) -> str:
    """The prompt from an argument and piped stdin: the material first, then the
    instruction about it (so runs over the same material share a prefix)."""
    parts = [material.rstrip("\n")] if material and material.strip() else []
    if instruction and instruction.strip():
        parts.append(instruction)
    text = "\n\n".join(parts)
    if not text.strip():
        raise UsageError("the prompt is empty", hint='pass a prompt: localrun generate "Write a haiku"')
    return text


@dataclass(frozen=True)
class Prompt:
    tokens: list[int]
    shared: int  # leading tokens other runs are likely to share: the system prompt and piped material
    text: str = ""  # the rendered prompt (where a reasoning model's thinking may already be open)
    marks: tuple[int, ...] = ()  # where a later prompt is expected to part from this one (see `reply_start`)


def build_prompt(
    engine: Tokens,
    instruction: str | None,
    material: str | None = None,
    *,
    system: str | None = None,
    raw: bool = False,
    switches: Mapping[str, Any] | None = None,
) -> Prompt:
    """The prompt's tokens (the chat template unless ``raw``), and how many of
    them stand for the system prompt and the material, which a prompt cache can
    keep: the same material with another question shares them."""
    text = compose(instruction, material)
    template = None if raw else engine.info.chat_template
    if template is None:
        full = f"{system}\n\n{text}" if system else text
        tokens = engine.tokenize(full, add_special=engine.add_bos)
    else:
        messages: list[Message] = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": text})
        full = render_messages(engine, template, messages, switches=switches)
        tokens = tokenize_rendered(engine, full)
    stable = material.rstrip("\n") if material and material.strip() else system
    return Prompt(tokens, stable_prefix(engine, full, tokens, stable, templated=template is not None), full)


def stable_prefix(engine: Tokens, full: str, tokens: list[int], stable: str | None, *, templated: bool) -> int:
    """How many leading ``tokens`` (of the prompt text ``full``) stand for
    everything up to the end of ``stable`` (a system prompt, piped material),
    leaving at least one: what a prompt cache keeps for the next prompt that
    starts the same way."""
    end = full.find(stable) + len(stable) if stable and stable in full else 0
    if not end:
        return 0
    head = full[:end]
    prefix = tokenize_rendered(engine, head) if templated else engine.tokenize(head, add_special=engine.add_bos)
    return common_prefix(prefix, tokens, len(tokens) - 1)


def prompt_tokens(engine: Tokens, text: str, *, system: str | None = None, raw: bool = False) -> list[int]:
    return build_prompt(engine, text, system=system, raw=raw).tokens


def chat_tokens(engine: Tokens, messages: list[Message], *, raw: bool = False) -> list[int]:
    """A conversation through the model's chat template; without one (or with
    ``raw``), the messages' contents joined by blank lines."""
    return chat_prompt(engine, messages, raw=raw).tokens


def chat_prompt(
    engine: Tokens, messages: list[Message], *, raw: bool = False, switches: Mapping[str, Any] | None = None
) -> Prompt:
    """`chat_tokens`, with the rendered text (``shared`` is not worked out: 0)."""
    template = None if raw else engine.info.chat_template
    if template is None:
        text = "\n\n".join(m["content"] for m in messages)
        return Prompt(engine.tokenize(text, add_special=engine.add_bos), 0, text)
    text = render_messages(engine, template, messages, switches=switches)
    return Prompt(tokenize_rendered(engine, text), 0, text)
