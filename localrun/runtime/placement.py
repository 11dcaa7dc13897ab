"""Where a run's model goes and what fits there: the devices it is placed
on, the memory budget measured once per device before anything loads, the
context of one engine, each sequence's context in a batch, and how many
sequences run at once.

`place()` makes a run's `Placement`, and `localrun.assemble` sizes the
run's context and sequences in its budget with this module's rules, before
anything loads, rather than in the memory the OS reports later (which
already lacks the weights loaded meanwhile). `localrun show`, `--ctx auto`,
`--ctx N`, `--batch`, `serve` and `bench` all size through this module, so
they agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from localrun.config import FLASH_ATTN_MODES
from localrun.errors import UsageError
from localrun.gguf.info import CONTEXT_STEP, KV_BYTES_PER_ELEMENT, ModelInfo
from localrun.runtime.devices import HOST, Device, host, offload_targets
from localrun.settings import check_context

DEFAULT_CTX = 4096  # a context when nothing is known about memory, and what a line without max tokens may use
LLAMA_PARALLEL = 4  # --batch without wisdom or --parallel: llama-server's default slots (-np auto)
KvPairs = tuple[tuple[str, str], ...]
KV_AUTO_ORDER: KvPairs = (("f16", "f16"), ("q8_0", "q8_0"), ("q8_0", "q4_0"))  # --kv auto: the first that fits
RESERVE = 512 * 1024 * 1024  # left for the rest of the system when the budget is the available RAM

_QUANT_BLOCK = 32


def round_up(n: int) -> int:
    """``n`` rounded up to llama.cpp's context step of 256."""
    return -(-n // CONTEXT_STEP) * CONTEXT_STEP


def host_budget(configured: int | None, available: int) -> int:
    """The bytes a model may use on the host: ``configured``, or the memory
    ``available`` less a reserve for the rest of the system; 0 when nothing is known."""
    if configured:
        return configured
    return max(available - RESERVE, 1) if available else 0


GPU_RESERVE = 1024 * 1024 * 1024  # left free on each GPU, for the driver and other programs
AUTO_LAYERS = "auto"  # --gpu-layers: every layer on the GPU when it fits, else the most that fit
ALL_LAYERS = "all"


@dataclass(frozen=True)
class ModelPlacement:
    """Where the weights are loaded: what `Weights` is made with, and what an
    engine on shared weights must match."""

    n_gpu_layers: int = 0  # layers offloaded to ``devices``; 0: every layer on the CPU; above ``layers``: all
    devices: tuple[str, ...] = ()  # the devices layers go to, in llama.cpp's names
    repack: bool = True  # weights in llama.cpp's repacked SIMD layouts on the CPU (scripts/setup compiles AMX out)
    layers: int = 0  # the model's repeating layers, for saying how many went where

    @property
    def offloaded(self) -> bool:
        return self.n_gpu_layers > 0 and bool(self.devices)

    @property
    def whole(self) -> bool:
        """Every layer, the output layer included, on the devices: nothing decodes on the CPU."""
        return self.offloaded and self.n_gpu_layers > self.layers

    def describe(self) -> str:
        if not self.offloaded:
            return "CPU"
        where = ", ".join(self.devices)
        if self.whole:
            return f"{where}, all {self.layers} layers"
        if self.n_gpu_layers == self.layers:
            return f"{where}, all {self.layers} layers (the output layer on the CPU)"
        return f"{where}, {self.n_gpu_layers} of {self.layers} layers (the rest on the CPU)"


@dataclass(frozen=True)
class Placement:
    """A run's devices and memory, decided once before anything loads: where
    the model (and its draft) go, the bytes the context is sized in, the bytes
    budgeted on each device (0: unknown), and why each automatic value is
    what it is."""

    model: ModelPlacement = ModelPlacement()
    budget: int = 0  # what the model and its context are sized in: the memory of where the KV cache lives
    budgets: tuple[tuple[str, int], ...] = ()  # (device name, bytes); the host first
    reasons: tuple[tuple[str, str], ...] = ()  # (what, why) for every automatic value
    devices: tuple[Device, ...] = field(default=(), compare=False)  # as probed, for show and --json
    max_ctx: int | None = None  # a partial offload was planned for this many tokens of context
    draft: ModelPlacement = ModelPlacement()  # the draft model's share of the same devices
    retry: bool = False  # the layer count was automatic: a device out of memory may cost one retry with fewer

    def fewer_layers(self) -> Placement | None:
        """The placement to retry with after a device ran out of memory: half
        the layers offloaded (none: the CPU), when the count was automatic."""
        if not self.retry or not self.model.offloaded:
            return None
        n = min(self.model.n_gpu_layers, self.model.layers) // 2
        model = replace(self.model, n_gpu_layers=n, devices=self.model.devices if n else ())
        why = f"{model.describe()}: the first try ran out of device memory"
        reasons = tuple((k, why if k == "model" else v) for k, v in self.reasons)
        return replace(self, model=model, reasons=reasons, retry=False)

    def for_draft(self) -> Placement:
        """The placement a draft model's engine loads with: the draft's share
        of the same devices, sized in the same budget."""
        return replace(self, model=self.draft, max_ctx=None, retry=False)

    @property
    def kv_pairs(self) -> KvPairs:
        """The K/V type pairs `--kv auto` may choose: on a GPU only matched
        pairs, which llama.cpp's CUDA flash attention has kernels for."""
        if self.model.offloaded:
            return tuple(kv for kv in KV_AUTO_ORDER if kv[0] == kv[1])
        return KV_AUTO_ORDER

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model.describe(),
            "n_gpu_layers": self.model.n_gpu_layers,
            "draft": self.draft.describe(),
            "devices": [
                {"name": d.name, "kind": d.kind, "description": d.description, "free": d.free, "total": d.total}
                for d in self.devices
            ],
            "budget_bytes": self.budget,
            "device_budget_bytes": dict(self.budgets),
            "reasons": dict(self.reasons),
        }


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def _targets(found: tuple[Device, ...], device: str | None) -> tuple[Device, ...]:
    """The devices layers may go to: ``device`` alone (a name, any case), or every GPU."""
    if device is None:
        return offload_targets(found)
    named = [d for d in found if d.name.lower() == device.lower()]
    if not named:
        names = ", ".join(d.name for d in found) or "none"
        raise UsageError(f"no device {device!r} in this build or machine", hint=f"devices: {names} (localrun doctor)")
    return offload_targets(tuple(named))


