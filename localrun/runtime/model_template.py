"""A GGUF's chat template with the token texts it is rendered with, read from
the file's metadata alone (no model load): what ``localrun template`` prints
the prompt of a conversation with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localrun.gguf.reader import ArrayInfo, read_gguf, read_strings


@dataclass(frozen=True)
class ModelTemplate:
    source: str | None  # None: the GGUF has no chat template
    bos_token: str
    eos_token: str
    add_bos: bool  # the tokenizer adds the BOS itself: llama.cpp leaves it out of the prompt text


def _token_text(path: Path, tokens: Any, token_id: Any) -> str:
    if not isinstance(tokens, ArrayInfo) or not isinstance(token_id, int) or not 0 <= token_id < tokens.length:
        return ""
    return read_strings(path, tokens, token_id, token_id + 1)[0].decode("utf-8", "replace")


def model_template(path: Path) -> ModelTemplate:
    info = read_gguf(path)
    meta = info.metadata
    tokens = meta.get("tokenizer.ggml.tokens")
    add_bos = meta.get("tokenizer.ggml.add_bos_token")
    if not isinstance(add_bos, bool):  # llama.cpp's default per tokenizer: SentencePiece and WordPiece add one
        add_bos = meta.get("tokenizer.ggml.model") in ("llama", "bert")
    return ModelTemplate(
        info.chat_template,
        _token_text(path, tokens, meta.get("tokenizer.ggml.bos_token_id")),
        _token_text(path, tokens, meta.get("tokenizer.ggml.eos_token_id")),
        add_bos,
    )
