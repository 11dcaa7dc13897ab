"""A model's chat template: the one a run renders with, chosen once (the
``--template`` given, else the GGUF's own, else the one its architecture
implies), and the token texts it is rendered with, read from the file's
metadata alone (no model load)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from jinja2 import TemplateSyntaxError

from localrun.errors import TemplateFileError
from localrun.gguf.reader import ArrayInfo, GGUFInfo, read_gguf, read_strings
from localrun.runtime.jinja_env import compiled
from localrun.runtime.templates import BUILTIN_TEMPLATES

TEMPLATE_KEY = "tokenizer.chat_template"

# Architectures whose every chat model takes one turn format, for a GGUF that
# carries no template: the built-in that writes it. (llama.cpp's server falls
# back to ChatML for any model without one, which no Gemma was trained on.)
ARCHITECTURE_TEMPLATES: dict[str, str] = {
    "gemma": "gemma",
    "gemma2": "gemma",
    "gemma3": "gemma",
    "gemma3n": "gemma",
}

Origin = Literal["gguf", "built-in", "file", "architecture", "none"]


@dataclass(frozen=True)
class ChatTemplate:
    """The template a run renders with and where it came from: ``source``
    None (origin ``none``) where the GGUF has none and none can be inferred."""

    source: str | None
    origin: Origin
    name: str = ""  # the built-in's name, or the file's path

    def describe(self) -> str:
        """Where the template came from, in a few words (for notes and --json)."""
        if self.origin == "file":
            return f"the template in {self.name}"
        if self.origin in ("built-in", "architecture"):
            return f"the built-in {self.name} template"
        return "the GGUF's template" if self.origin == "gguf" else "no template"


def given_template(value: str) -> ChatTemplate:
    """``--template``'s value: a built-in's name, else a Jinja file (as
    llama.cpp's ``--chat-template-file``), read and compiled now, so a bad one
    is refused before any model loads."""
    if value in BUILTIN_TEMPLATES:
        return ChatTemplate(BUILTIN_TEMPLATES[value], "built-in", value)
    path = Path(value).expanduser()
    names = ", ".join(BUILTIN_TEMPLATES)
    if not path.exists():
        raise TemplateFileError(
            f"--template {value}: no such file, and not a built-in template",
            hint=f"give a Jinja chat template file, or one of {names}",
        )
    try:
        source = path.read_text(encoding="utf-8")
    except IsADirectoryError:
        raise TemplateFileError(f"--template {value}: is a folder", hint="give a Jinja chat template file") from None
    except OSError as exc:
        raise TemplateFileError(f"--template {value}: cannot read it: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise TemplateFileError(f"--template {value}: is not UTF-8 text", hint="give a Jinja chat template") from None
    if not source.strip():
        raise TemplateFileError(f"--template {value}: the file is empty", hint="give a Jinja chat template file")
    try:
        compiled(source)
    except TemplateSyntaxError as exc:
        where = f" (line {exc.lineno})" if exc.lineno else ""
        raise TemplateFileError(f"--template {value}: not a Jinja template{where}: {exc.message}") from None
    return ChatTemplate(source, "file", str(value))


def choose_template(info: GGUFInfo, given: ChatTemplate | None = None) -> ChatTemplate:
    """The template a run on ``info``'s model renders with: ``given``, else
    the GGUF's own, else the built-in its architecture implies, else none."""
    if given is not None:
        return given
    if info.chat_template is not None:
        return ChatTemplate(info.chat_template, "gguf")
    inferred = ARCHITECTURE_TEMPLATES.get(info.architecture)
    if inferred is not None:
        return ChatTemplate(BUILTIN_TEMPLATES[inferred], "architecture", inferred)
    return ChatTemplate(None, "none")


def with_template(info: GGUFInfo, chosen: ChatTemplate) -> GGUFInfo:
    """``info`` with ``chosen`` as its chat template: what every reader of
    ``info.chat_template`` (rendering, tool-call and reasoning formats) sees."""
    if chosen.source == info.chat_template:
        return info
    metadata = {k: v for k, v in info.metadata.items() if k != TEMPLATE_KEY}
    if chosen.source is not None:
        metadata[TEMPLATE_KEY] = chosen.source
    return dataclasses.replace(info, metadata=metadata)


def template_note(chosen: ChatTemplate, model: str, architecture: str) -> str | None:
    """What a person is told of a template the GGUF did not carry (None: it did, or one was given)."""
    if chosen.origin == "architecture":
        return (
            f"note: {model} has no chat template; using the built-in {chosen.name} template "
            f"(its architecture is {architecture}); --template NAME|FILE chooses another"
        )
    if chosen.origin == "none":
        return (
            f"note: {model} has no chat template and its architecture ({architecture}) implies none: "
            "the prompt goes to the model as is; --template NAME|FILE gives it one"
        )
    return None


@dataclass(frozen=True)
class ModelTemplate:
    source: str | None  # None: the GGUF has no chat template
    bos_token: str
    eos_token: str
    add_bos: bool  # the tokenizer adds the BOS itself: llama.cpp leaves it out of the prompt text
    chosen: ChatTemplate = ChatTemplate(None, "none")


def _token_text(path: Path, tokens: Any, token_id: Any) -> str:
    if not isinstance(tokens, ArrayInfo) or not isinstance(token_id, int) or not 0 <= token_id < tokens.length:
        return ""
    return read_strings(path, tokens, token_id, token_id + 1)[0].decode("utf-8", "replace")


def model_template(path: Path, given: ChatTemplate | None = None) -> ModelTemplate:
    """The template a run on the model at ``path`` renders with (see `choose_template`) and its token texts."""
    info = read_gguf(path)
    meta = info.metadata
    tokens = meta.get("tokenizer.ggml.tokens")
    add_bos = meta.get("tokenizer.ggml.add_bos_token")
    if not isinstance(add_bos, bool):  # llama.cpp's default per tokenizer: SentencePiece and WordPiece add one
        add_bos = meta.get("tokenizer.ggml.model") in ("llama", "bert")
    chosen = choose_template(info, given)
    return ModelTemplate(
        chosen.source,
        _token_text(path, tokens, meta.get("tokenizer.ggml.bos_token_id")),
        _token_text(path, tokens, meta.get("tokenizer.ggml.eos_token_id")),
        add_bos,
        chosen,
    )
