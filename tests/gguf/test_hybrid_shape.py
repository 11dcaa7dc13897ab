"""What `describe` says of recurrent and hybrid models' memory, from the GGUF
alone, against llama.cpp's own rules and against what llama.cpp allocates.

The headers here carry the keys llama.cpp reads (tensors only where the
fallback reads them); `tests.hybridmodels` writes whole models, which
llama.cpp loads: its log says the size of the KV cache and of the recurrent
state it made, to be compared with `ModelInfo`'s figures.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import pytest
from gguf import GGUFWriter

from localrun.gguf.info import STATE_BYTES, UNBOUNDED_CONTEXT, ModelInfo, describe
from localrun.gguf.reader import GGUFInfo, read_gguf
from localrun.runtime import llama_log
from tests.hybridmodels import HYBRIDS, Hybrid, write_hybrid_model

MIB = 2**20


def header(path: Path, arch: str, keys: dict[str, Any], blocks: dict[int, list[str]] | None = None) -> ModelInfo:
    """A GGUF file of ``arch`` with ``keys`` (without the architecture's
    prefix) and a tiny tensor for each name of each block in ``blocks``."""
    writer = GGUFWriter(str(path), arch)
    for key, value in keys.items():
        name = f"{arch}.{key}"
        if isinstance(value, list):
            writer.add_array(name, value)
        elif isinstance(value, bool):
            writer.add_bool(name, value)
        else:
            writer.add_uint32(name, value)
    names = [f"blk.{bid}.{t}.weight" for bid, ts in (blocks or {}).items() for t in ts] or ["token_embd.weight"]
    for name in names:
        writer.add_tensor(name, np.zeros(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return describe(read_gguf(path))


# Qwen3.5-9B's config: 32 layers of 4096, every 4th full attention (16 heads, 4 KV heads of 256), the
# others a gated delta-net: a 4-wide convolution, 16 key heads and 32 value heads of 128
QWEN35_9B = {
    "block_count": 32,
    "context_length": 262144,
    "embedding_length": 4096,
    "attention.head_count": 16,
    "attention.head_count_kv": 4,
    "attention.key_length": 256,
    "attention.value_length": 256,
    "ssm.conv_kernel": 4,
    "ssm.state_size": 128,
    "ssm.group_count": 16,
    "ssm.time_step_rank": 32,
    "ssm.inner_size": 32 * 128,
    "full_attention_interval": 4,
}


def test_qwen35_keeps_a_kv_cache_in_one_layer_of_four(tmp_path: Path) -> None:
    """The issue's model: its KV cache a quarter of what every layer's would
    be, and a state of 50 MiB per sequence beside it, as llama-hparams.cpp
    sizes it: (kernel - 1) x (inner + 2 x groups x state) + state x inner."""
    shape = header(tmp_path / "qwen35.gguf", "qwen35", QWEN35_9B)
    assert (shape.memory, shape.layers, shape.attention_layers, shape.recurrent_layers) == ("hybrid", 32, 8, 24)
    assert shape.kv_bytes_per_token("f16") == 8 * 4 * (256 + 256) * 2 == 32 * 1024
    per_layer = (3 * (4096 + 2 * 16 * 128) + 128 * 4096) * STATE_BYTES
    assert shape.recurrent_layer_bytes == per_layer
    assert shape.recurrent_bytes() == 24 * per_layer == 52_690_944  # 50.25 MiB
    # a context keeping 8 snapshots for speculative rollback holds 9 copies; 4 sequences 4 states each
    assert shape.recurrent_bytes(snapshots=8) == 9 * 24 * per_layer
    assert shape.recurrent_bytes(4, 8) == 36 * 24 * per_layer
    assert shape.recurrent_bytes(0) == shape.recurrent_bytes()  # llama.cpp makes one at least


def test_the_state_counts_in_the_memory_a_context_needs(tmp_path: Path) -> None:
    shape = header(tmp_path / "qwen35.gguf", "qwen35", QWEN35_9B)
    plain = shape.weights_bytes + shape.compute_bytes() + 4096 * shape.context_bytes_per_token("f16")
    assert shape.memory_needed(4096, "f16") == plain + shape.recurrent_bytes()
    assert shape.memory_needed(4096, "f16", snapshots=8) == plain + shape.recurrent_bytes(snapshots=8)
    budget = shape.memory_needed(4096, "f16")
    assert shape.max_context(budget, "f16") == 4096
    assert shape.max_context(budget, "f16", snapshots=8) < 4096  # the snapshots take room from the context
    transformer = dataclasses.replace(shape, kv_layer_heads=None, recurrent_layers=0)  # every layer attending
    assert transformer.kv_bytes_per_token("f16") == 4 * shape.kv_bytes_per_token("f16")  # the 4x the issue saw


def test_recurrent_layers_array_and_next_token_prediction_layers(tmp_path: Path) -> None:
    """`attention.recurrent_layers` wins over the interval; the MTP layers
    after the trunk neither recur nor hold a KV cache in the main context."""
    flags = [True, False, True, True, False, True, False]
    keys = QWEN35_9B | {"block_count": 7, "attention.recurrent_layers": flags, "nextn_predict_layers": 1}
    shape = header(tmp_path / "flags.gguf", "qwen35moe", keys)
    assert (shape.attention_layers, shape.recurrent_layers) == (2, 4)  # layers 1 and 4; layer 6 is the MTP head
    no_mtp = header(tmp_path / "interval.gguf", "qwen3next", QWEN35_9B | {"block_count": 9, "nextn_predict_layers": 1})
    assert (no_mtp.attention_layers, no_mtp.recurrent_layers) == (2, 6)  # layers 3 and 7 of the trunk of 8
    assert no_mtp.recurrent_bytes(snapshots=8) == no_mtp.recurrent_bytes()  # llama.cpp keeps none for Qwen3-Next


def test_per_layer_kv_heads(tmp_path: Path) -> None:
    """An array of KV heads, a zero where a layer recurs: LFM2's short
    convolutions hold n_embd x (l_cache - 1) values; a transformer's array
    (read as `heads` before) counts each layer's heads."""
    lfm2 = header(
        tmp_path / "lfm2.gguf",
        "lfm2",
        {
            "block_count": 4,
            "embedding_length": 1024,
            "attention.head_count": 16,
            "attention.head_count_kv": [0, 8, 0, 8],
            "shortconv.l_cache": 3,
        },
    )
    assert (lfm2.memory, lfm2.attention_layers, lfm2.kv_heads) == ("hybrid", 2, 8)
    assert lfm2.kv_bytes_per_token("f16") == 2 * 8 * 64 * 2 * 2
    assert lfm2.recurrent_bytes() == 2 * 1024 * 2 * STATE_BYTES
    varied = header(
        tmp_path / "varied.gguf",
        "llama",
        {"block_count": 3, "embedding_length": 256, "attention.head_count": 4, "attention.head_count_kv": [1, 2, 4]},
    )
    assert varied.memory == "attention" and varied.attention_layers == 3 and varied.kv_heads == 4
    assert varied.kv_bytes_per_token("f16") == (1 + 2 + 4) * 64 * 2 * 2


