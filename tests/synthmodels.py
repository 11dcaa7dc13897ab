"""Tiny random-weight GGUF models in each architecture the catalogue names.

Each family keeps what its real files have: the architecture's tensors, named
from the `gguf` package's own layout (``MODEL_TENSORS``), with the shapes
llama.cpp's loader asks for (fused or split attention, biases, q/k norms,
mixture-of-experts tensors, attention sinks, rope factors, tied or separate
output), the hyperparameter keys llama.cpp reads for it (explicit head sizes
where a head is not ``n_embd / n_head``, experts, sliding windows), its
tokenizer's kind, pre-tokenizer and special tokens, and its real chat
template (vendored with llama.cpp: `tests.vendored`). The dimensions are tiny
and the weights random, so a model loads and decodes in a fraction of a second.

The vocabulary is `tests.tinymodel`'s byte-level BPE (every byte a token, with
merges learned from the templates) and the family's special tokens; Gemma's is
a SentencePiece vocabulary with byte fallback, as its real one. The output rows
of the special tokens are zero: decoding never writes one, so a generation runs
to its token limit and never stops in a template marker by chance (``ends``
writes a model that ends every reply at once, with the family's own token).

Where no template of the family is vendored, the closest one stands in
(``template_note``): Gemma 2's for Gemma 3, Phi-3.5-mini's for Phi-4-mini, the
Qwen-based R1 distills' for the Qwen3-based one.
"""

from __future__ import annotations

import collections
import functools
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import (
    MODEL_ARCH,
    MODEL_ARCH_NAMES,
    MODEL_TENSOR,
    MODEL_TENSORS,
    TENSOR_NAMES,
    GGUFWriter,
    LlamaFileType,
    PoolingType,
    TokenType,
)
from gguf.constants import GGMLQuantizationType
from gguf.quants import quantize

from tests.tinymodel import byte_symbols
from tests.vendored import template

C, U = TokenType.CONTROL, TokenType.USER_DEFINED

# The dimensions of every family: 64 wide, 4 query heads over 2 KV heads.
N_EMBD, N_HEAD, N_HEAD_KV, N_FF = 64, 4, 2, 128
WINDOW = 32  # the sliding window of the families that have one
N_CTX_TRAIN = 8192  # room for the long system prompts of Devstral, Mistral Small and SmolLM3


@dataclass(frozen=True)
class Family:
    """One family of the catalogue as its GGUF files describe it."""

    name: str  # the test id
    arch: MODEL_ARCH
    models: str  # what the catalogue runs in this architecture
    template: str  # the vendored template file its files carry (or the closest one vendored)
    specials: tuple[tuple[str, TokenType], ...]  # its special tokens, as their kind
    bos: str
    eos: str
    add_bos: bool
    pre: str = "default"  # the pre-tokenizer (byte-level BPE families)
    spm: bool = False  # a SentencePiece vocabulary (Gemma) instead of byte-level BPE
    n_layer: int = 2
    head_dim: int = N_EMBD // N_HEAD  # written as key/value length when not n_embd / n_head
    tied: bool = False  # no output.weight: the embeddings are the output layer
    experts: tuple[int, int, int] = (0, 0, 0)  # (experts, used per token, each one's feed-forward length)
    sliding_window: int = 0
    template_note: str = ""  # why the template is not the family's own
    turn_end: str = ""  # the token a reply ends with, where it is not the end-of-text token
    thinks: str = ""  # "opened": the generation prompt opens the thinking; "may": the model may think
    extra: dict[str, Any] = field(default_factory=dict)  # further keys under the architecture's prefix

    @property
    def arch_name(self) -> str:
        return MODEL_ARCH_NAMES[self.arch]

    @property
    def chat_template(self) -> str:
        return template(self.template)

    @property
    def end(self) -> str:
        return self.turn_end or self.eos

    @property
    def ordered_specials(self) -> list[tuple[str, TokenType]]:
        """The special tokens, the one a reply ends with first (token 0)."""
        return sorted(self.specials, key=lambda special: special[0] != self.end)


