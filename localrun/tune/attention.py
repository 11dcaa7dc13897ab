"""Flash attention on or off for a model `localrun tune` has not measured:
measured here, once per attention shape, in about a second.

llama.cpp's `--flash-attn auto` turns the fused kernel on wherever the
device has it. On a CPU which mode decodes faster depends on the machine
and on the attention's shape (head sizes, query and KV heads), and the gap
grows with the context: on a 2-core Xeon the fused kernel decoded heads of
64 at 0.5-0.7x the unfused path from a few hundred tokens on, while on an
EPYC it was the faster (docs/benchmarks.md). So the choice is measured, not
assumed, but it need not wait for a minute of `localrun tune` on the model
itself: what differs between the two modes is attention alone, and the cost
of attention depends on the shape, not the weights.

`probe` writes a model of two layers with the shape's heads and head
sizes and little else (a 64-wide residual stream, a 64-wide feed-forward
block, 259 tokens), fills a context to a few depths with each mode and
races single-token decode steps, as tune's depth phase does on the real
model. The result is an `Attention` curve, the form tune keeps, and
`localrun.tune.apply` reads it the same way where the model's wisdom has
none: the mode measured faster at the run's depth, or llama.cpp's auto on a
tie. It is kept per machine, shape and thread count in the cache directory
(`attention.json`); a measurement on a busy machine decides nothing and is
not kept. Only for attention on the CPU (a model with layers on a GPU keeps
llama.cpp's choice), f16 V (the unfused path needs it) and K and V heads of
one size (the probe's architecture needs it).

`LOCALRUN_PROBE_ATTENTION=0` skips it: llama.cpp's auto, as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFWriter, TokenType

from localrun import paths
from localrun.gguf.info import ModelInfo, describe
from localrun.gguf.reader import read_gguf
from localrun.runtime import devices
from localrun.runtime.engine import EngineConfig, Weights
from localrun.runtime.load import LoadWatch, runnable_others
from localrun.runtime.placement import Placement, place
from localrun.tune.machine import Machine, this_machine
from localrun.tune.wisdom import Attention

VERSION = 1
DEPTHS = (256, 1024, 2048)  # tokens in the context where the two modes are raced
STEPS = 16  # decode steps in one sample
TIME_S = 3.0  # the races stop by then, whatever they decided
WIDTH = 64  # the probe model's residual stream and feed-forward width: what attention does not depend on
WAIT_S, WAIT_TRIES = 0.02, 25  # before a sample, at most half a second's wait for other tasks to pass
RETRY_S = 600.0  # a probe the machine's load spoilt is not tried again this soon
PROBE_TIMEOUT_S = 120.0  # a probe's process that has not answered by then is stopped: no curve
ENV = "LOCALRUN_PROBE_ATTENTION"


@dataclass(frozen=True)
class AttentionShape:
    """What the cost of a decode step's attention depends on, beside the depth."""

    heads: int
    kv_heads: int
    key_length: int
    value_length: int

    @classmethod
    def of(cls, shape: ModelInfo) -> AttentionShape:
        return cls(shape.heads, shape.kv_heads or shape.heads, shape.key_length, shape.value_length)

    @property
    def probed(self) -> bool:
        """Whether the probe's model can have this shape."""
        return self.key_length == self.value_length and self.heads > 0 and self.heads % self.kv_heads == 0


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "no", "off", "false")


# ---------------------------------------------------------------- the model --