def test_nemotron_h_feed_forward_blocks_hold_nothing(tmp_path: Path) -> None:
    keys = {
        "block_count": 4,
        "embedding_length": 128,
        "attention.head_count": 4,
        "attention.head_count_kv": [0, 0, 2, 0],
        "feed_forward_length": [0, 512, 0, 0],
        "ssm.conv_kernel": 4,
        "ssm.state_size": 16,
        "ssm.group_count": 2,
        "ssm.inner_size": 256,
    }
    shape = header(tmp_path / "nemotron.gguf", "nemotron_h", keys)
    assert (shape.attention_layers, shape.recurrent_layers) == (1, 2)
    assert shape.recurrent_layer_bytes == (3 * (256 + 2 * 2 * 16) + 16 * 256) * STATE_BYTES
    assert shape.recurrent_bytes(snapshots=2) == 3 * shape.recurrent_bytes()  # Nemotron-H rolls back


def test_recurrent_models_have_no_kv_cache(tmp_path: Path) -> None:
    """Mamba (whose loader reads no group count), RWKV (token shifts and a
    head-size-square state per channel): no KV cache, so any context fits
    beside the weights and the state."""
    mamba_keys = {
        "block_count": 2,
        "context_length": 0,
        "embedding_length": 64,
        "attention.head_count": 0,
        "ssm.conv_kernel": 4,
        "ssm.state_size": 16,
        "ssm.inner_size": 128,
        "ssm.group_count": 8,
    }
    mamba = header(tmp_path / "mamba.gguf", "mamba", mamba_keys)
    assert (mamba.memory, mamba.attention_layers, mamba.kv_bytes_per_token("f16")) == ("recurrent", 0, 0)
    assert mamba.recurrent_bytes() == 2 * (3 * 128 + 16 * 128) * STATE_BYTES
    assert mamba.context_bytes_per_token("f16", flash_attn="off") == 0  # no attention, no scores
    need = mamba.weights_bytes + mamba.compute_bytes() + mamba.recurrent_bytes()
    assert mamba.max_context(need, "f16") == UNBOUNDED_CONTEXT and mamba.max_context(need - 1, "f16") == 0
    rwkv = header(
        tmp_path / "rwkv.gguf",
        "rwkv6",
        {"block_count": 3, "context_length": 1024, "embedding_length": 64, "wkv.head_size": 16},
    )
    assert rwkv.memory == "recurrent" and rwkv.max_context(2**30, "f16") == 1024
    assert rwkv.recurrent_bytes() == 3 * (2 * 64 + 64 * 16) * STATE_BYTES