def _layer_count(gpu_layers: str, layers: int) -> int | None:
    """--gpu-layers as a count (above ``layers``: every layer and the output), None for auto."""
    if gpu_layers == AUTO_LAYERS:
        return None
    if gpu_layers == ALL_LAYERS:
        return layers + 1
    try:
        n = int(gpu_layers)
    except ValueError:
        raise UsageError(f"--gpu-layers {gpu_layers!r} is not a count", hint="use auto, all or a number") from None
    if n < 0:
        raise UsageError("--gpu-layers must be 0 or more", hint="0 keeps the model on the CPU")
    return min(n, layers + 1)


@dataclass(frozen=True)
class DeviceFit:
    """What fits one GPU, for `localrun show`: the layers placed there for a
    context of DEFAULT_CTX tokens, and with every layer there, the longest
    context per KV type (0: the model does not fit whole)."""

    device: Device
    layers: int
    max_context: Mapping[str, int]


def device_fits(shape: ModelInfo, found: Sequence[Device]) -> list[DeviceFit]:
    """Each GPU of ``found`` alone, as `place` would use it."""
    fits = []
    for gpu in offload_targets(tuple(found)):
        room = max(gpu.free - GPU_RESERVE, 0)
        layers = place((host(tuple(found)), gpu), shape=shape).model.n_gpu_layers
        context = {t: shape.max_context(room, t) if room else 0 for t in KV_BYTES_PER_ELEMENT}
        fits.append(DeviceFit(gpu, min(layers, shape.layers + 1), context))
    return fits


