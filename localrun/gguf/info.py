"""What a GGUF file says about a model, and what its memory costs.

A transformer's memory is its KV cache: KV bytes per token = the attention
layers' KV heads x (key length + value length) x bytes per element, where q8_0
and q4_0 store blocks of 32 values with one f16 scale (34 and 18 bytes a block).

A recurrent layer (Mamba's SSM, the gated delta-net of Qwen3-Next and Qwen3.5,
LFM2's short convolution, RWKV's time mix) holds no KV cache but one state per
sequence, whatever its length: llama.cpp keeps it in f32, n_embd_r + n_embd_s
values a layer (llama-hparams.cpp), in 1 + n_rs_seq copies where a context keeps
snapshots to roll a speculative draft back (llama-memory-recurrent.cpp). A hybrid
(Qwen3.5, LFM2, Granite 4, Nemotron-H, Jamba, Falcon-H1) has both, in different
layers (Falcon-H1: side by side in each). `describe` runs before any load, so
which layer holds what is read from the GGUF by llama.cpp's own rules: each
architecture's `load_arch_hparams` (src/models/) and `llama_model::create_memory`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localrun.gguf.reader import GGUFInfo

KV_BYTES_PER_ELEMENT: dict[str, float] = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
CONTEXT_STEP = 256
N_UBATCH = 512
ATTENTION, HYBRID, RECURRENT = "attention", "hybrid", "recurrent"  # ModelInfo.memory
STATE_BYTES = 4  # llama.cpp keeps recurrent states (its R and S caches) in f32
UNBOUNDED_CONTEXT = 2**20  # a context no KV cache limits: what convert_hf_to_gguf writes for a Mamba

# llama.cpp's rules for which layer holds what (llm_arch_is_recurrent, each load_arch_hparams, create_memory)
_RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})  # every layer
_INTERVAL_ARCHS = frozenset({"qwen3next", "qwen35", "qwen35moe", "qwen4exp", "minimax-01"})  # recurrent_layers
_HEAD_KV_ARCHS = frozenset({"lfm2", "lfm2moe", "granitehybrid", "jamba", "plamo2", "kimi-linear"})  # 0 KV heads
_NEMOTRON_H = frozenset({"nemotron_h", "nemotron_h_moe"})  # 0 KV heads and no FFN: recurrent; an FFN: neither
_SIDE_BY_SIDE = frozenset({"falcon-h1"})  # every layer attends and recurs
_NO_SSM_GROUPS = frozenset({"mamba", "jamba"})  # their load_arch_hparams read no ssm.group_count
# llm_arch_supports_rs_rollback: the others get n_rs_seq clamped to 0, no snapshots
_SNAPSHOT_ARCHS = frozenset(
    {"qwen35", "qwen35moe", "qwen4exp", "nemotron_h", "nemotron_h_moe", "lfm2", "lfm2moe"}
    | {"kimi-k3", "deepseek4", "glm5-next", "bailingmoe3"}
)
# per-block tensors that mark a layer of an architecture none of the rules above name
_RECURRENT_TENSOR_PREFIXES = ("ssm_", "shortconv", "time_mix_")
_KV_TENSORS = frozenset({"attn_k", "attn_k_b", "attn_kv_a_mqa"})  # a key projection: a KV cache, always
_QUERY_TENSORS = frozenset({"attn_q", "attn_qkv"})  # a KV cache unless the layer recurs (a delta-net's fused qkv)


def _as_int(value: Any, default: int) -> int:
    if isinstance(value, int):
        return value
    return default  # per-layer arrays: `_per_layer`


def _per_layer(value: Any, n: int, default: tuple[int, ...]) -> tuple[int, ...]:
    """A key llama.cpp reads with get_key_or_arr: one number for all ``n``
    layers, or an array of one a layer (`ArrayInfo.values`); ``default`` when
    absent or of another length (which llama.cpp refuses)."""
    if isinstance(value, int):
        return (value,) * n
    values = getattr(value, "values", None)
    if values is not None and len(values) == n:
        return tuple(int(v) for v in values)
    return default


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
    # the KV heads of each layer that holds a KV cache; None: all `layers`, `kv_heads` each
    kv_layer_heads: tuple[int, ...] | None = None
    recurrent_layers: int = 0  # layers that hold a recurrent state instead of (Falcon-H1: beside) a KV cache
    recurrent_layer_bytes: int = 0  # one such layer's state of one sequence: (n_embd_r + n_embd_s) f32 values
    keeps_snapshots: bool = False  # llama.cpp keeps a context's n_rs_seq snapshots (else clamps it to 0)
    # the KV heads of each MTP ("nextn") layer localrun can draft with: an MTP context of its own holds their cache
    mtp_kv_heads: tuple[int, ...] = ()
    mtp_ubatch: int = 0  # with the head's cache counted (`with_mtp_cache`): its context's micro-batch

    @property
    def layer_bytes(self) -> int:
        """One repeating layer's weights, on average."""
        return self.block_bytes // self.layers if self.layers else 0

    def with_mtp_cache(self, ubatch: int) -> ModelInfo:
        """This model as a run that drafts with its MTP head holds it: the
        head's KV cache (in a context of its own, as many cells as the
        model's, of the same KV types) counted with the trunk's layers, and
        that context's compute buffer (a micro-batch of ``ubatch``) with the
        model's."""
        if not self.mtp_kv_heads:
            return self
        # the trunk's cache never covers the head's blocks (`_layers`): its heads are apart, not counted twice
        trunk = self.kv_layer_heads if self.kv_layer_heads is not None else (self.kv_heads,) * self.layers
        return replace(self, kv_layer_heads=trunk + self.mtp_kv_heads, mtp_kv_heads=(), mtp_ubatch=ubatch)

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

    @property
    def attention_layers(self) -> int:
        """The layers that hold a KV cache (all of a transformer's)."""
        return self.layers if self.kv_layer_heads is None else len(self.kv_layer_heads)

    @property
    def memory(self) -> str:
        """What a context's memory is: attention (a KV cache, which grows with
        the context), recurrent (a state per sequence, which does not) or
        hybrid (both, in different layers)."""
        if not self.recurrent_layers:
            return ATTENTION
        return HYBRID if self.attention_layers else RECURRENT

    def recurrent_bytes(self, n_seq: int = 1, snapshots: int = 0) -> int:
        """The recurrent state of ``n_seq`` sequences, as llama.cpp allocates
        it: every recurrent layer's, once per sequence (at least one), and
        ``snapshots`` (a context's n_rs_seq) more copies where the architecture
        keeps them to roll back a draft. 0 for a transformer."""
        copies = 1 + max(snapshots, 0) if self.keeps_snapshots else 1
        return self.recurrent_layers * self.recurrent_layer_bytes * max(n_seq, 1) * copies

    def kv_bytes_per_token(self, type_k: str, type_v: str | None = None) -> int:
        """The KV cache of one token: the attention layers' only."""
        k, v = KV_BYTES_PER_ELEMENT[type_k], KV_BYTES_PER_ELEMENT[type_v or type_k]
        heads = self.layers * self.kv_heads if self.kv_layer_heads is None else sum(self.kv_layer_heads)
        return round(heads * (self.key_length * k + self.value_length * v))

    def compute_bytes(self, n_ubatch: int = N_UBATCH) -> int:
        """An estimate of llama.cpp's compute buffer: a ubatch of logits plus
        activations (measured 300 MiB on Qwen2.5-Coder-0.5B; this gives 325);
        and the MTP context's, where its cache is counted (`with_mtp_cache`)."""
        return 4 * (n_ubatch + self.mtp_ubatch) * (self.vocab_size + 16 * self.heads * self.key_length)

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
        # the MTP context's micro-batch (`with_mtp_cache`) holds its own scores over the context
        scores = 4 * (N_UBATCH + self.mtp_ubatch) * (self.heads + 1) if mode == "off" and self.attention_layers else 0
        return self.kv_bytes_per_token(type_k, type_v) + scores

    def memory_needed(
        self,
        n_ctx: int,
        type_k: str,
        type_v: str | None = None,
        flash_attn: str | None = None,
        snapshots: int = 0,
    ) -> int:
        """Weights, compute buffer, ``n_ctx`` tokens of context and one
        sequence's recurrent state (with ``snapshots``, see `recurrent_bytes`)."""
        per_token = self.context_bytes_per_token(type_k, type_v, flash_attn)
        return self.weights_bytes + self.compute_bytes() + self.recurrent_bytes(1, snapshots) + n_ctx * per_token

    def max_context(
        self,
        budget_bytes: int,
        type_k: str,
        type_v: str | None = None,
        flash_attn: str | None = None,
        snapshots: int = 0,
    ) -> int:
        """The longest context (a multiple of 256, as llama.cpp pads it, up to
        the trained context) whose KV cache (and attention scores, see
        `context_bytes_per_token`) fits beside the weights, the compute
        buffer and one sequence's recurrent state in ``budget_bytes``; 0 when
        none does. A model without a KV cache fits any: its trained context."""
        room = budget_bytes - self.weights_bytes - self.compute_bytes() - self.recurrent_bytes(1, snapshots)
        per_token = self.context_bytes_per_token(type_k, type_v, flash_attn)
        if room < 0 or (room == 0 and per_token):
            return 0
        if not per_token:
            return self.context_length or UNBOUNDED_CONTEXT
        fits = room // per_token // CONTEXT_STEP * CONTEXT_STEP
        return min(self.context_length, fits) if self.context_length else fits