def test_an_unknown_architecture_is_read_from_its_tensors(tmp_path: Path) -> None:
    """A block with ssm_* tensors recurs (a fused qkv beside them is a
    delta-net's, not attention); a key projection attends, beside an SSM too
    (Falcon-H1's parallel blocks); an MLP-only block holds nothing."""
    blocks = {
        0: ["attn_norm", "attn_qkv", "ssm_conv1d", "ssm_out"],
        1: ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output"],
        2: ["attn_norm", "ffn_up", "ffn_down"],
        3: ["attn_norm", "attn_k", "attn_q", "ssm_in", "ssm_conv1d"],
        4: ["shortconv.conv", "shortconv.in_proj"],
    }
    keys = {"block_count": 5, "embedding_length": 64, "attention.head_count": 4, "attention.head_count_kv": 2}
    shape = header(tmp_path / "new.gguf", "newhybrid", keys | {"ssm.conv_kernel": 4, "ssm.inner_size": 128}, blocks)
    assert (shape.memory, shape.attention_layers, shape.recurrent_layers) == ("hybrid", 2, 3)
    plain = header(tmp_path / "plain.gguf", "newtransformer", keys, {0: ["attn_norm", "ffn_up"]})
    assert plain.memory == "attention" and plain.attention_layers == 5  # no recurrent tensor: every layer attends


