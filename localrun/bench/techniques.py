"""The ladder: each technique is a function of a `Bench` that returns its
rows (`RowSpec`s); `TECHNIQUES` is the ladder `localrun bench` runs."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from localrun.bench.harness import Bench, RowSpec, Technique


def unavailable(techniques: Sequence[str], *, reason: str) -> list[RowSpec]:
    """Slots for rows that cannot be measured here, with the reason."""
    return [RowSpec(t, None, note=reason) for t in techniques]


def plain_row(technique: str, settings: dict[str, Any] | None, *, with_quality: bool = True, **changes: Any) -> RowSpec:
    """A row measured by `Bench.single` on the engine config with ``changes``."""
    return RowSpec(
        technique,
        measure=lambda b: b.single(b.engine_config(**changes)),
        settings=settings,
        quality=(lambda b: b.quality(b.engine_config(**changes))) if with_quality else None,
    )


def baseline_rows(bench: Bench) -> list[RowSpec]:
    settings = {"kv_k": "f16", "kv_v": "f16", "flash_attn": bench.plan.flash_attn}
    return [plain_row("baseline", settings, type_k="f16", type_v="f16")]


def attention_rows(bench: Bench) -> list[RowSpec]:
    """The other flash-attention mode than the baseline's (auto: llama.cpp's,
    which is on for the CPU, so the row is off). Full mode only."""
    if bench.plan.quick:
        return []
    other = "on" if bench.plan.flash_attn == "off" else "off"
    return [plain_row(f"flash attention {other}", {"flash_attn": other}, with_quality=False, flash_attn=other)]


def kv_cache_rows(bench: Bench) -> list[RowSpec]:
    pairs = [("q8_0", "q8_0"), ("q4_0", "q4_0")]
    if not bench.plan.quick:
        pairs.append(("q8_0", "q4_0"))  # the smallest cache that keeps Qwen2.5's quality (docs/benchmarks.md)
    return [
        plain_row(f"kv-cache {k}" if k == v else f"kv-cache {k}/{v}", {"kv_k": k, "kv_v": v}, type_k=k, type_v=v)
        for k, v in pairs
    ]


def speculative_rows(bench: Bench) -> list[RowSpec]:
    """Speculative decoding, lossless: the matched draft model, prompt lookup,
    and auto (the controller choosing, plain decoding included)."""

    def row(technique: str, choice: str) -> RowSpec:
        return RowSpec(
            technique,
            measure=lambda b: b.single(b.engine_config(type_k="f16", type_v="f16"), speculation=choice),
            settings={"draft": choice},
        )

    rows = [row("speculative lookup", "lookup"), row("speculative auto", "auto")]
    if bench.plan.quick:
        return rows[1:]  # auto stands for both drafters: its note names those it used
    if bench.draft is None:
        return [*unavailable(["speculative draft"], reason="no draft model (give one with --draft)"), *rows]
    return [row("speculative draft", str(bench.draft)), *rows]


CPU_BATCHES = (1, 2, 4, 8)
GPU_BATCHES = (1, 4, 16, 64)  # a GPU's aggregate keeps growing where a CPU's flattens (tune measures up to 128)


def batch_sizes(bench: Bench) -> tuple[int, ...]:
    """The sequence counts the ladder measures: a GPU's when layers are offloaded."""
    placement = bench.base.placement
    offloaded = placement is not None and placement.model.offloaded
    sizes = GPU_BATCHES if offloaded else CPU_BATCHES
    return (sizes[2],) if bench.plan.quick else sizes


def batching_rows(bench: Bench) -> list[RowSpec]:
    """N sequences in one llama.cpp batch: aggregate tokens/sec (for batch work)."""
    return [
        RowSpec(
            f"batching n={n}",
            measure=lambda b, n=n: b.batched(n),  # type: ignore[misc]
            settings={"parallel": n},
            sequences=n,
        )
        for n in batch_sizes(bench)
    ]


_QUANT_IN_NAME = re.compile(r"(?i)([-_.])(q\d(?:_k)?(?:_[msl]|_\d)?|f16|bf16|f32)(\.gguf)$")


def other_weights(path: Path) -> Path | None:
    """A sibling file of the same model in 8-bit when ``path`` is 4-bit (and
    the other way round): the same name with the quantization swapped."""
    found = _QUANT_IN_NAME.search(path.name)
    if not found:
        return None
    quant = found.group(2).lower()
    wanted = ("q8_0",) if quant.startswith("q4") else ("q4_k_m", "q4_0", "q4_k_s") if quant == "q8_0" else ()
    stem = path.name[: found.start()] + found.group(1)
    for q in wanted:
        for spelled in (q, q.upper()):
            candidate = path.with_name(f"{stem}{spelled}{found.group(3)}")
            if candidate.is_file():
                return candidate
    return None


def weights_rows(bench: Bench) -> list[RowSpec]:
    other = bench.compare or other_weights(bench.model)
    if other is None:
        return unavailable(
            ["weights 8-bit"], reason="no 8-bit/4-bit file of this model beside it (localrun quantize makes one)"
        )
    shape = bench.shape_of(other)
    same_vocab = shape.vocab_size == bench.shape.vocab_size
    row = plain_row(f"weights {shape.quantization.lower()}", None, with_quality=same_vocab, model_path=other)
    return [dataclasses.replace(row, note=other.name)]


TECHNIQUES: list[Technique] = [
    baseline_rows,
    attention_rows,
    kv_cache_rows,
    speculative_rows,
    batching_rows,
    weights_rows,
]
