"""What a GGUF file says about a model, and what its KV cache costs.

KV bytes per token = layers x KV heads x (key length + value length) x bytes
per element, where q8_0 and q4_0 store blocks of 32 values with one f16 scale
(34 and 18 bytes a block).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localrun.gguf.reader import GGUFInfo

KV_BYTES_PER_ELEMENT: dict[str, float] = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
CONTEXT_STEP = 256
N_UBATCH = 512


def _as_int(value: Any, default: int) -> int:
    if isinstance(value, int):
        return value
    return default  # per-layer arrays (ArrayInfo) are not expanded here


@dataclass(frozen=True)
class ModelInfo:
    path: Path
    name: str
    architecture: str
    parameters: int
    weights_bytes: int
    quantization: str
    layers: int
    heads: int
    kv_heads: int
    key_length: int
    value_length: int
    context_length: int
    vocab_size: int
    has_chat_template: bool
    block_bytes: int = 0  # the repeating layers' weights (blk.N.*): what offloading a layer moves
    output_bytes: int = 0  # the output layer's weights (the tied embeddings when it has none of its own)

    @property
    def layer_bytes(self) -> int:
        """One repeating layer's weights, on average."""
        return self.block_bytes // self.layers if self.layers else 0

    @property
    def grouped_query_attention(self) -> bool:
        """Fewer KV heads than query heads (one KV head, multi-query attention, included)."""
        return 0 < self.kv_heads < self.heads

    @property
    def attention(self) -> str:
        """multi-head (a KV head per query head), multi-query (one KV head) or grouped-query."""
        if not self.grouped_query_attention:
            return "multi-head"
        return "multi-query" if self.kv_heads == 1 else "grouped-query"

    def kv_bytes_per_token(self, type_k: str, type_v: str | None = None) -> int:
        k, v = KV_BYTES_PER_ELEMENT[type_k], KV_BYTES_PER_ELEMENT[type_v or type_k]
        return round(self.layers * self.kv_heads * (self.key_length * k + self.value_length * v))

    def compute_bytes(self, n_ubatch: int = N_UBATCH) -> int:
        """An estimate of llama.cpp's compute buffer: a ubatch of logits plus
        activations (measured 300 MiB on Qwen2.5-Coder-0.5B; this gives 325)."""
        return 4 * n_ubatch * (self.vocab_size + 16 * self.heads * self.key_length)

    def auto_flash_attn(self, type_v: str) -> str:
        """What `--flash-attn auto` asks of llama.cpp before anything is
        measured: on for a quantized V cache (which needs it), else llama.cpp's
        own auto. Which mode decodes faster on this machine is measured by
        `localrun tune` (`localrun.tune.apply`), not assumed."""
        return "on" if type_v != "f16" else "auto"

    def context_bytes_per_token(self, type_k: str, type_v: str | None = None, flash_attn: str | None = None) -> int:
        """What each token of context costs: its KV cache, plus, without flash
        attention, a ubatch's f32 attention scores over it in the compute
        buffer, each head's and the mask's (llama.cpp sizes that buffer for a
        full context; see docs/benchmarks.md for how close this estimate came).
        ``flash_attn`` None: what auto resolves to."""
        type_v = type_v or type_k
        mode = flash_attn or self.auto_flash_attn(type_v)
        scores = 4 * N_UBATCH * (self.heads + 1) if mode == "off" else 0
        return self.kv_bytes_per_token(type_k, type_v) + scores

    def memory_needed(self, n_ctx: int, type_k: str, type_v: str | None = None, flash_attn: str | None = None) -> int:
        per_token = self.context_bytes_per_token(type_k, type_v, flash_attn)
        return self.weights_bytes + self.compute_bytes() + n_ctx * per_token

    def max_context(
        self, budget_bytes: int, type_k: str, type_v: str | None = None, flash_attn: str | None = None
    ) -> int:
        """The longest context (a multiple of 256, as llama.cpp pads it, up to
        the trained context) whose KV cache (and attention scores, see
        `context_bytes_per_token`) fits beside the weights and the compute
        buffer in ``budget_bytes``; 0 when none does."""
        room = budget_bytes - self.weights_bytes - self.compute_bytes()
        if room <= 0:
            return 0
        fits = room // self.context_bytes_per_token(type_k, type_v, flash_attn) // CONTEXT_STEP * CONTEXT_STEP
        return min(self.context_length, fits) if self.context_length else fits


def describe(info: GGUFInfo) -> ModelInfo:
    from gguf import LlamaFileType  # the gguf package (and numpy) only when a file is described

    heads = _as_int(info.arch_value("attention.head_count"), 0)
    kv_heads = _as_int(info.arch_value("attention.head_count_kv"), heads)
    embd = _as_int(info.arch_value("embedding_length"), 0)
    head_dim = embd // heads if heads else 0
    ftype = info.metadata.get("general.file_type")
    try:
        quant = (
            LlamaFileType(ftype).name.removeprefix("MOSTLY_").removeprefix("ALL_") if ftype is not None else "unknown"
        )
    except ValueError:
        quant = f"type {ftype}"
    block = sum(t.n_bytes for t in info.tensors if t.name.startswith("blk."))
    output = sum(t.n_bytes for t in info.tensors if t.name.startswith("output"))
    if not any(t.name == "output.weight" for t in info.tensors):  # tied: llama.cpp offloads a copy of the embeddings
        output += sum(t.n_bytes for t in info.tensors if t.name == "token_embd.weight")
    params = 0
    for t in info.tensors:
        n = 1
        for d in t.shape:
            n *= d
        params += n
    return ModelInfo(
        path=info.path,
        name=info.name,
        architecture=info.architecture,
        parameters=params,
        weights_bytes=sum(t.n_bytes for t in info.tensors),
        quantization=quant,
        layers=_as_int(info.arch_value("block_count"), 0),
        heads=heads,
        kv_heads=kv_heads,
        key_length=_as_int(info.arch_value("attention.key_length"), head_dim),
        value_length=_as_int(info.arch_value("attention.value_length"), head_dim),
        context_length=info.context_length or 0,
        vocab_size=info.n_vocab or 0,
        has_chat_template=info.chat_template is not None,
        block_bytes=block,
        output_bytes=output,
    )
