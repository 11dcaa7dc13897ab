"""Tiny random-weight GGUF models of llama.cpp's recurrent and hybrid architectures.

As `tests.synthmodels` does for the transformers, each family keeps what its
real files have: its mix of blocks (gated delta-net, Mamba-1 or Mamba-2
mixers, LFM2's short convolutions, attention, MLP-only blocks), their tensors
named from the `gguf` package's layout in the shapes llama.cpp's loader asks
for, the keys it reads (``ssm.*``, ``full_attention_interval``,
``shortconv.l_cache``, per-block ``head_count_kv`` and ``feed_forward_length``
arrays whose zeros mark the recurrent and MLP-only blocks, the experts), its
special tokens and its real chat template (`tests.vendored`; the closest one
where none of its own is vendored: ``template_note``). The vocabulary is
synthmodels' byte-level BPE.

A random output layer writes text that never repeats itself, so prompt lookup
would never draft. So the output layer walks rings: 64 text tokens in rings of
3 to 15, each token's code (the first half of its embedding) the output row of
its successor. One block, the averager, is wired by hand to add minus the mean
code of the tokens so far into the embeddings' empty second half, where each
ring token's row holds its own code: a repetition penalty. Greedy text runs
round a ring until the penalty tips it out, so it falls into loops of varied
periods, leaves them and comes back to them, and the loops branch where the
context decides. In 96 greedy tokens, n-gram lookup (the last 3 tokens, else 2)
drafts at about 30 to 70 % of the steps, and some 3 to 20 of its drafts are
wrong. The averager is the family's own recurrent mixer where it can be
(Mamba-2, gated delta-net: the text then depends on the recurrent state that a
rollback restores), else attention; the other blocks are random.
``Hybrid.penalty`` is the knob tuned per family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import MODEL_ARCH, MODEL_ARCH_NAMES, MODEL_TENSOR, MODEL_TENSORS, TENSOR_NAMES, GGUFWriter, TokenType
from gguf import MODEL_TENSOR as T

from tests.synthmodels import MISTRAL_SPECIALS, QWEN3_SPECIALS, merges
from tests.tinymodel import byte_symbols
from tests.vendored import template

C, U = TokenType.CONTROL, TokenType.USER_DEFINED

N_EMBD, N_HEAD, N_HEAD_KV, N_FF = 64, 4, 2, 128
HEAD_DIM = 32  # written as key/value length, as the real files' heads are wider than n_embd / n_head
N_CTX_TRAIN = 8192
D_CONV, D_STATE, D_INNER = 4, 16, 2 * N_EMBD  # Mamba: llama.cpp asserts an expansion of 2 (granite, jamba)
N_SSM_HEAD, N_GROUP = 8, 2  # Mamba-2: 8 heads of 16 over 2 groups
GDN_K_HEADS, GDN_V_HEADS = 2, 4  # gated delta-net: two value heads per key head, as Qwen3.5-9B's 16 over 32
L_CACHE = 3  # LFM2's short convolution

CODE = N_EMBD // 2  # a token's code: the first half of its embedding; the second half is the penalty's
CONST, CONST_VALUE = CODE - 1, 3.0  # one code coordinate every token shares: a constant for gates and queries
RING_TOKENS, RING = 64, (3, 16)  # how many tokens the output layer writes, in rings of these lengths
MIX = 0.3  # the gain of what the random blocks add to the residual stream (Hybrid.mix)
BETA = -0.9  # the delta-net averager's beta gate weight: sigmoid(-0.9 * 3.8), an average over ~30 tokens
DECAY = -0.05  # the Mamba-2 averager's A: its average fades over ~30 tokens too


@dataclass(frozen=True)
class Hybrid:
    """One recurrent or hybrid family as its GGUF files describe it. ``layers``
    names each block: ``R`` the family's recurrent mixer, ``A`` attention, ``F``
    MLP only (Nemotron-H), ``P`` attention beside Mamba-2 (Falcon-H1)."""

    name: str
    arch: MODEL_ARCH
    models: str  # the real models in this architecture
    template: str  # the vendored template its files carry (or the closest one vendored)
    specials: tuple[tuple[str, TokenType], ...]
    bos: str
    eos: str
    add_bos: bool
    pre: str  # the pre-tokenizer
    rollback: bool  # llama.cpp keeps recurrent snapshots to take back a rejected draft (llm_arch_supports_rs_rollback)
    layers: str
    penalty: float  # the averager's gain: tuned so that prompt lookup drafts often and is now and then wrong
    mix: float = MIX  # the gain of what the other, random blocks add to the residual stream
    experts: tuple[int, int, int] = (0, 0, 0)  # (experts, used per token, each one's feed-forward length)
    thinks: str = ""  # "opened": the generation prompt opens the thinking; "may": the model may think
    template_note: str = ""  # why the template is not the family's own
    keys: dict[str, Any] = field(default_factory=dict)  # its mixers' keys and its own, under the arch's prefix

    @property
    def arch_name(self) -> str:
        return MODEL_ARCH_NAMES[self.arch]

    @property
    def chat_template(self) -> str:
        return template(self.template)

    @property
    def end(self) -> str:
        """The token a reply ends with (as synthmodels' families say it)."""
        return self.eos

    @property
    def n_layer(self) -> int:
        return len(self.layers)


CHATML = (("<|im_start|>", C), ("<|im_end|>", C))
THINK = (("<think>", U), ("</think>", U))
LFM2_SPECIALS = (
    ("<|pad|>", C), ("<|startoftext|>", C), ("<|endoftext|>", C), *CHATML,
    *((f"<|{t}_{e}|>", C) for t in ("tool_list", "tool_call", "tool_response") for e in ("start", "end")), *THINK,
)  # fmt: skip
GRANITE_SPECIALS = tuple((t, C) for t in ("<|end_of_text|>", "<|start_of_role|>", "<|end_of_role|>", "<|pad|>"))
NEMOTRON2_SPECIALS = (
    *((t, C) for t in ("<unk>", "<s>", "</s>", "<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>")), *THINK,
    *((t, U) for t in ("<TOOLCALL>", "</TOOLCALL>", "<TOOL_RESPONSE>", "</TOOL_RESPONSE>")),
)  # fmt: skip
NEMOTRON3_SPECIALS = (
    ("<unk>", C), ("<s>", C), ("</s>", C), *CHATML, *THINK,
    *((t, U) for t in ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")),
)  # fmt: skip
CHATML_AFTER_BOS = (("<|startoftext|>", C), ("<|endoftext|>", C), *CHATML)

SSM = {"ssm.conv_kernel": D_CONV, "ssm.state_size": D_STATE}
# the delta-net's state_size is a head's key width, its time_step_rank the value heads, its group_count the key heads
DELTA_NET = {
    **SSM, "ssm.group_count": GDN_K_HEADS, "ssm.time_step_rank": GDN_V_HEADS, "ssm.inner_size": D_STATE * GDN_V_HEADS,
    "full_attention_interval": 4, "rope.dimension_count": HEAD_DIM // 4,  # partial rotary: a quarter, as the real
}  # fmt: skip
QWEN35 = {**DELTA_NET, "rope.dimension_sections": [2, 1, 1, 0]}  # interleaved M-RoPE, as [11, 11, 10, 0] of 64
MAMBA2 = {**SSM, "ssm.group_count": N_GROUP, "ssm.time_step_rank": N_SSM_HEAD, "ssm.inner_size": D_INNER}
HYBRID_MAMBA2 = {**MAMBA2, "rope.scaling.finetuned": False}  # no rope in Granite's and Nemotron-H's attention
NEMOTRON_H = {**HYBRID_MAMBA2, "attention.layer_norm_epsilon": 1e-6}  # required: the MTP head's norm
LFM2 = {"shortconv.l_cache": L_CACHE}

HYBRIDS: tuple[Hybrid, ...] = (
    Hybrid(
        "qwen35", MODEL_ARCH.QWEN35, "Qwen3.5 0.8B-27B", "Qwen3.5-4B", QWEN3_SPECIALS, "<|endoftext|>", "<|im_end|>",
        False, "qwen35", rollback=True, layers="RRRA", penalty=0.5, thinks="opened", keys=QWEN35,
    ),
    Hybrid(
        "qwen35moe", MODEL_ARCH.QWEN35MOE, "Qwen3.5-35B-A3B, 122B-A10B", "Qwen3.5-4B", QWEN3_SPECIALS,
        "<|endoftext|>", "<|im_end|>", False, "qwen35", rollback=True, layers="RRRA", penalty=0.5,
        experts=(8, 2, 32), thinks="opened", keys=QWEN35,
        template_note="Qwen3.5's MoE models carry the dense ones' template: Qwen3.5-4B's is the one vendored",
    ),
    Hybrid(
        "qwen3next", MODEL_ARCH.QWEN3NEXT, "Qwen3-Next-80B-A3B", "Qwen-Qwen3-0.6B", QWEN3_SPECIALS, "<|endoftext|>",
        "<|im_end|>", False, "qwen2", rollback=False, layers="RRRA", penalty=0.5, experts=(8, 2, 32), thinks="may",
        keys=DELTA_NET, template_note="no Qwen3-Next template is vendored: Qwen3's has the same turns and tool calls",
    ),
    Hybrid(
        "lfm2", MODEL_ARCH.LFM2, "LFM2 / LFM2.5 350M-2.6B", "LFM2.5-Instruct", LFM2_SPECIALS, "<|startoftext|>",
        "<|im_end|>", True, "lfm2", rollback=True, layers="RRAR", penalty=8.0, keys=LFM2,
    ),
    Hybrid(
        "lfm2moe", MODEL_ARCH.LFM2MOE, "LFM2-8B-A1B", "LFM2-8B-A1B", LFM2_SPECIALS, "<|startoftext|>", "<|im_end|>",
        True, "lfm2", rollback=True, layers="RRAR", penalty=6.0, experts=(8, 2, 32),
        keys={**LFM2, "leading_dense_block_count": 2, "expert_gating_func": 2},  # sigmoid
    ),
    Hybrid(  # its multipliers (tame ones) quarter the averager's gain: its penalty is 4 times the others'
        "granitehybrid", MODEL_ARCH.GRANITE_HYBRID, "Granite 4.0-H Micro", "ibm-granite-granite-4.0",
        GRANITE_SPECIALS, "<|end_of_text|>", "<|end_of_text|>", False, "dbrx", rollback=False, layers="RRAR",
        penalty=12.0, keys={**HYBRID_MAMBA2, "attention.scale": 1 / HEAD_DIM, "embedding_scale": 2.0,
                            "residual_scale": 0.5, "logit_scale": 4.0},
    ),
    Hybrid(
        "nemotron_h", MODEL_ARCH.NEMOTRON_H, "NVIDIA Nemotron Nano 9B v2", "NVIDIA-Nemotron-Nano-v2",
        NEMOTRON2_SPECIALS, "<s>", "<SPECIAL_12>", False, "tekken", rollback=True, layers="RFRAF", penalty=2.0,
        thinks="opened", keys=NEMOTRON_H,
    ),
    Hybrid(
        "nemotron_h_moe", MODEL_ARCH.NEMOTRON_H_MOE, "NVIDIA Nemotron 3 Nano 30B-A3B",
        "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", NEMOTRON3_SPECIALS, "<s>", "<|im_end|>", False, "tekken",
        rollback=True, layers="RFRAF", penalty=1.5, experts=(8, 2, 32), thinks="opened",
        keys={**NEMOTRON_H, "expert_shared_count": 1, "expert_weights_norm": True, "expert_weights_scale": 2.5,
              "expert_group_count": 1, "expert_group_used_count": 1},
    ),
    Hybrid(
        "mamba2", MODEL_ARCH.MAMBA2, "Mamba-Codestral-7B", "mistralai-Mistral-Nemo-Instruct-2407", MISTRAL_SPECIALS,
        "<s>", "</s>", True, "default", rollback=False, layers="RR", penalty=6.0, keys=MAMBA2,
        template_note="no Mamba-Codestral template is vendored: Mistral NeMo's has the same [INST] turns",
    ),
    Hybrid(
        "falcon-h1", MODEL_ARCH.FALCON_H1, "Falcon-H1 0.5B-34B", "LFM2-8B-A1B", CHATML_AFTER_BOS, "<|startoftext|>",
        "<|im_end|>", False, "falcon-h1", rollback=False, layers="PP", penalty=3.0, keys=MAMBA2,
        template_note="no Falcon-H1 template is vendored: LFM2's is ChatML after the BOS",
    ),
    Hybrid(  # its Mamba-1 has no output norm: a third of the others' mix
        "jamba", MODEL_ARCH.JAMBA, "Jamba Reasoning 3B, Jamba Mini", "LFM2.5-Instruct", CHATML_AFTER_BOS,
        "<|startoftext|>", "<|im_end|>", True, "default", rollback=False, layers="RRAR", penalty=8.0,
        mix=0.1, experts=(4, 2, N_FF), keys={**SSM, "ssm.time_step_rank": N_EMBD // 16, "ssm.inner_size": D_INNER},
        template_note="no Jamba template is vendored: LFM2.5's is ChatML after the BOS",
    ),
)  # fmt: skip

BY_NAME = {h.name: h for h in HYBRIDS}

Shape = tuple[int, ...]  # numpy's: ggml's reversed
TensorSpec = tuple[MODEL_TENSOR, str | None, Shape]  # kind, suffix ("weight", "bias" or none), shape
QWEN3X = (MODEL_ARCH.QWEN35, MODEL_ARCH.QWEN35MOE, MODEL_ARCH.QWEN3NEXT)
LFM2S = (MODEL_ARCH.LFM2, MODEL_ARCH.LFM2MOE)
NEMOTRONS = (MODEL_ARCH.NEMOTRON_H, MODEL_ARCH.NEMOTRON_H_MOE)
ATTENTION_AVERAGER = (*LFM2S, MODEL_ARCH.JAMBA)  # no recurrent mixer that can average: a short conv, Mamba-1
RESIDUAL_WRITERS = {T.ATTN_OUT, T.SSM_OUT, T.SHORTCONV_OUTPROJ, T.FFN_DOWN, T.FFN_DOWN_EXP, T.FFN_DOWN_SHEXP}


def head_dim(family: Hybrid) -> int:
    """LFM2's and Jamba's loaders want n_embd / n_head; the others read key_length."""
    return N_EMBD // N_HEAD if family.arch in ATTENTION_AVERAGER else HEAD_DIM


def _attention(family: Hybrid) -> list[TensorSpec]:
    """Qwen3.5/Next's query carries its output gate (twice as wide); they and LFM2 norm q and k."""
    head = head_dim(family)
    q, kv = N_HEAD * head, N_HEAD_KV * head
    specs: list[TensorSpec] = [
        (T.ATTN_Q, "weight", (2 * q if family.arch in QWEN3X else q, N_EMBD)), (T.ATTN_K, "weight", (kv, N_EMBD)),
        (T.ATTN_V, "weight", (kv, N_EMBD)), (T.ATTN_OUT, "weight", (N_EMBD, q)),
    ]  # fmt: skip
    if family.arch in (*QWEN3X, *LFM2S):
        specs += [(T.ATTN_Q_NORM, "weight", (head,)), (T.ATTN_K_NORM, "weight", (head,))]
    return specs


def _delta_net(family: Hybrid) -> list[TensorSpec]:
    """Fused q/k/v, the output gate z, beta and alpha (Qwen3-Next: in one projection)."""
    key, value = D_STATE * GDN_K_HEADS, D_STATE * GDN_V_HEADS
    if family.arch == MODEL_ARCH.QWEN3NEXT:
        beta_alpha: list[TensorSpec] = [(T.SSM_BETA_ALPHA, "weight", (2 * GDN_V_HEADS, N_EMBD))]
    else:
        beta_alpha = [(t, "weight", (GDN_V_HEADS, N_EMBD)) for t in (T.SSM_BETA, T.SSM_ALPHA)]
    return [
        (T.ATTN_QKV, "weight", (2 * key + value, N_EMBD)), (T.ATTN_GATE, "weight", (value, N_EMBD)),
        (T.SSM_CONV1D, "weight", (2 * key + value, D_CONV)), (T.SSM_DT, "bias", (GDN_V_HEADS,)),
        (T.SSM_A, None, (GDN_V_HEADS,)), *beta_alpha, (T.SSM_NORM, "weight", (D_STATE,)),
        (T.SSM_OUT, "weight", (N_EMBD, value)),
    ]  # fmt: skip


def _mamba2() -> list[TensorSpec]:
    conv = D_INNER + 2 * N_GROUP * D_STATE
    return [
        (T.SSM_IN, "weight", (D_INNER + conv + N_SSM_HEAD, N_EMBD)),  # z, then x B C, then dt
        (T.SSM_CONV1D, "weight", (conv, D_CONV)), (T.SSM_CONV1D, "bias", (conv,)), (T.SSM_DT, "bias", (N_SSM_HEAD,)),
        (T.SSM_A, None, (N_SSM_HEAD, 1)), (T.SSM_D, None, (N_SSM_HEAD, 1)),
        (T.SSM_NORM, "weight", (N_GROUP, D_INNER // N_GROUP)), (T.SSM_OUT, "weight", (N_EMBD, D_INNER)),
    ]  # fmt: skip


def _mamba1() -> list[TensorSpec]:
    """Jamba's Mamba-1, with its RMS norms on dt, B and C."""
    dt_rank = N_EMBD // 16
    return [
        (T.SSM_IN, "weight", (2 * D_INNER, N_EMBD)), (T.SSM_CONV1D, "weight", (D_INNER, D_CONV)),
        (T.SSM_CONV1D, "bias", (D_INNER,)), (T.SSM_X, "weight", (dt_rank + 2 * D_STATE, D_INNER)),
        (T.SSM_DT_NORM, "weight", (dt_rank,)), (T.SSM_DT, "weight", (D_INNER, dt_rank)), (T.SSM_DT, "bias", (D_INNER,)),
        (T.SSM_B_NORM, "weight", (D_STATE,)), (T.SSM_C_NORM, "weight", (D_STATE,)),
        (T.SSM_A, None, (D_INNER, D_STATE)), (T.SSM_D, None, (D_INNER,)), (T.SSM_OUT, "weight", (N_EMBD, D_INNER)),
    ]  # fmt: skip


def _mixer(family: Hybrid, kind: str) -> list[TensorSpec]:
    if kind in "AP":
        return _attention(family) + (_mamba2() if kind == "P" else [])
    if kind == "F":
        return []
    if family.arch in QWEN3X:
        return _delta_net(family)
    if family.arch in LFM2S:
        return [
            (T.SHORTCONV_CONV, "weight", (N_EMBD, L_CACHE)), (T.SHORTCONV_INPROJ, "weight", (3 * N_EMBD, N_EMBD)),
            (T.SHORTCONV_OUTPROJ, "weight", (N_EMBD, N_EMBD)),
        ]  # fmt: skip
    return _mamba1() if family.arch == MODEL_ARCH.JAMBA else _mamba2()


def _feed_forward(family: Hybrid, bid: int) -> list[TensorSpec]:
    n_expert, _, n_ff = family.experts
    if family.arch == MODEL_ARCH.MAMBA2 or (family.arch in NEMOTRONS and family.layers[bid] != "F"):
        return []
    shared = 2 * n_ff
    if family.arch in NEMOTRONS:  # squared ReLU: up and down only, and a shared expert
        if not n_expert:
            return [(T.FFN_UP, "weight", (N_FF, N_EMBD)), (T.FFN_DOWN, "weight", (N_EMBD, N_FF))]
        return [
            (T.FFN_GATE_INP, "weight", (n_expert, N_EMBD)), (T.FFN_EXP_PROBS_B, "bias", (n_expert,)),
            (T.FFN_UP_EXP, "weight", (n_expert, n_ff, N_EMBD)), (T.FFN_DOWN_EXP, "weight", (n_expert, N_EMBD, n_ff)),
            (T.FFN_UP_SHEXP, "weight", (shared, N_EMBD)), (T.FFN_DOWN_SHEXP, "weight", (N_EMBD, shared)),
        ]  # fmt: skip
    # LFM2-8B-A1B's first two blocks are dense; Jamba's experts are in every other block
    dense = (family.arch == MODEL_ARCH.LFM2MOE and bid < 2) or (family.arch == MODEL_ARCH.JAMBA and bid % 2 == 0)
    if not n_expert or dense:
        return [(T.FFN_GATE, "weight", (N_FF, N_EMBD)), (T.FFN_UP, "weight", (N_FF, N_EMBD)),
                (T.FFN_DOWN, "weight", (N_EMBD, N_FF))]  # fmt: skip
    specs: list[TensorSpec] = [
        (T.FFN_GATE_INP, "weight", (n_expert, N_EMBD)), (T.FFN_GATE_EXP, "weight", (n_expert, n_ff, N_EMBD)),
        (T.FFN_UP_EXP, "weight", (n_expert, n_ff, N_EMBD)), (T.FFN_DOWN_EXP, "weight", (n_expert, N_EMBD, n_ff)),
    ]  # fmt: skip
    if family.arch == MODEL_ARCH.LFM2MOE:  # sigmoid routing with a bias per expert
        specs.append((T.FFN_EXP_PROBS_B, "bias", (n_expert,)))
    if family.arch in QWEN3X:  # a shared expert behind a sigmoid gate
        specs += [
            (T.FFN_GATE_INP_SHEXP, "weight", (N_EMBD,)), (T.FFN_GATE_SHEXP, "weight", (shared, N_EMBD)),
            (T.FFN_UP_SHEXP, "weight", (shared, N_EMBD)), (T.FFN_DOWN_SHEXP, "weight", (N_EMBD, shared)),
        ]  # fmt: skip
    return specs


def layer_specs(family: Hybrid, bid: int) -> list[TensorSpec]:
    """Block ``bid``'s tensors: its norms, its mixer, its feed-forward part."""
    norms: list[TensorSpec] = [(T.ATTN_NORM, "weight", (N_EMBD,))]
    if family.arch in QWEN3X:
        norms.append((T.ATTN_POST_NORM, "weight", (N_EMBD,)))
    elif family.arch == MODEL_ARCH.FALCON_H1:  # its converter maps the whole HF name: no ".weight"
        norms.append((T.FFN_PRE_NORM, None, (N_EMBD,)))
    elif family.arch not in (*NEMOTRONS, MODEL_ARCH.MAMBA2):
        norms.append((T.FFN_NORM, "weight", (N_EMBD,)))
    return norms + _mixer(family, family.layers[bid]) + _feed_forward(family, bid)


def tensor_name(family: Hybrid, kind: MODEL_TENSOR, suffix: str | None, bid: int | None = None) -> str:
    """The name in the `gguf` package's layout for the family (the output layer
    is written for all: the rings need it where the real files tie it)."""
    assert kind == T.OUTPUT or kind in MODEL_TENSORS[family.arch], f"{family.arch_name} has no {TENSOR_NAMES[kind]}"
    name = TENSOR_NAMES[kind].format(bid=bid)
    return f"{name}.{suffix}" if suffix else name


def vocabulary(family: Hybrid) -> tuple[list[str], list[int]]:
    """The special tokens, the 256 bytes, then synthmodels' merges."""
    tokens = (
        [t for t, _ in family.specials] + byte_symbols() + list(dict.fromkeys(m.replace(" ", "") for m in merges()))
    )
    return tokens, [int(k) for _, k in family.specials] + [int(TokenType.NORMAL)] * (len(tokens) - len(family.specials))


def text_tokens(family: Hybrid) -> list[int]:
    """The tokens of printable ASCII text: the ones the rings may take."""
    byte_of = {symbol: b for b, symbol in enumerate(byte_symbols())}
    tokens, _ = vocabulary(family)
    first = len(family.specials)
    return [i for i, t in enumerate(tokens) if i >= first and all(0x20 <= byte_of.get(c, 0) < 0x7F for c in t)]


def _write_shape(writer: GGUFWriter, family: Hybrid, extra_blocks: int = 0) -> None:
    """The keys every family has: sizes, heads (zero: a block without attention), norms.
    ``extra_blocks``: blocks after the trunk that block_count counts too (an MTP head)."""
    arch, kinds = family.arch, family.layers
    n_expert, n_used, n_ff = family.experts
    writer.add_name(f"{family.models} (random weights)")
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(family.n_layer + extra_blocks)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_file_type(0)  # all F32
    writer.add_head_count(0 if arch == MODEL_ARCH.MAMBA2 else N_HEAD)  # as Mamba-2's converter writes it
    if arch in (*LFM2S, *NEMOTRONS, MODEL_ARCH.GRANITE_HYBRID, MODEL_ARCH.JAMBA):
        writer.add_head_count_kv([N_HEAD_KV if k == "A" else 0 for k in kinds])
    elif arch != MODEL_ARCH.MAMBA2:
        writer.add_head_count_kv(N_HEAD_KV)
    if arch in NEMOTRONS:  # zero: no MLP (a Mamba block where head_count_kv is zero too)
        writer.add_feed_forward_length([(n_ff or N_FF) if k == "F" else 0 for k in kinds])
    else:
        writer.add_feed_forward_length(0 if arch == MODEL_ARCH.MAMBA2 else N_FF)
    if head_dim(family) != N_EMBD // N_HEAD:
        writer.add_key_length(head_dim(family))
        writer.add_value_length(head_dim(family))
    if n_expert:
        writer.add_expert_count(n_expert)
        writer.add_expert_used_count(n_used)
        if arch != MODEL_ARCH.JAMBA:  # Jamba's experts are feed_forward_length wide
            writer.add_expert_feed_forward_length(n_ff)
        if arch in (*QWEN3X, *NEMOTRONS):
            writer.add_expert_shared_feed_forward_length(2 * n_ff)


def _write_keys(writer: GGUFWriter, family: Hybrid) -> None:
    """The family's own keys (``Hybrid.keys``), typed as llama.cpp reads them."""
    for name, value in family.keys.items():
        key = f"{family.arch_name}.{name}"
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_array(key, value)


def output_layer(rng: np.random.Generator, embd: np.ndarray, text: list[int]) -> np.ndarray:
    """RING_TOKENS of ``text`` in rings: after a token its successor scores its code's
    squared norm, and every ring token reads the penalty with its own code. Every
    other row reads the constant negatively: the special tokens are never written."""
    output = np.zeros_like(embd)
    output[:, CONST] = -4 * CONST_VALUE
    order = [int(i) for i in rng.choice(text, size=min(RING_TOKENS, len(text)), replace=False)]
    while order:
        n = int(rng.integers(*RING))
        ring, order = (order, []) if len(order) < n + RING[0] else (order[:n], order[n:])
        for current, following in zip(ring, ring[1:] + ring[:1], strict=True):
            output[following, :CODE] = embd[current, :CODE]
            output[following, CODE:] = embd[following, :CODE]
    output[:, CODE + CONST] = 0.0  # the constant's mean is no penalty
    return output


def _attention_averager(family: Hybrid, kind: MODEL_TENSOR, shape: Shape) -> np.ndarray | None:
    """A zero query attends to every token so far alike; the values are their codes,
    written negated into the penalty half."""
    head, w = head_dim(family), np.zeros(shape, dtype=np.float32)
    if kind == T.ATTN_V:
        w[:CODE, :CODE] = np.eye(CODE)[: shape[0]]
    elif kind == T.ATTN_OUT:
        for g in range(min(N_HEAD_KV, CODE // head)):  # the first query head of each kv head
            h = g * (N_HEAD // N_HEAD_KV)
            w[CODE + g * head : CODE + (g + 1) * head, h * head : (h + 1) * head] = -family.penalty * np.eye(head)
    elif kind not in (T.ATTN_Q, T.ATTN_K):
        return None
    return w


def _delta_net_averager(family: Hybrid, kind: MODEL_TENSOR, shape: Shape) -> np.ndarray | None:
    """q = k = one constant unit vector, no decay, a small beta: the state read back
    is a moving average of the values. Each value head holds eight code coordinates
    and their negations (silu(a) - silu(-a) = a, under one per-head norm)."""
    w, key, half = np.zeros(shape, dtype=np.float32), D_STATE * GDN_K_HEADS, D_STATE // 2
    if kind == T.ATTN_QKV:
        w[0 : 2 * key : D_STATE, CONST] = 1.0
        for j in range(GDN_V_HEADS):
            rows, cols = 2 * key + j * D_STATE + np.arange(half), j * half + np.arange(half)
            w[rows, cols], w[rows + half, cols] = 1.0, -1.0
    elif kind == T.ATTN_GATE:  # one positive gate for all: the norm takes it out
        w[:, CONST] = 1.0
    elif kind == T.SSM_CONV1D:
        w[:, -1] = 1.0
    elif kind == T.SSM_BETA:
        w[:, CONST] = BETA
    elif kind == T.SSM_BETA_ALPHA:  # per key head: its value heads' betas, then their alphas
        per = GDN_V_HEADS // GDN_K_HEADS
        w[np.arange(shape[0]) % (2 * per) < per, CONST] = BETA
    elif kind == T.SSM_OUT:
        for j in range(GDN_V_HEADS):
            rows, cols = CODE + j * half + np.arange(half), j * D_STATE + np.arange(half)
            w[rows, cols], w[rows, cols + half] = -family.penalty, family.penalty
    elif kind not in (T.SSM_A, T.SSM_ALPHA, T.SSM_DT):
        return None
    return w


def _mamba2_averager(family: Hybrid, kind: MODEL_TENSOR, suffix: str | None, shape: Shape) -> np.ndarray | None:
    """x the code and its negation, B, C and dt constant, a slow decay, no D, and the
    gate z one positive scalar for all channels, which the grouped norm takes out."""
    w, code = np.zeros(shape, dtype=np.float32), np.arange(CODE)
    if kind == T.SSM_IN:
        w[:D_INNER, CONST] = 1.0
        w[D_INNER + code, code], w[D_INNER + CODE + code, code] = 1.0, -1.0
    elif kind == T.SSM_CONV1D:
        if suffix == "weight":
            w[: 2 * CODE, -1] = 1.0
        else:
            w[D_INNER:] = 1.0  # B and C: silu(1)
    elif kind == T.SSM_A:
        w[:] = DECAY
    elif kind == T.SSM_OUT:
        w[CODE + code, code], w[CODE + code, CODE + code] = -family.penalty, family.penalty
    elif kind not in (T.SSM_DT, T.SSM_D):
        return None
    return w


def _averager(family: Hybrid, kind: MODEL_TENSOR, suffix: str | None, shape: Shape) -> np.ndarray | None:
    """The averaging block's weights for ``kind`` (None: random as in any block)."""
    if family.arch in ATTENTION_AVERAGER:
        return _attention_averager(family, kind, shape)
    if family.arch in QWEN3X:
        return _delta_net_averager(family, kind, shape)
    return _mamba2_averager(family, kind, suffix, shape)


def _init(rng: np.random.Generator, kind: MODEL_TENSOR, suffix: str | None, shape: Shape) -> np.ndarray:
    """Norms one, decays negative and slow, the rest random with unit gain (1 / sqrt(fan-in))."""
    if kind.name.endswith("NORM") or kind == T.SSM_D:
        return np.ones(shape, dtype=np.float32)
    if kind == T.SSM_A:  # -exp(A_log), as the converters write it
        return -np.exp(rng.uniform(-4.0, 0.0, shape)).astype(np.float32)
    if kind == T.SSM_DT and suffix == "bias":  # softplus(-2): a moderate step
        return np.full(shape, -2.0, dtype=np.float32)
    if kind == T.FFN_EXP_PROBS_B:
        return np.zeros(shape, dtype=np.float32)
    return np.asarray(rng.standard_normal(shape) / np.sqrt(shape[-1]), dtype=np.float32)


def write_hybrid_model(
    family: Hybrid,
    path: Path,
    *,
    seed: int = 0,
    extra_blocks: int = 0,
    extend: Callable[[GGUFWriter, np.random.Generator, np.ndarray], None] | None = None,
) -> Path:
    """Write ``family``'s tiny model to ``path`` (F32, 0.5 to 1.7 MB): the averager is
    its last recurrent block (its last attention block for LFM2 and Jamba), the
    other blocks are random, and what they add to the residual stream is scaled
    by ``Hybrid.mix``, so the rings and the penalty decide the text.
    ``extend``: writes ``extra_blocks`` more blocks' keys and tensors after the
    trunk's (with the generator and the token embeddings): `tests.mtpmodel`."""
    rng = np.random.default_rng(seed)
    tokens, types = vocabulary(family)
    writer = GGUFWriter(str(path), family.arch_name)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(family.pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges())
    writer.add_bos_token_id(tokens.index(family.bos))
    writer.add_eos_token_id(tokens.index(family.eos))
    writer.add_add_bos_token(family.add_bos)
    writer.add_add_eos_token(False)
    writer.add_chat_template(family.chat_template)
    _write_shape(writer, family, extra_blocks)
    _write_keys(writer, family)

    embd = np.zeros((len(tokens), N_EMBD), dtype=np.float32)
    embd[:, :CODE] = rng.standard_normal((len(tokens), CODE))
    embd[:, CONST] = CONST_VALUE
    writer.add_tensor(tensor_name(family, T.TOKEN_EMBD, "weight"), embd)
    norm = T.TOKEN_EMBD_NORM if family.arch in LFM2S else T.OUTPUT_NORM  # LFM2's final norm, under its odd name
    writer.add_tensor(tensor_name(family, norm, "weight"), np.ones(N_EMBD, dtype=np.float32))
    writer.add_tensor(tensor_name(family, T.OUTPUT, "weight"), output_layer(rng, embd, text_tokens(family)))
    kinds = "A" if family.arch in ATTENTION_AVERAGER else "RP"
    averaging = max(i for i, k in enumerate(family.layers) if k in kinds)
    for bid in range(family.n_layer):
        for kind, suffix, shape in layer_specs(family, bid):
            weights = _init(rng, kind, suffix, shape) * np.float32(family.mix if kind in RESIDUAL_WRITERS else 1.0)
            if bid == averaging and (fixed := _averager(family, kind, suffix, shape)) is not None:
                weights = fixed
            writer.add_tensor(tensor_name(family, kind, suffix, bid), weights)
    if extend is not None:
        extend(writer, rng, embd)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