@dataclass(frozen=True)
class _Layers:
    """Which layers hold a KV cache, which a recurrent state (both: Falcon-H1;
    neither: Nemotron-H's feed-forward layers, next-token-prediction heads)."""

    kv: tuple[bool, ...]
    recurrent: tuple[bool, ...]


def _interval_layers(info: GGUFInfo, n_all: int, n_layer: int) -> tuple[bool, ...]:
    """Qwen3-Next and Qwen3.5: which layers recur, from `attention.recurrent_layers`
    (one flag a layer), else all but every `full_attention_interval`th (4 when
    absent) of the trunk; the next-token-prediction layers after it attend."""
    flags = info.arch_value("attention.recurrent_layers")
    if isinstance(flags, bool | int):
        return (bool(flags),) * n_all
    values = getattr(flags, "values", None)
    if values is not None and len(values) == n_all:
        return tuple(bool(v) for v in values)
    interval = _as_int(info.arch_value("full_attention_interval"), 4) or 4
    return tuple(il < n_layer and (il + 1) % interval != 0 for il in range(n_all))


def _tensor_layers(info: GGUFInfo, n_all: int) -> _Layers | None:
    """An architecture llama.cpp's rules here do not name, from its tensors:
    a block with ``ssm_*``, ``shortconv.*`` or ``time_mix_*`` tensors recurs;
    one with a key projection, or a query one and no recurrent tensors,
    attends. None when no block recurs: a transformer, every layer attends."""
    names: list[set[str]] = [set() for _ in range(n_all)]
    for t in info.tensors:
        parts = t.name.split(".")
        if len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit() and int(parts[1]) < n_all:
            names[int(parts[1])].add(parts[2])
    recurrent = tuple(any(n.startswith(_RECURRENT_TENSOR_PREFIXES) for n in block) for block in names)
    if not any(recurrent):
        return None
    kv = tuple(
        bool(block & _KV_TENSORS) or (bool(block & _QUERY_TENSORS) and not r)
        for block, r in zip(names, recurrent, strict=True)
    )
    return _Layers(kv, recurrent)