def write_probe_model(path: Path, shape: AttentionShape) -> Path:
    """Two llama layers with ``shape``'s heads around a `WIDTH`-wide stream,
    random weights, a vocabulary of byte tokens."""
    rng = np.random.default_rng(0)
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    q, kv = shape.heads * shape.key_length, shape.kv_heads * shape.key_length

    def rand(*dims: int) -> np.ndarray:
        return (rng.standard_normal(dims) * 0.05).astype(np.float16)

    writer = GGUFWriter(str(path), "llama")
    writer.add_name("localrun attention probe")
    writer.add_context_length(max(DEPTHS) * 2)
    writer.add_embedding_length(WIDTH)
    writer.add_block_count(2)
    writer.add_feed_forward_length(WIDTH)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.key_length)
    writer.add_value_length(shape.value_length)
    writer.add_rope_dimension_count(shape.key_length)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(1)  # F16
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types([int(t) for t in types])
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_tensor("token_embd.weight", rand(len(tokens), WIDTH))
    writer.add_tensor("output_norm.weight", np.ones(WIDTH, dtype=np.float32))
    writer.add_tensor("output.weight", rand(len(tokens), WIDTH))
    for i in range(2):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(WIDTH, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", rand(q, WIDTH))
        writer.add_tensor(f"blk.{i}.attn_k.weight", rand(kv, WIDTH))
        writer.add_tensor(f"blk.{i}.attn_v.weight", rand(kv, WIDTH))
        writer.add_tensor(f"blk.{i}.attn_output.weight", rand(WIDTH, q))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(WIDTH, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", rand(WIDTH, WIDTH))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", rand(WIDTH, WIDTH))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", rand(WIDTH, WIDTH))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# ---------------------------------------------------------------- the probe --


def probe(
    shape: AttentionShape, threads: int, load: Callable[[], int | None] | None = None, *, verbose: bool = False
) -> Attention | None:
    """Decode steps with flash attention off and on at `DEPTHS`, on the CPU
    with ``threads``; None when the machine was busy (or the shape cannot be
    probed). ``verbose``: llama.cpp's log to stderr."""
    if not shape.probed:
        return None
    # the measuring machinery only when a probe runs (a run that finds its curve kept starts without it)
    import statistics

    from localrun.tune.measure import Context
    from localrun.tune.race import Race, relative_iqr

    reading = load or runnable_others
    watch = LoadWatch(reading)
    with tempfile.TemporaryDirectory(prefix="localrun-probe-") as tmp:
        model = write_probe_model(Path(tmp) / "probe.gguf", shape)
        placement = place(devices.probe(), shape=describe(read_gguf(model)), gpu_layers="0")
        modes = ("off", "on")
        deadline = time.monotonic() + TIME_S
        with Weights(model, placement, verbose=verbose) as weights:
            tokens = range(3, 259)  # the byte tokens: nothing to tokenize
            contexts = {
                mode: Context(weights, _config(model, placement, mode, threads, verbose), tokens) for mode in modes
            }
            try:
                at: dict[int, Race[str]] = {}
                for depth in DEPTHS:
                    for ctx in contexts.values():
                        ctx.fill(depth)

                    def sample(mode: str) -> float:
                        quiet(reading)
                        watch.read()
                        return contexts[mode].step_s(STEPS)

                    at[depth] = Race(list(modes)).run(sample, max_rounds=6, deadline=deadline)
            except _Busy:
                return None
            finally:
                for ctx in contexts.values():
                    ctx.close()
    if watch.busy() is not None:
        return None
    return Attention(
        DEPTHS,
        tuple(at[d].median("off") * 1e3 for d in DEPTHS),
        tuple(at[d].median("on") * 1e3 for d in DEPTHS),
        noise=round(statistics.median(relative_iqr(at[d].samples[m]) for d in DEPTHS for m in modes), 4),
    )


def probe_apart(shape: AttentionShape, threads: int, verbose: bool = False) -> Attention | None:
    """`probe` in a process of its own: nothing of its model and of llama.cpp's
    code stays in the caller (a server's memory), and a probe that crashes
    costs the caller nothing but the curve (None, as a spoilt one). Under
    `--verbose` the child says what it does (llama.cpp's log, a crash's
    traceback) on the caller's stderr; else its stderr is dropped."""
    import subprocess
    import sys

    measure = [sys.executable, "-m", __name__, json.dumps(_shape_list(shape)), str(threads)]
    if verbose:
        measure.append("-v")
    try:
        done = subprocess.run(
            measure,
            check=False,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=None if verbose else subprocess.DEVNULL,
            text=True,
            timeout=PROBE_TIMEOUT_S,
        )
        found = json.loads(done.stdout) if done.returncode == 0 else None
        return Attention.from_dict(found) if found is not None else None
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def _shape_list(shape: AttentionShape) -> list[int]:
    return [shape.heads, shape.kv_heads, shape.key_length, shape.value_length]


def main(argv: Sequence[str]) -> None:
    """`probe_apart`'s child: the shape as a JSON list and the thread count
    in (and -v: llama.cpp's log to stderr), the curve (or null) as JSON out."""
    heads, kv_heads, key_length, value_length = (int(x) for x in json.loads(argv[0]))
    shape = AttentionShape(heads, kv_heads, key_length, value_length)
    curve = probe(shape, int(argv[1]), verbose="-v" in argv[2:])
    print(json.dumps(curve.as_dict() if curve is not None else None))


class _Busy(Exception):
    """Other tasks kept running through the wait: the probe is spoilt."""


def quiet(reading: Callable[[], int | None], tries: int = WAIT_TRIES) -> None:
    """Wait a little while other tasks run (a process starting in the same
    pipeline, a passing job), so that a sample is taken on a quiet machine;
    `_Busy` when they do not pass: under a load that stays, the probe gives
    up at once rather than spend its time measuring the load."""
    for _ in range(tries):
        if not reading():
            return
        time.sleep(WAIT_S)
    raise _Busy


def _config(model: Path, placement: Placement, mode: str, threads: int, verbose: bool = False) -> EngineConfig:
    n_ctx = max(DEPTHS) + 64
    return EngineConfig(
        model_path=model,
        placement=placement,
        n_ctx=n_ctx,
        n_threads=threads,
        n_batch=512,
        n_ubatch=512,
        flash_attn=mode,
        kv_unified=True,
        adapt_threads=False,  # the count measured is the count asked
        verbose=verbose,
    )


# ---------------------------------------------------------------- kept --


def attention_file() -> Path:
    return paths.cache_dir() / "attention.json"


@dataclass(frozen=True)
class Probed:
    """One probe's outcome: the curve, or None where the machine's load spoilt it."""

    machine: Machine
    shape: AttentionShape
    threads: int
    measured_at: str
    curve: Attention | None

    def same(self, machine: Machine, shape: AttentionShape, threads: int) -> bool:
        return (self.machine, self.shape, self.threads) == (machine, shape, threads)

    def age_s(self) -> float:
        try:
            return (datetime.now(UTC) - datetime.fromisoformat(self.measured_at)).total_seconds()
        except ValueError:
            return float("inf")

    def as_dict(self) -> dict[str, Any]:
        return {
            "machine": self.machine.as_dict(),
            "shape": _shape_list(self.shape),
            "threads": self.threads,
            "measured_at": self.measured_at,
            "curve": self.curve.as_dict() if self.curve is not None else None,
        }

    @classmethod
    def from_dict(cls, raw: Any) -> Probed:
        heads, kv_heads, key_length, value_length = (int(x) for x in raw["shape"])
        return cls(
            Machine.from_dict(raw["machine"]),
            AttentionShape(heads, kv_heads, key_length, value_length),
            int(raw["threads"]),
            str(raw["measured_at"]),
            Attention.from_dict(raw["curve"]) if raw.get("curve") is not None else None,
        )


def load_probed(path: Path | None = None) -> list[Probed]:
    """The kept outcomes; an unreadable or damaged file is none (the next probe rewrites it)."""
    try:
        raw = json.loads((path or attention_file()).read_text(encoding="utf-8"))
        if not isinstance(raw, dict) or raw.get("version") != VERSION:
            return []
        return [Probed.from_dict(item) for item in raw.get("entries", [])]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError):
        return []