def _budget_why(memory_budget: int | None, host_bytes: int, cpu: Device) -> str:
    if memory_budget:
        return "memory_budget as configured"
    if host_bytes:
        return f"available memory {_gib(cpu.free)} less {RESERVE // 2**20} MiB for the system"
    return "available memory unknown: contexts default to 4096 tokens"


@dataclass(frozen=True)
class _Run:
    """What place() was asked, carried to the offload plan."""

    found: tuple[Device, ...]
    host_bytes: int
    budget_why: str
    gpu_layers: str

    def on_cpu(self, why: str) -> Placement:
        reasons = (("model", f"CPU: {why}"), ("budget", self.budget_why))
        return Placement(ModelPlacement(), self.host_bytes, ((HOST, self.host_bytes),), reasons, self.found)


def place(
    devices: Sequence[Device],
    *,
    memory_budget: int | None = None,
    shape: ModelInfo | None = None,
    need: int | None = None,
    kv: tuple[str, str] = ("f16", "f16"),
    gpu_layers: str = AUTO_LAYERS,
    device: str | None = None,
    draft: ModelInfo | None = None,
) -> Placement:
    """Place a run on ``devices`` (the host first, as `devices.probe` gives
    them), measured once, before anything loads.

    With a GPU and ``shape`` (the model) known, every layer goes on the GPU
    when its weights, ``need`` tokens of ``kv`` cache, the compute buffer and
    the ``draft`` model fit the GPU's free memory less GPU_RESERVE; else the
    most layers that fit, the rest on the CPU. ``gpu_layers`` (--gpu-layers:
    auto, all, or a count; 0: the CPU) and ``device`` (--device: one device by
    name) are the user's, kept as given. ``memory_budget``: the user's host
    budget in bytes (None: the available memory less RESERVE)."""
    found = tuple(devices)
    cpu = host(found)
    host_bytes = host_budget(memory_budget, cpu.free)
    run = _Run(found, host_bytes, _budget_why(memory_budget, host_bytes, cpu), gpu_layers)
    targets = _targets(found, device)
    count = _layer_count(gpu_layers, shape.layers if shape is not None else 0)
    if count == 0:
        return run.on_cpu(f"--gpu-layers {gpu_layers}")
    if not targets:
        if count is not None:  # layers asked for, nowhere to put them
            raise UsageError(
                f"--gpu-layers {gpu_layers} needs a GPU, and this build or machine has none",
                hint="`localrun doctor` says what the build supports; LOCALRUN_BACKEND=cuda scripts/setup builds one",
            )
        return run.on_cpu(f"{device} is not a GPU" if device else "no GPU in this build or machine")
    if shape is None:
        return run.on_cpu("the model's shape is unknown")
    return _offload(
        run, shape, targets, count, need or min(DEFAULT_CTX, shape.context_length or DEFAULT_CTX), kv, draft
    )


