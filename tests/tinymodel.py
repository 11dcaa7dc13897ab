"""Write tiny random-weight llama-architecture GGUF models for fast tests.

The tokenizer is a real byte-level BPE (GPT-2 style): 256 byte tokens, a few
merges, and control tokens for a ChatML template, so llama.cpp tokenizes,
detokenizes and applies the chat template exactly as it would for a real model.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, PoolingType, TokenType

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# a reasoning model's: ChatML whose generation prompt opens the thinking (as DeepSeek-R1's distills do), with
# Qwen3's switch that closes it at once; earlier replies lose their thinking
THINKING_TURNS = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content.split('</think>')[-1] }}<|im_end|>\n{% endfor %}"
)
THINKING_CHATML = (
    THINKING_TURNS + "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n"
    "{% if enable_thinking is defined and enable_thinking is false %}\n</think>\n\n{% endif %}{% endif %}"
)
THINK_TOKENS = ("<think>", "</think>")

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS_ID = 0
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "a n", "Ġ a", "e r", "o n", "Ġ s", "r e"]


def byte_symbols() -> list[str]:
    """GPT-2's reversible byte -> printable unicode mapping, in byte order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    mapping: dict[int, int] = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = 256 + extra
            extra += 1
    return [chr(mapping[b]) for b in range(256)]


def vocabulary(merges: list[str] = MERGES, extra: Sequence[str] = ()) -> tuple[list[str], list[int]]:
    """The tokens and their types; ``extra`` control tokens last (e.g. ``<think>``)."""
    tokens = list(SPECIALS) + byte_symbols()
    types = [int(TokenType.CONTROL)] * len(SPECIALS) + [int(TokenType.NORMAL)] * 256
    for merge in merges:
        left, right = merge.split(" ")
        tokens.append(left + right)
        types.append(int(TokenType.NORMAL))
    tokens += extra
    types += [int(TokenType.CONTROL)] * len(extra)
    return tokens, types


def write_tiny_model(  # noqa: PLR0915  one writer call per GGUF key
    path: Path,
    *,
    seed: int = 0,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    n_ctx_train: int = 512,
    chat_template: str | None = CHATML,
    eos_first: bool = False,
    bigram: bool = False,
    merges: list[str] | None = None,
    loop: str = "",
    extra_tokens: Sequence[str] = (),
    pooling: int | None = None,
    name: str = "tiny-test-llama",
) -> Path:
    """Write a model to ``path``.

    The control tokens' rows of the output projection are zero, so their logits are 0
    while the best of the random others is positive: greedy decoding never
    ends by itself. ``eos_first`` zeroes the whole projection instead: every
    logit ties and greedy decoding picks token 0, the end-of-text token.
    ``bigram`` zeroes what attention and the feed-forward blocks add, so the
    next token depends on the current one alone: greedy text falls into a
    loop, which prompt lookup can predict. ``loop`` (with ``bigram``; distinct
    characters that no merge joins) makes that loop this text: each of its
    byte tokens is followed by the next, cyclically. ``merges`` replaces the
    BPE merges (a different vocabulary). ``extra_tokens`` adds control
    tokens (a reasoning model's ``<think>``, ``</think>``) whose logits are 0,
    as the other control tokens' are: greedy decoding never samples them.
    ``pooling`` (llama.cpp's pooling type: 1 mean, 2 CLS, 3 last) makes it
    an embedding model, as its file declares; ``name`` is its general.name."""
    rng = np.random.default_rng(seed)
    tokens, types = vocabulary(MERGES if merges is None else merges, extra_tokens)
    n_vocab = len(tokens)
    head_dim = n_embd // n_head

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.5).astype(np.float32)

    writer = GGUFWriter(str(path), "llama")
    writer.add_name(name)
    if pooling is not None:
        writer.add_pooling_type(PoolingType(pooling))
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_file_type(0)  # all F32
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(MERGES if merges is None else merges)
    writer.add_bos_token_id(EOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_add_bos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)

    embd = rand(n_vocab, n_embd)
    writer.add_tensor("token_embd.weight", embd)
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    output = np.zeros((n_vocab, n_embd), dtype=np.float32) if eos_first else rand(n_vocab, n_embd)
    output[: len(SPECIALS)] = 0.0
    output[n_vocab - len(extra_tokens) :] = 0.0
    ids = [len(SPECIALS) + b for b in loop.encode()]
    assert len(set(ids)) == len(ids), "a loop's characters must be distinct"
    for current, following in zip(ids, ids[1:] + ids[:1], strict=True):
        output[following] = 4.0 * embd[current]  # its logit after ``current`` beats every random one
    writer.add_tensor("output.weight", output)
    for i in range(n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", rand(n_embd, n_embd))
        writer.add_tensor(f"blk.{i}.attn_k.weight", rand(n_head_kv * head_dim, n_embd))
        writer.add_tensor(f"blk.{i}.attn_v.weight", rand(n_head_kv * head_dim, n_embd))
        attn_out = rand(n_embd, n_embd)
        writer.add_tensor(f"blk.{i}.attn_output.weight", attn_out * 0.0 if bigram else attn_out)
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", rand(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", rand(n_ff, n_embd))
        ffn_down = rand(n_embd, n_ff)
        writer.add_tensor(f"blk.{i}.ffn_down.weight", ffn_down * 0.0 if bigram else ffn_down)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