def _layers(info: GGUFInfo, n_all: int, kv_heads: tuple[int, ...], ff: tuple[int, ...]) -> _Layers:
    """Each layer's memory as llama.cpp's `create_memory` filters it: its
    `is_recurrent` flags (set per architecture in `load_arch_hparams`), of
    the trunk only (llama_memory_recurrent stops at n_layer()), and the
    attention filter of its hybrid memory (not recurrent, by default)."""
    n_layer = n_all - info.nextn_layers  # llama.cpp's n_layer(): the trunk
    layers = _arch_layers(info, n_all, n_layer, kv_heads, ff)
    return _Layers(layers.kv, tuple(r and il < n_layer for il, r in enumerate(layers.recurrent)))


def _arch_layers(info: GGUFInfo, n_all: int, n_layer: int, kv_heads: tuple[int, ...], ff: tuple[int, ...]) -> _Layers:
    """The rule of ``info``'s architecture, as llama.cpp's source has it; the
    tensors' where it names none (`_tensor_layers`)."""
    arch = info.architecture
    every, none = (True,) * n_all, (False,) * n_all
    if arch in _RECURRENT_ARCHS:
        return _Layers(none, every)
    if arch in _SIDE_BY_SIDE:
        return _Layers(every, every)
    if arch in _INTERVAL_ARCHS:
        recurrent = _interval_layers(info, n_all, n_layer)
        return _Layers(tuple(il < n_layer and not r for il, r in enumerate(recurrent)), recurrent)
    if arch in _NEMOTRON_H:
        recurrent = tuple(il < n_layer and kv_heads[il] == 0 and ff[il] == 0 for il in range(n_all))
        return _Layers(tuple(not r and ff[il] == 0 for il, r in enumerate(recurrent)), recurrent)
    if arch in _HEAD_KV_ARCHS:
        recurrent = tuple(il < n_layer and kv_heads[il] == 0 for il in range(n_all))
        return _Layers(tuple(not r for r in recurrent), recurrent)
    return _tensor_layers(info, n_all) or _Layers(every, none)