def test_short_arrays_keep_their_values(tmp_path: Path) -> None:
    """Per-layer arrays are read; a vocabulary's long ones are only skipped."""
    header(tmp_path / "a.gguf", "lfm2", {"block_count": 2, "attention.head_count_kv": [0, 8]})
    info = read_gguf(tmp_path / "a.gguf")
    assert info.arch_value("attention.head_count_kv").values == (0, 8)
    writer = GGUFWriter(str(tmp_path / "long.gguf"), "llama")
    writer.add_array("llama.long", list(range(1000)))
    writer.add_tensor("token_embd.weight", np.zeros(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    long = read_gguf(tmp_path / "long.gguf").arch_value("long")
    assert long.length == 1000 and long.values is None


# ---------------------------------------------------------- against llama.cpp --

N_CTX, N_SEQ, SNAPSHOTS = 8192, 64, 3  # a state of 64 sequences with snapshots: big enough to read in MiB
_KV_LINE = re.compile(r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells,\s*(\d+) layers,\s*\d+/(\d+) seqs\)")
_RS_LINE = re.compile(
    r"llama_memory_recurrent: size =\s*([\d.]+) MiB \(\s*(\d+) cells,\s*\d+ layers,\s*\d+ seqs\s+(\d+) rs_seq\)"
)
_ROUNDING = 0.005 + 1e-9  # the log's MiB have two decimals


@dataclasses.dataclass(frozen=True)
class Allocated:
    """What llama.cpp's log said it allocated, and what it says of the model."""

    kv: tuple[float, int, int, int] | None  # MiB, cells, layers, streams
    recurrent: tuple[float, int, int] | None  # MiB, cells (sequences), snapshots kept
    hybrid: bool
    recurrent_model: bool


def _load(path: Path) -> Allocated:
    """Load ``path`` and make a context of N_CTX tokens for N_SEQ sequences
    asking SNAPSHOTS snapshots, reading llama.cpp's log lines."""
    llama_log.init_backend()
    lines: list[str] = []
    with llama_log.listening(lambda _level, text: lines.append(text.decode(errors="replace"))):
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = 0
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
        assert model, f"llama.cpp did not load {path.name}: {llama_log.last_error()}"
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx, cparams.n_seq_max, cparams.n_rs_seq, cparams.kv_unified = N_CTX, N_SEQ, SNAPSHOTS, True
        ctx = llama_cpp.llama_init_from_model(model, cparams)
        assert ctx, f"llama.cpp made no context on {path.name}: {llama_log.last_error()}"
    try:
        text = "".join(lines)
        kv, rs = _KV_LINE.search(text), _RS_LINE.search(text)
        return Allocated(
            (float(kv[1]), int(kv[2]), int(kv[3]), int(kv[4])) if kv else None,
            (float(rs[1]), int(rs[2]), int(rs[3])) if rs else None,
            bool(llama_cpp.llama_model_is_hybrid(model)),
            bool(llama_cpp.llama_model_is_recurrent(model)),
        )
    finally:
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)


@pytest.fixture(scope="module")
def hybrid_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("hybrids")


@pytest.mark.parametrize("family", HYBRIDS, ids=lambda h: h.name)
def test_the_figures_are_what_llama_cpp_allocates(family: Hybrid, hybrid_dir: Path) -> None:
    """The KV cache (the attention layers', per token) and the recurrent state
    (per sequence, with the snapshots the architecture keeps) that `describe`
    reads from the header, against the sizes llama.cpp's log gives."""
    path = write_hybrid_model(family, hybrid_dir / f"{family.name}.gguf")
    shape = describe(read_gguf(path))
    got = _load(path)
    kind = "hybrid" if got.hybrid else "recurrent" if got.recurrent_model else "attention"
    assert shape.memory == kind
    assert shape.attention_layers == family.layers.count("A") + family.layers.count("P")
    assert shape.recurrent_layers == family.layers.count("R") + family.layers.count("P")
    if got.kv is None:
        assert shape.attention_layers == 0
    else:
        mib, cells, layers, streams = got.kv
        assert layers == shape.attention_layers
        assert abs(cells * streams * shape.kv_bytes_per_token("f16") / MIB - mib) <= _ROUNDING
    assert got.recurrent is not None
    mib, cells, snapshots = got.recurrent
    assert shape.keeps_snapshots == family.rollback == (snapshots == SNAPSHOTS)
    assert cells == N_SEQ and mib > 0.25  # enough to tell a layer more or less from the rounding
    assert abs(shape.recurrent_bytes(N_SEQ, SNAPSHOTS) / MIB - mib) <= _ROUNDING


@pytest.mark.parametrize("family", HYBRIDS, ids=lambda h: h.name)
def test_the_tensor_rule_agrees_with_llama_cpps_keys(family: Hybrid, hybrid_dir: Path) -> None:
    """Under a name llama.cpp's rules here do not know, the same file is read
    from its tensors: the same layers, the same figures."""
    path = hybrid_dir / f"{family.name}-tensors.gguf"
    info = read_gguf(write_hybrid_model(family, path))
    prefix = f"{family.arch_name}."
    renamed = {
        ("unknownhybrid." + k.removeprefix(prefix) if k.startswith(prefix) else k): v for k, v in info.metadata.items()
    }
    unknown = describe(
        GGUFInfo(info.path, info.version, renamed | {"general.architecture": "unknownhybrid"}, info.tensors)
    )
    known = describe(info)
    assert (unknown.memory, unknown.attention_layers, unknown.recurrent_layers) == (
        known.memory,
        known.attention_layers,
        known.recurrent_layers,
    )
    assert unknown.kv_bytes_per_token("f16") == known.kv_bytes_per_token("f16")
    assert unknown.recurrent_bytes() == known.recurrent_bytes()