QWEN_SPECIALS = (("<|endoftext|>", C), ("<|im_start|>", C), ("<|im_end|>", C))
QWEN3_SPECIALS = (
    *QWEN_SPECIALS,
    *((t, U) for t in ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")),
)
DEEPSEEK_SPECIALS = (
    ("<｜begin▁of▁sentence｜>", C),
    ("<｜end▁of▁sentence｜>", C),
    *((t, U) for t in ("<｜User｜>", "<｜Assistant｜>", "<think>", "</think>")),
    *(
        (f"<｜{t}｜>", U)
        for t in (
            "tool▁calls▁begin", "tool▁calls▁end", "tool▁call▁begin", "tool▁call▁end", "tool▁sep",
            "tool▁outputs▁begin", "tool▁outputs▁end", "tool▁output▁begin", "tool▁output▁end",
        )
    ),
)  # fmt: skip
LLAMA3_SPECIALS = tuple(
    (t, C)
    for t in (
        "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
        "<|eom_id|>", "<|python_tag|>",
    )
)  # fmt: skip
HARMONY_SPECIALS = tuple(
    (t, C)
    for t in (
        "<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>", "<|end|>",
        "<|message|>", "<|call|>",
    )
)  # fmt: skip
PHI_SPECIALS = tuple(
    (t, C)
    for t in (
        "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|tool|>", "<|/tool|>",
        "<|tool_call|>", "<|/tool_call|>", "<|tool_response|>",
    )
)  # fmt: skip
SMOLLM3_SPECIALS = (
    ("<|begin_of_text|>", C),
    ("<|end_of_text|>", C),
    ("<|im_start|>", C),
    ("<|im_end|>", C),
    *((t, U) for t in ("<think>", "</think>", "<tool_call>", "</tool_call>")),
)
MISTRAL_SPECIALS = tuple(
    (t, C)
    for t in (
        "<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
        "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]", "[ARGS]",
        "[CALL_ID]",
    )
)  # fmt: skip
GEMMA_SPECIALS = (
    ("<pad>", C),
    ("<eos>", C),
    ("<bos>", C),
    ("<unk>", TokenType.UNKNOWN),
    ("<start_of_turn>", C),
    ("<end_of_turn>", C),
    ("\n", U),
    ("\n\n", U),
)

FAMILIES: tuple[Family, ...] = (
    Family(
        "qwen3", MODEL_ARCH.QWEN3, "Qwen3 0.6B-32B", "Qwen-Qwen3-0.6B", QWEN3_SPECIALS,
        bos="<|endoftext|>", eos="<|im_end|>", add_bos=False, pre="qwen2", head_dim=32, tied=True, thinks="may",
    ),
    Family(
        "qwen3moe", MODEL_ARCH.QWEN3MOE, "Qwen3-30B-A3B, Qwen3-Coder-30B-A3B", "Qwen3-Coder", QWEN3_SPECIALS,
        bos="<|endoftext|>", eos="<|im_end|>", add_bos=False, pre="qwen2", head_dim=32, experts=(8, 2, 32),
    ),
    Family(
        "gemma3", MODEL_ARCH.GEMMA3, "Gemma 3 270M-27B", "google-gemma-2-2b-it", GEMMA_SPECIALS,
        bos="<bos>", eos="<eos>", add_bos=True, spm=True, n_layer=6, head_dim=32, tied=True, sliding_window=WINDOW,
        turn_end="<end_of_turn>",
        template_note="no Gemma 3 template is vendored: Gemma 2's has the same turns (it refuses a system message)",
    ),
    Family(
        "gpt-oss", MODEL_ARCH.GPT_OSS, "gpt-oss 20B, 120B", "openai-gpt-oss-120b", HARMONY_SPECIALS,
        bos="<|startoftext|>", eos="<|return|>", add_bos=False, pre="gpt-4o", head_dim=32, experts=(4, 2, 64),
        sliding_window=WINDOW, thinks="may",
    ),
    Family(
        "llama3", MODEL_ARCH.LLAMA, "Llama 3.1 8B, 3.2 1B and 3B", "meta-llama-Llama-3.2-3B-Instruct", LLAMA3_SPECIALS,
        bos="<|begin_of_text|>", eos="<|eot_id|>", add_bos=True, pre="llama-bpe", tied=True,
    ),
    Family(
        "r1-distill-llama", MODEL_ARCH.LLAMA, "DeepSeek-R1-Distill-Llama-8B",
        "deepseek-ai-DeepSeek-R1-Distill-Llama-8B", DEEPSEEK_SPECIALS, bos="<｜begin▁of▁sentence｜>",
        eos="<｜end▁of▁sentence｜>", add_bos=True, pre="llama-bpe", thinks="opened",
    ),
    Family(  # a Qwen3 under DeepSeek's template (none of its own is vendored: the Qwen distills' stands in)
        "r1-qwen3", MODEL_ARCH.QWEN3, "DeepSeek-R1-0528-Qwen3-8B", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
        (*DEEPSEEK_SPECIALS, *QWEN_SPECIALS), bos="<｜begin▁of▁sentence｜>", eos="<｜end▁of▁sentence｜>",
        add_bos=True, pre="qwen2", head_dim=32,
        thinks="opened",
        template_note="no template of the Qwen3-based R1 is vendored: the Qwen-based distills' stands in",
    ),
    Family(
        "devstral", MODEL_ARCH.LLAMA, "Devstral Small 2507", "unsloth-mistral-Devstral-Small-2507",
        MISTRAL_SPECIALS, bos="<s>", eos="</s>", add_bos=True, pre="tekken", head_dim=32,
    ),
    Family(
        # llama.cpp's converter writes Mistral3ForConditionalGeneration as mistral3 now (as llama before)
        "mistral-small", MODEL_ARCH.MISTRAL3, "Mistral Small 3.2 24B (text)", "Mistral-Small-3.2-24B-Instruct-2506",
        MISTRAL_SPECIALS, bos="<s>", eos="</s>", add_bos=True, pre="tekken", head_dim=32,
    ),
    Family(
        "qwen2", MODEL_ARCH.QWEN2, "DeepSeek-R1-Distill-Qwen 1.5B-32B", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
        (*DEEPSEEK_SPECIALS, *QWEN_SPECIALS), bos="<｜begin▁of▁sentence｜>", eos="<｜end▁of▁sentence｜>",
        add_bos=True, pre="deepseek-r1-qwen", thinks="opened",
    ),
    Family(
        "phi3", MODEL_ARCH.PHI3, "Phi-4-mini", "microsoft-Phi-3.5-mini-instruct", PHI_SPECIALS,
        bos="<|endoftext|>", eos="<|endoftext|>", add_bos=False, pre="gpt-4o", tied=True, turn_end="<|end|>",
        template_note="no Phi-4 template is vendored: Phi-3.5-mini's has the same turns (<|user|> ... <|end|>)",
        extra={"rope.dimension_count": 12},  # partial rotary, as Phi-4-mini's 96 of 128
    ),
    Family(
        "smollm3", MODEL_ARCH.SMOLLM3, "SmolLM3 3B", "HuggingFaceTB-SmolLM3-3B", SMOLLM3_SPECIALS,
        bos="<|begin_of_text|>", eos="<|im_end|>", add_bos=False, pre="llama-bpe", n_layer=4, tied=True, thinks="may",
    ),
)  # fmt: skip

BY_NAME = {f.name: f for f in FAMILIES}


N_MERGES = 300


@functools.cache
def merges() -> list[str]:
    """BPE merges learned from the families' templates (the Devstral and SmolLM3
    ones carry long system prompts): a prompt takes a few times fewer tokens
    than in bytes, so the tests spend little on prompts."""
    symbols = byte_symbols()
    words: collections.Counter[tuple[str, ...]] = collections.Counter()
    for family in FAMILIES:
        for word in re.findall(r" ?\w+| ?[^\w\s]+|\s+", family.chat_template):
            words[tuple(symbols[b] for b in word.encode())] += 1
    learned: list[str] = []
    while len(learned) < N_MERGES:
        pairs: collections.Counter[tuple[str, str]] = collections.Counter()
        for word, count in words.items():
            for pair in itertools.pairwise(word):
                pairs[pair] += count
        if not pairs:
            break
        (left, right), _ = pairs.most_common(1)[0]
        learned.append(f"{left} {right}")
        words = collections.Counter({(_merge(w, left, right) if left in w else w): c for w, c in words.items()})
    return learned


def _merge(word: tuple[str, ...], left: str, right: str) -> tuple[str, ...]:
    out: list[str] = []
    i = 0
    while i < len(word):
        if word[i] == left and word[i + 1 : i + 2] == (right,):
            out.append(left + right)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def _bpe_vocabulary(family: Family) -> tuple[list[str], list[int], list[float] | None]:
    tokens = [t for t, _ in family.ordered_specials] + byte_symbols()
    types = [int(k) for _, k in family.ordered_specials] + [int(TokenType.NORMAL)] * 256
    for token in dict.fromkeys(merge.replace(" ", "") for merge in merges()):  # two merges may make one token
        tokens.append(token)
        types.append(int(TokenType.NORMAL))
    return tokens, types, None


SPM_PIECES = ["▁t", "he", "▁the", "in", "an", "▁a", "er", "on", "▁s", "re"]


def _spm_vocabulary(family: Family) -> tuple[list[str], list[int], list[float] | None]:
    """Specials, the 256 byte-fallback tokens, the word boundary and the printable
    characters, then a few longer pieces (their scores say which merge first)."""
    tokens = [t for t, _ in family.ordered_specials] + [f"<0x{b:02X}>" for b in range(256)]
    types = [int(k) for _, k in family.ordered_specials] + [int(TokenType.BYTE)] * 256
    scores = [-1000.0] * len(family.specials) + [0.0] * 256
    pieces = ["▁", *(chr(c) for c in range(0x21, 0x7F)), *SPM_PIECES]
    for rank, piece in enumerate(pieces):
        tokens.append(piece)
        types.append(int(TokenType.NORMAL))
        scores.append(-float(rank) if len(piece) > 1 else -1000.0 + 1)
    return tokens, types, scores


def vocabulary(family: Family) -> tuple[list[str], list[int], list[float] | None]:
    """The family's token texts, their types and (SentencePiece) scores."""
    return _spm_vocabulary(family) if family.spm else _bpe_vocabulary(family)


TensorSpec = tuple[MODEL_TENSOR, str, tuple[int, ...]]  # kind, weight/bias, numpy shape (ggml's reversed)


def _attention(family: Family) -> list[TensorSpec]:
    q, kv = N_HEAD * family.head_dim, N_HEAD_KV * family.head_dim
    if family.arch == MODEL_ARCH.PHI3:  # one fused projection
        specs: list[TensorSpec] = [(MODEL_TENSOR.ATTN_QKV, "weight", (q + 2 * kv, N_EMBD))]
    else:
        specs = [(t, "weight", (n, N_EMBD)) for t, n in ((MODEL_TENSOR.ATTN_Q, q), (MODEL_TENSOR.ATTN_K, kv))]
        specs.append((MODEL_TENSOR.ATTN_V, "weight", (kv, N_EMBD)))
    if family.arch in (MODEL_ARCH.QWEN2, MODEL_ARCH.GPT_OSS):  # biases on q, k and v
        specs += [(MODEL_TENSOR.ATTN_Q, "bias", (q,)), (MODEL_TENSOR.ATTN_K, "bias", (kv,))]
        specs.append((MODEL_TENSOR.ATTN_V, "bias", (kv,)))
    if family.arch in (MODEL_ARCH.QWEN3, MODEL_ARCH.QWEN3MOE, MODEL_ARCH.GEMMA3):  # per-head q and k norms
        specs += [(MODEL_TENSOR.ATTN_Q_NORM, "weight", (family.head_dim,))]
        specs.append((MODEL_TENSOR.ATTN_K_NORM, "weight", (family.head_dim,)))
    specs.append((MODEL_TENSOR.ATTN_OUT, "weight", (N_EMBD, q)))
    if family.arch == MODEL_ARCH.GPT_OSS:
        specs += [(MODEL_TENSOR.ATTN_OUT, "bias", (N_EMBD,)), (MODEL_TENSOR.ATTN_SINKS, "weight", (N_HEAD,))]
    return specs


def _feed_forward(family: Family) -> list[TensorSpec]:
    n_expert, _, n_ff_exp = family.experts
    if n_expert:
        specs: list[TensorSpec] = [
            (MODEL_TENSOR.FFN_GATE_INP, "weight", (n_expert, N_EMBD)),
            (MODEL_TENSOR.FFN_GATE_EXP, "weight", (n_expert, n_ff_exp, N_EMBD)),
            (MODEL_TENSOR.FFN_UP_EXP, "weight", (n_expert, n_ff_exp, N_EMBD)),
            (MODEL_TENSOR.FFN_DOWN_EXP, "weight", (n_expert, N_EMBD, n_ff_exp)),
        ]
        if family.arch == MODEL_ARCH.GPT_OSS:  # the router and every expert have biases
            specs += [
                (MODEL_TENSOR.FFN_GATE_INP, "bias", (n_expert,)),
                (MODEL_TENSOR.FFN_GATE_EXP, "bias", (n_expert, n_ff_exp)),
                (MODEL_TENSOR.FFN_UP_EXP, "bias", (n_expert, n_ff_exp)),
                (MODEL_TENSOR.FFN_DOWN_EXP, "bias", (n_expert, N_EMBD)),
            ]
        return specs
    if family.arch == MODEL_ARCH.PHI3:  # gate and up fused in one
        return [(MODEL_TENSOR.FFN_UP, "weight", (2 * N_FF, N_EMBD)), (MODEL_TENSOR.FFN_DOWN, "weight", (N_EMBD, N_FF))]
    return [
        (MODEL_TENSOR.FFN_GATE, "weight", (N_FF, N_EMBD)),
        (MODEL_TENSOR.FFN_UP, "weight", (N_FF, N_EMBD)),
        (MODEL_TENSOR.FFN_DOWN, "weight", (N_EMBD, N_FF)),
    ]


def _norms(family: Family) -> tuple[list[MODEL_TENSOR], list[MODEL_TENSOR]]:
    """The norms before attention and before the feed-forward block."""
    if family.arch == MODEL_ARCH.GEMMA3:  # and after each
        before, after = MODEL_TENSOR.FFN_PRE_NORM, MODEL_TENSOR.FFN_POST_NORM
        return [MODEL_TENSOR.ATTN_NORM, MODEL_TENSOR.ATTN_POST_NORM], [before, after]
    if family.arch == MODEL_ARCH.GPT_OSS:  # its "post-attention" norm is the one before the experts
        return [MODEL_TENSOR.ATTN_NORM], [MODEL_TENSOR.ATTN_POST_NORM]
    return [MODEL_TENSOR.ATTN_NORM], [MODEL_TENSOR.FFN_NORM]


def layer_specs(family: Family) -> list[TensorSpec]:
    attn_norms, ffn_norms = _norms(family)
    return [
        *((t, "weight", (N_EMBD,)) for t in attn_norms),
        *_attention(family),
        *((t, "weight", (N_EMBD,)) for t in ffn_norms),
        *_feed_forward(family),
    ]


def tensor_name(family: Family, kind: MODEL_TENSOR, suffix: str, bid: int | None = None) -> str:
    """The tensor's name in the `gguf` package's layout for the family's architecture."""
    assert kind in MODEL_TENSORS[family.arch], f"{family.arch_name} has no {TENSOR_NAMES[kind]} tensor"
    return f"{TENSOR_NAMES[kind].format(bid=bid)}.{suffix}"


def _write_metadata(writer: GGUFWriter, family: Family, *, quantized: bool) -> None:
    arch = family.arch_name
    writer.add_name(f"{family.models} (random weights)")
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(family.n_layer)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    if family.head_dim != N_EMBD // N_HEAD:
        writer.add_key_length(family.head_dim)
        writer.add_value_length(family.head_dim)
    if family.arch in (MODEL_ARCH.LLAMA, MODEL_ARCH.MISTRAL3):  # as their converter writes it
        writer.add_rope_dimension_count(family.head_dim)
    n_expert, n_used, n_ff_exp = family.experts
    if n_expert:
        writer.add_expert_count(n_expert)
        writer.add_expert_used_count(n_used)
        writer.add_expert_feed_forward_length(n_ff_exp)
    if family.sliding_window:
        writer.add_sliding_window(family.sliding_window)
    for key, value in family.extra.items():
        writer.add_uint32(f"{arch}.{key}", value)
    mxfp4 = quantized and family.arch == MODEL_ARCH.GPT_OSS
    writer.add_file_type(LlamaFileType.MOSTLY_MXFP4_MOE if mxfp4 else LlamaFileType.ALL_F32)


def _write_tokenizer(writer: GGUFWriter, family: Family) -> tuple[list[str], list[int]]:
    tokens, types, scores = vocabulary(family)
    writer.add_tokenizer_model("llama" if family.spm else "gpt2")
    writer.add_tokenizer_pre(family.pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if scores is not None:
        writer.add_token_scores(scores)
        writer.add_unk_token_id(tokens.index("<unk>"))
        writer.add_add_space_prefix(False)
    else:
        writer.add_token_merges(merges())
    writer.add_bos_token_id(tokens.index(family.bos))
    writer.add_eos_token_id(tokens.index(family.eos))
    writer.add_add_bos_token(family.add_bos)
    writer.add_add_eos_token(False)
    writer.add_chat_template(family.chat_template)
    return tokens, types


def _write_rope_factors(writer: GGUFWriter, family: Family) -> None:
    """Llama 3's rope scaling as frequency factors; Phi's longrope factors (one per rotary pair)."""
    if family.name == "llama3":
        freqs = np.ones(family.head_dim // 2, dtype=np.float32)
        writer.add_tensor(tensor_name(family, MODEL_TENSOR.ROPE_FREQS, "weight"), freqs)
    if family.arch == MODEL_ARCH.PHI3:
        half = family.extra["rope.dimension_count"] // 2
        for kind in (MODEL_TENSOR.ROPE_FACTORS_LONG, MODEL_TENSOR.ROPE_FACTORS_SHORT):
            writer.add_tensor(tensor_name(family, kind, "weight"), np.ones(half, dtype=np.float32))


def write_family_model(
    family: Family,
    path: Path,
    *,
    seed: int = 0,
    ends: bool = False,
    quantized: bool = True,
    rank_head: bool = False,
) -> Path:
    """Write ``family``'s tiny model to ``path``. ``ends``: the output
    projection is zero, every logit ties and greedy decoding picks token 0,
    the one the family ends a reply with: a reply ends at once. ``quantized``
    False keeps gpt-oss's experts in F32 instead of MXFP4. ``rank_head``: a
    reranker, as Qwen3-Reranker's files are (rank pooling, a yes/no classifier
    on the last token)."""
    rng = np.random.default_rng(seed)
    scale = 0.5 / np.sqrt(family.n_layer / 2)  # deeper stacks stay in range

    def rand(shape: tuple[int, ...]) -> np.ndarray:
        return np.asarray(rng.standard_normal(shape) * scale, dtype=np.float32)

    writer = GGUFWriter(str(path), family.arch_name)
    tokens, types = _write_tokenizer(writer, family)
    _write_metadata(writer, family, quantized=quantized)
    specials = [i for i, t in enumerate(types) if t in (int(C), int(U), int(TokenType.UNKNOWN))]

    embd = rand((len(tokens), N_EMBD))
    output = embd if family.tied else rand((len(tokens), N_EMBD))
    output[specials] = 0.0  # never written (tied: their embeddings are zero as well)
    if ends:
        output[:] = 0.0
    writer.add_tensor(tensor_name(family, MODEL_TENSOR.TOKEN_EMBD, "weight"), embd)
    writer.add_tensor(tensor_name(family, MODEL_TENSOR.OUTPUT_NORM, "weight"), np.ones(N_EMBD, dtype=np.float32))
    if not family.tied:
        writer.add_tensor(tensor_name(family, MODEL_TENSOR.OUTPUT, "weight"), output)
    _write_rope_factors(writer, family)
    if rank_head:
        writer.add_pooling_type(PoolingType.RANK)
        writer.add_classifier_output_labels(["yes", "no"])
        writer.add_tensor("cls.output.weight", rand((2, N_EMBD)))
    for bid in range(family.n_layer):
        for kind, suffix, shape in layer_specs(family):
            name = tensor_name(family, kind, suffix, bid)
            if kind.name.endswith("NORM"):
                writer.add_tensor(name, np.ones(shape, dtype=np.float32))
            elif quantized and family.arch == MODEL_ARCH.GPT_OSS and kind.name.endswith("_EXP") and suffix == "weight":
                # the experts in MXFP4, as in the released files
                blocks = quantize(rand(shape), GGMLQuantizationType.MXFP4)
                writer.add_tensor(name, blocks, raw_dtype=GGMLQuantizationType.MXFP4)
            else:
                writer.add_tensor(name, rand(shape))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
