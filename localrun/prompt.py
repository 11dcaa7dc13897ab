"""Turn the user's text into prompt tokens: the model's chat template, or raw."""

from __future__ import annotations

import datetime

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from localrun.engine import Engine
from localrun.errors import BadModelError, UsageError

Message = dict[str, str]


def _raise(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def render_chat(template: str, messages: list[Message], *, bos_token: str, eos_token: str) -> str:
    """Render a GGUF chat template (Jinja, as Hugging Face tokenizers run it)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals.update(raise_exception=_raise, strftime_now=_strftime_now)
    try:
        return env.from_string(template).render(
            messages=messages, add_generation_prompt=True, bos_token=bos_token, eos_token=eos_token
        )
    except TemplateError as exc:
        raise BadModelError(
            f"the model's chat template failed: {exc}", hint="use --raw to send the prompt as is"
        ) from exc


def compose(instruction: str | None, material: str | None) -> str:
    """The prompt from an argument and piped stdin: the argument is the
    instruction, stdin the material it applies to."""
    parts = [p for p in (instruction, material) if p and p.strip()]
    text = "\n\n".join(p.rstrip("\n") if p is material else p for p in parts)
    if not text.strip():
        raise UsageError("the prompt is empty", hint='pass a prompt: localrun generate "Write a haiku"')
    return text


def prompt_tokens(engine: Engine, text: str, *, system: str | None = None, raw: bool = False) -> list[int]:
    messages: list[Message] = []
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": text})
    return chat_tokens(engine, messages, raw=raw)


def chat_tokens(engine: Engine, messages: list[Message], *, raw: bool = False) -> list[int]:
    """A conversation through the model's chat template; without one (or with
    ``raw``), the messages' contents joined by blank lines."""
    template = None if raw else engine.info.chat_template
    if template is None:
        return engine.tokenize("\n\n".join(m["content"] for m in messages), add_special=engine.add_bos)
    bos, eos = engine.bos_token, engine.eos_token
    rendered = render_chat(template, messages, bos_token=bos, eos_token=eos)
    add_bos = engine.add_bos and not (bos and rendered.startswith(bos))
    return engine.tokenize(rendered, add_special=add_bos)
