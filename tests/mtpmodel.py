"""A tiny Qwen3.5 (`tests.hybridmodels`' qwen35 trunk: three gated delta-net
blocks and one attention block) that carries one MTP ("nextn") block, as
llama.cpp's qwen35 loader expects it: ``block_count`` counts it,
``nextn_predict_layers`` is 1, and block 4 is a full-attention Qwen3.5 block
plus ``nextn.eh_proj`` (2 n_embd -> n_embd), ``nextn.enorm``,
``nextn.hnorm`` and ``nextn.shared_head_norm`` (its embeddings and output
layer are the trunk's).

The head sees (h_(p-1), x_p) and must predict x_(p+1). The trunk's output
layer maps a token's code (the first half of its embedding) to its ring
successor, and the penalty half of the residual stream pushes away from
recent tokens (see `tests.hybridmodels`). A *wired* head's eh_proj passes
x_p's code (from enorm(embd(x_p))) and the target's penalty half (from
hnorm(h_(p-1))) into its residual stream: it drafts "the ring successor of
x_p, under the penalty of one step ago", which the target often writes and
now and then does not. A random head's drafts are mostly wrong, so nearly
every step rolls a draft back."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from tests import hybridmodels as hm

QWEN35 = hm.BY_NAME["qwen35"]


def _head(wired: bool) -> Callable[[GGUFWriter, np.random.Generator, np.ndarray], None]:
    def write(writer: GGUFWriter, rng: np.random.Generator, _embd: np.ndarray) -> None:
        family, n_embd = QWEN35, hm.N_EMBD
        bid = family.n_layer  # the MTP block comes right after the trunk
        writer.add_uint32(f"{family.arch_name}.nextn_predict_layers", 1)
        for kind, suffix, shape in hm.layer_specs(family, family.layers.index("A")):  # an attention block's
            w = hm._init(rng, kind, suffix, shape)
            if kind in hm.RESIDUAL_WRITERS:
                w = w * np.float32(family.mix)
            writer.add_tensor(hm.tensor_name(family, kind, suffix, bid), w)
        eh = np.asarray(rng.standard_normal((n_embd, 2 * n_embd)) / np.sqrt(2 * n_embd), dtype=np.float32)
        if wired:
            eh[:] = 0.0
            code = np.arange(hm.CODE)
            eh[code, code] = 1.0  # (out, in): in[:n_embd] = enorm(embd(x_p)): x_p's code and the constant
            penalty = hm.CODE + code
            eh[penalty, n_embd + penalty] = 1.0  # in[n_embd:] = hnorm(h_(p-1)): the target's penalty half
        ones = np.ones(n_embd, dtype=np.float32)
        writer.add_tensor(f"blk.{bid}.nextn.eh_proj.weight", eh)
        for norm in ("enorm", "hnorm", "shared_head_norm"):
            writer.add_tensor(f"blk.{bid}.nextn.{norm}.weight", ones)

    return write


def write_mtp_model(path: Path, *, wired: bool = True, seed: int = 0) -> Path:
    """The qwen35 trunk with an MTP head, wired (its drafts often right) or random (mostly wrong)."""
    assert QWEN35.layers == "RRRA", "the head copies the trunk's attention block"
    return hm.write_hybrid_model(QWEN35, path, seed=seed, extra_blocks=1, extend=_head(wired))