def save_probed(entries: Sequence[Probed], path: Path | None = None) -> None:
    path = path or attention_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    paths.atomic_write(path, json.dumps({"version": VERSION, "entries": [e.as_dict() for e in entries]}, indent=1))


def measured(
    model: ModelInfo,
    threads: int,
    *,
    verbose: bool = False,
    run_probe: Callable[[AttentionShape, int], Attention | None] | None = None,
) -> Attention | None:
    """The curve kept for ``model``'s attention shape at ``threads`` on this
    machine, measured now (and kept) if there is none; None where it cannot
    be measured, is switched off, or the machine's load spoilt the probe
    (then it is tried again after `RETRY_S`, not on every run)."""
    shape = AttentionShape.of(model)
    if not enabled() or not shape.probed:
        return None
    machine = this_machine()
    found = next((p for p in load_probed() if p.same(machine, shape, threads)), None)
    if found is not None and (found.curve is not None or found.age_s() < RETRY_S):
        return found.curve
    curve = run_probe(shape, threads) if run_probe is not None else probe_apart(shape, threads, verbose)
    entry = Probed(machine, shape, threads, datetime.now(UTC).isoformat(timespec="seconds"), curve)
    with contextlib.suppress(OSError):  # not kept (a read-only cache): measured again next time, no harm
        others = [p for p in load_probed() if not p.same(machine, shape, threads)]  # another process's meanwhile
        save_probed([*others, entry])
    return curve


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