def _state_values(info: GGUFInfo, n_embd: int, heads: int, key_length: int) -> int:
    """n_embd_r + n_embd_s (llama-hparams.cpp): one recurrent layer's state
    of one sequence, in values. R holds the last (kernel - 1) inputs of a
    convolution (or RWKV's token shifts), S the recurrence's own state."""
    arch = info.architecture
    wkv = _as_int(info.arch_value("wkv.head_size"), 0)
    if wkv:  # RWKV
        return _as_int(info.arch_value("token_shift_count"), 2) * n_embd + n_embd * wkv
    d_conv = _as_int(info.arch_value("ssm.conv_kernel"), 0)
    d_inner = _as_int(info.arch_value("ssm.inner_size"), 0)
    d_state = _as_int(info.arch_value("ssm.state_size"), 0)
    groups = 0 if arch in _NO_SSM_GROUPS else _as_int(info.arch_value("ssm.group_count"), 0)
    l_cache = _as_int(info.arch_value("shortconv.l_cache"), 0)
    kda = _as_int(info.arch_value("kda.head_dim"), 0)
    if l_cache:  # LFM2's short convolution
        r = n_embd * (l_cache - 1)
    elif kda:  # Kimi's delta attention: Q, K and V convolved
        r = 3 * (d_conv - 1 if d_conv > 0 else 3) * heads * kda
    else:  # Mamba's (and a delta-net's) convolution
        r = max(d_conv - 1, 0) * (d_inner + 2 * groups * d_state)
    if kda:
        s = kda * kda * heads
    elif arch == "minimax-01":  # linear attention: a head size squared per head
        s = key_length * key_length * heads
    else:
        s = d_state * d_inner
    return r + s


def describe(info: GGUFInfo) -> ModelInfo:
    from gguf import LlamaFileType  # the gguf package (and numpy) only when a file is described

    n_all = _as_int(info.arch_value("block_count"), 0)
    layer_heads = _per_layer(info.arch_value("attention.head_count"), n_all, (0,) * n_all)
    layer_kv_heads = _per_layer(info.arch_value("attention.head_count_kv"), n_all, layer_heads)
    ff = _per_layer(info.arch_value("feed_forward_length"), n_all, (0,) * n_all)
    first = layer_heads[0] if layer_heads else 0  # llama.cpp's n_head(): the head size is n_embd over it
    heads = first or max(layer_heads, default=0)
    layers = _layers(info, n_all, layer_kv_heads, ff)
    kv_layer_heads = tuple(h for h, kv in zip(layer_kv_heads, layers.kv, strict=True) if kv)
    given = info.arch_value("attention.head_count_kv")  # absent: as many as query heads; per layer: the most
    kv_heads = _as_int(given, heads if given is None else max(kv_layer_heads, default=0))
    embd = _as_int(info.arch_value("embedding_length"), 0)
    head_dim = embd // first if first else 0
    key_length = _as_int(info.arch_value("attention.key_length"), head_dim)
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
    n_recurrent = sum(layers.recurrent)
    return ModelInfo(
        path=info.path,
        name=info.name,
        architecture=info.architecture,
        parameters=params,
        weights_bytes=sum(t.n_bytes for t in info.tensors),
        quantization=quant,
        layers=n_all,
        heads=heads,
        kv_heads=kv_heads,
        key_length=key_length,
        value_length=_as_int(info.arch_value("attention.value_length"), head_dim),
        context_length=info.context_length or 0,
        vocab_size=info.n_vocab or 0,
        has_chat_template=info.chat_template is not None,
        block_bytes=block,
        output_bytes=output,
        kv_layer_heads=None if kv_layer_heads == (kv_heads,) * n_all else kv_layer_heads,  # None: all alike
        recurrent_layers=n_recurrent,
        recurrent_layer_bytes=STATE_BYTES * _state_values(info, embd, first, key_length) if n_recurrent else 0,
        keeps_snapshots=info.architecture in _SNAPSHOT_ARCHS,
        mtp_kv_heads=tuple(h for h in layer_kv_heads[n_all - info.nextn_layers :] if h) if info.mtp_head else (),
    )