def _offload(
    run: _Run,
    shape: ModelInfo,
    targets: tuple[Device, ...],
    count: int | None,
    tokens: int,
    kv: tuple[str, str],
    draft: ModelInfo | None,
) -> Placement:
    """The layers on ``targets`` (``count``, or as many as fit when None) for
    a context of ``tokens``, with the draft's share."""
    free = {d.name: max(d.free - GPU_RESERVE, 0) for d in targets}
    names = tuple(name for name, room in free.items() if room) or tuple(free)  # a full GPU takes no layers
    room = sum(free.values())
    draft_bytes = draft.memory_needed(tokens, "f16") if draft is not None else 0
    draft_fits = draft is not None and draft_bytes <= room // 4  # a draft takes a small share, or stays on the CPU
    room -= draft_bytes if draft_fits else 0
    memory = tokens * shape.kv_bytes_per_token(*kv) + shape.recurrent_bytes()  # a context's, spread over the layers
    per_layer = shape.layer_bytes + memory // max(shape.layers, 1)
    whole = shape.layers * per_layer + shape.output_bytes + shape.compute_bytes()
    where = f"{', '.join(names)} {_gib(room)} free beyond a {GPU_RESERVE // 2**20} MiB reserve"
    why = f"--gpu-layers {run.gpu_layers}"
    if count is None:
        fit = max(0, (room - shape.compute_bytes()) // per_layer) if per_layer else 0
        count = shape.layers + 1 if whole <= room else min(shape.layers, fit)
        if count == 0:
            return run.on_cpu(f"not one layer fits: {where}, one layer and the compute buffer need more")
        why = f"weights, KV for {tokens} tokens and compute need {_gib(whole)}; {where}"
    model = ModelPlacement(count, names, repack=True, layers=shape.layers)
    reasons = [("model", f"{model.describe()}: {why}"), ("budget", run.budget_why)]
    drafted = ModelPlacement()
    if draft is not None:
        drafted = ModelPlacement(draft.layers + 1, names, layers=draft.layers) if draft_fits else drafted
        reasons.append(("draft", f"{drafted.describe()}: {_gib(draft_bytes)} with its KV cache"))
    room = max(room, 1)
    whole_on_gpu = model.whole
    return Placement(
        model,
        budget=room if whole_on_gpu else run.host_bytes + room if run.host_bytes else 0,
        budgets=((HOST, run.host_bytes), *free.items()),
        reasons=tuple(reasons),
        devices=run.found,
        max_ctx=None if whole_on_gpu else round_up(tokens),  # a partial offload was planned for this context
        draft=drafted,
        retry=run.gpu_layers == AUTO_LAYERS,
    )


def choose_context(
    shape: ModelInfo, n_ctx: int | None, kv: tuple[str, str], flash_attn: str, budget: int, snapshots: int = 0
) -> int:
    """`--ctx auto` (``n_ctx`` None): the longest context that fits ``budget``
    bytes; `--ctx N`: N, or an error with the numbers when it does not fit.
    ``snapshots``: the recurrent state's copies a context keeps for rollback
    (its n_rs_seq; see `ModelInfo.recurrent_bytes`)."""
    type_k, type_v = kv
    if not budget:  # nothing known about memory
        return n_ctx or min(DEFAULT_CTX, shape.context_length or DEFAULT_CTX)
    fits = shape.max_context(budget, type_k, type_v, flash_attn, snapshots)
    label = f"KV {type_k}/{type_v}"
    if n_ctx is None:
        if fits < CONTEXT_STEP:
            raise UsageError(
                f"the model does not fit in {budget / 2**30:.1f} GiB: weights {shape.weights_bytes / 2**30:.2f} GiB, "
                f"compute {shape.compute_bytes() / 2**30:.2f} GiB, "
                f"and no room for a {CONTEXT_STEP}-token {label} cache",
                hint="free some memory, or pass --ctx N to try anyway",
            )
        return fits
    check_context(n_ctx)
    need = shape.memory_needed(n_ctx, type_k, type_v, flash_attn, snapshots)
    if need > budget:
        kv_bytes = n_ctx * shape.kv_bytes_per_token(type_k, type_v)
        state = shape.recurrent_bytes(1, snapshots)
        recurrent = f", recurrent state {state / 2**30:.2f}" if state else ""
        raise UsageError(
            f"--ctx {n_ctx} needs {need / 2**30:.2f} GiB (weights {shape.weights_bytes / 2**30:.2f}, "
            f"{label} {kv_bytes / 2**30:.2f}{recurrent}, "
            f"compute {(need - shape.weights_bytes - kv_bytes - state) / 2**30:.2f}); "
            f"the memory budget is {budget / 2**30:.2f} GiB",
            hint=f"--ctx auto fits {fits} tokens; --kv q8_0 halves the KV cache",
        )
    return n_ctx


def check_kv_config(kv: tuple[str, str], flash_attn: str, shape: ModelInfo) -> str:
    """Validate the KV cache types against the model and return the flash
    attention mode to ask llama.cpp for: a quantized V cache needs flash
    attention, so it is switched on unless the user switched it off (then it
    is an error); auto is settled by `ModelInfo.auto_flash_attn`."""
    type_k, type_v = kv
    for name, kv_type, dim in (("K", type_k, shape.key_length), ("V", type_v, shape.value_length)):
        if kv_type not in KV_BYTES_PER_ELEMENT:
            raise UsageError(f"unknown KV cache type {kv_type!r} for {name}", hint="use f16, q8_0 or q4_0")
        if kv_type != "f16" and dim % _QUANT_BLOCK:
            raise UsageError(
                f"a {kv_type} {name} cache needs a head size that is a multiple of {_QUANT_BLOCK}; "
                f"this model's is {dim}",
                hint=f"use --kv-{name.lower()} f16",
            )
    if flash_attn not in FLASH_ATTN_MODES:
        raise UsageError(f"unknown --flash-attn value {flash_attn!r}", hint="use auto, on or off")
    if type_v != "f16" and flash_attn == "off":
        raise UsageError(
            f"a {type_v} V cache needs flash attention, which --flash-attn off switches off",
            hint="use --flash-attn on (or auto), or --kv-v f16",
        )
    if flash_attn == "auto" or type_v != "f16":
        return shape.auto_flash_attn(type_v)
    return flash_attn


def slot_context(need: int, limit: int) -> int:
    """The context one sequence gets: ``need`` tokens rounded up to llama.cpp's
    step of 256, at most ``limit`` (the trained context)."""
    return max(CONTEXT_STEP, min(round_up(need), limit))


def parallel_that_fits(
    shape: ModelInfo, seq_ctx: int, type_k: str, type_v: str, budget: int, snapshots: int = 0
) -> int:
    """How many sequences of ``seq_ctx`` tokens fit in ``budget`` bytes beside
    the weights and the compute buffer: each holds its KV cache and, in a
    recurrent or hybrid model, its recurrent state (with ``snapshots``)."""
    room = budget - shape.weights_bytes - shape.compute_bytes()
    per_sequence = seq_ctx * shape.kv_bytes_per_token(type_k, type_v) + shape.recurrent_bytes(1, snapshots)
    return max(0, room // per_sequence) if per_sequence else 0


def sequences(
    shape: ModelInfo,
    seq_ctx: int,
    kv: tuple[str, str],
    budget: int,
    *,
    asked: int | None,
    tuned: int | None,
    wanted: int,
    unit: str,
    smaller: str,
    snapshots: int = 0,
) -> int:
    """How many sequences of ``seq_ctx`` tokens run at once in ``budget``
    bytes (0: unknown): ``asked`` (--parallel), which must fit; else the
    ``tuned`` count or llama-server's default, no more than fit, no more
    than ``wanted``. ``unit`` names a sequence in errors ("sequence", "slot"),
    ``smaller`` the options that shrink one ("--ctx"); ``snapshots`` the
    copies of its recurrent state each keeps (`ModelInfo.recurrent_bytes`)."""
    fits = parallel_that_fits(shape, seq_ctx, *kv, budget, snapshots) if budget else None
    if fits == 0 and wanted:
        raise UsageError(
            f"not even one {unit} of {seq_ctx} tokens fits in {budget / 2**30:.1f} GiB beside the weights",
            hint=f"lower {smaller}, or use --kv q8_0",
        )
    if asked is not None and fits is not None and asked > fits:
        raise UsageError(
            f"--parallel {asked} with {seq_ctx}-token {unit}s does not fit in memory; {fits} do",
            hint=f"use --parallel {fits}, a smaller {smaller}, or --kv q8_0",
        )
    return min(asked or default_parallel(wanted, fits, tuned), max(wanted, 1))


def default_parallel(n_prompts: int, fits: int | None, tuned: int | None = None) -> int:
    """``tuned`` (measured by `localrun tune`) or llama-server's default,
    no more than there are prompts, no more than fit in memory."""
    n = min(tuned or LLAMA_PARALLEL, max(n_prompts, 1))
    return max(1, min(n, fits)) if fits is not None else n


@dataclass(frozen=True)
class KvChoice:
    type_k: str
    type_v: str
    reason: str


def _quantizable(shape: ModelInfo) -> bool:
    return shape.key_length % _QUANT_BLOCK == 0 and shape.value_length % _QUANT_BLOCK == 0


def choose_kv(
    shape: ModelInfo,
    need: int,
    budget: int,
    costs: Mapping[str, float] | None = None,
    margin: float = 0.0,
    pairs: KvPairs = KV_AUTO_ORDER,
) -> KvChoice:
    """`--kv auto`: f16 while ``need`` tokens of context fit ``budget`` at
    f16, else q8_0, else q8_0 K with q4_0 V (a q4_0 K cache loses too much
    quality); with ``costs`` (decode ms per token at depth per "K/V", as
    `localrun tune` measured them on this machine) a quantized cache that
    decoded faster than f16 by more than ``margin`` (a share) is taken when it fits too.
    When none fits, the smallest, and the context check says why."""
    order = pairs if _quantizable(shape) else pairs[:1]
    fitting = [kv for kv in order if not budget or shape.memory_needed(need, kv[0], kv[1]) <= budget]
    if not fitting:
        k, v = order[-1]
        return KvChoice(k, v, f"no KV type fits {need} tokens in the memory budget; the smallest is tried")
    first = fitting[0]
    if first == order[0]:
        why = f"the run needs about {need} tokens of context, which fit at f16"
    else:
        why = f"the run needs about {need} tokens of context, which do not fit at f16 in {budget / 2**30:.1f} GiB"
    if costs:
        timed = [kv for kv in fitting if f"{kv[0]}/{kv[1]}" in costs]
        if timed and first in timed:
            fastest = min(timed, key=lambda kv: costs[f"{kv[0]}/{kv[1]}"])
            base, best = costs[f"{first[0]}/{first[1]}"], costs[f"{fastest[0]}/{fastest[1]}"]
            if fastest != first and best < base * (1 - margin):
                label = f"{fastest[0]}/{fastest[1]}"
                return KvChoice(*fastest, f"{why}; {label} decoded {base / best:.2f}x as fast here (localrun tune)")
    return KvChoice(*first, why)


def prompt_estimate(prompt_chars: int) -> int:
    """A prompt's tokens before the model loads: about 3 characters a token
    (an overestimate for prose, near it for code), and the chat template's."""
    return prompt_chars // 3 + 16


def run_extent(prompt_chars: int, max_tokens: int | None) -> tuple[int, int]:
    """(the context a run needs, the depth it mostly decodes at), estimated
    before the model loads: about 3 characters a token (an overestimate for
    prose, near it for code), and DEFAULT_CTX of room to generate without a limit."""
    prompt = prompt_estimate(prompt_chars)
    room = max_tokens if max_tokens is not None else DEFAULT_CTX
    return prompt + room, prompt + min(room, 1024) // 2


def conversation_depth(ctx: int | None) -> int:
    """The depth a conversation mostly decodes at, for flash attention: a chat,
    or a server's slot that clients re-send their history to, grows turn by
    turn toward its context ``ctx``, so the middle of it (of DEFAULT_CTX when
    --ctx is auto or not given)."""
    return (ctx or DEFAULT_CTX) // 2


def sequence_context(needs: list[int], fixed: int | None, limit: int) -> int:
    """Each batch sequence's context: ``fixed`` (--ctx) rounded up to the
    step, or enough for the largest of ``needs`` (prompt plus max tokens),
    at most ``limit`` (the trained context)."""
    if fixed is not None:
        return round_up(fixed)
    return slot_context(max(needs, default=1), limit)
