"""Planning a run: a model file, the run's settings and the shape of its
workload become one plan, before anything loads.

Every way localrun starts a model for a workload (generate, chat, `--batch`,
serve, bench, and the scripts that measure them) goes through `assemble`:
it places the run on this machine's devices (`localrun.runtime.placement`,
memory measured once), the model's draft beside it, settles what is automatic
from this machine's wisdom (`localrun.tune.apply`), sizes the context and the
sequences for the workload in the memory the placement has, and settles where
sampling runs for the loop that will really run. The `EngineConfig` it makes
carries all of it: the engine, the batch plan, serve's model table and the
draft drafter only carry it out. Nothing here prints: the notes a person
should see come back in `Assembled`.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from localrun import openmp
from localrun.errors import LocalrunError
from localrun.gguf.info import ATTENTION, N_UBATCH, ModelInfo, describe
from localrun.gguf.reader import GGUFInfo, read_gguf
from localrun.runtime import devices as devices_module
from localrun.runtime.devices import HOST, Device
from localrun.runtime.engine import EngineConfig
from localrun.runtime.memory import ROLLBACK_DEPTH
from localrun.runtime.model_template import ChatTemplate, choose_template, with_template
from localrun.runtime.placement import (
    DEFAULT_CTX,
    LLAMA_PARALLEL,
    Placement,
    check_kv_config,
    choose_context,
    conversation_depth,
    place,
    round_up,
    sequence_context,
    sequences,
)
from localrun.settings import AUTO, MTP_MODES, RunSettings
from localrun.speculative.control import StepGrowth
from localrun.speculative.nextn import MTP_UBATCH
from localrun.speculative.nextn import available as nextn_available
from localrun.system import cpu_count
from localrun.tune import apply as tuned
from localrun.tune import attention
from localrun.tune.wisdom import VERIFY_DEPTH, RunShape, Wisdom, setting_label

PINNED = ("option", "config", "model")  # where a thread count comes from that adapting must keep
UNBOUNDED = 1 << 30  # a server's slots: as many as fit


# -- the workload's shape --


@dataclass(frozen=True)
class OneSequence:
    """generate or chat: one sequence. ``need``: the context it needs,
    ``depth``: the depth it mostly decodes at (None: unknown);
    ``speculative``: the speculative loop runs it (any `--spec` but none),
    ``constrained``: a grammar masks its logits; ``prompt``: its prompt's
    tokens, estimated from its characters before the model loads (None: a
    conversation, which grows toward ``depth``) and
    ``answer`` its --max-tokens, for the run's shape."""

    need: int | None = None
    depth: int | None = None
    speculative: bool = False
    constrained: bool = False
    prompt: int | None = None
    answer: int | None = None


@dataclass(frozen=True)
class Prompts:
    """`--batch`: each runnable prompt's context need (its tokens, counted
    before placement with a vocabulary-only load, plus what it may generate);
    ``prompts`` and ``answers``: each one's prompt tokens and max tokens (0:
    none), for the run's shape (empty: unknown)."""

    needs: tuple[int, ...]
    prompts: tuple[int, ...] = ()
    answers: tuple[int, ...] = ()


@dataclass(frozen=True)
class Slots:
    """serve: slots of a context (`--ctx`, else DEFAULT_CTX) for one model,
    placed in what the models loaded before it left (see `replan`);
    ``speculative``: a request decoding alone drafts by prompt lookup (`--spec lookup`)."""

    speculative: bool = False


Workload = OneSequence | Prompts | Slots


@dataclass(frozen=True)
class Assembled:
    """A run's plan: its engine configuration (the placement with its
    per-device budgets and the draft's share, the context, the sequences and
    where sampling runs), the model's header, the settings as settled, the
    workload it was sized for, the draft model placed beside it, this
    machine's wisdom for the model, and what to tell a person about them."""

    config: EngineConfig
    info: GGUFInfo
    settings: RunSettings
    workload: Workload = OneSequence()
    draft: Path | None = None
    wisdom: Wisdom | None = None
    warnings: tuple[str, ...] = ()
    hint: str | None = None  # how to tune the model, said once per model
    gpu_hint: str | None = None  # a GPU the build cannot use, and the setup command that builds for it
    template: ChatTemplate | None = None  # the chat template chosen (`info` carries it), and where it came from

    @property
    def placement(self) -> Placement:
        return self.config.placement

    @property
    def parallel(self) -> int:
        """Sequences decoded at once."""
        return self.config.n_seq_max

    @property
    def seq_ctx(self) -> int:
        """Each sequence's context."""
        return self.config.n_ctx // max(self.config.n_seq_max, 1)

    @property
    def verify_curve(self) -> tuple[float, ...] | None:
        return self.wisdom.verify_curve if self.wisdom is not None else None

    @property
    def step_growth(self) -> StepGrowth | None:
        """How a plain decode step grows with the context for this run's KV
        types and flash attention, from the wisdom's rates (None: not
        measured), for the verify curve at depth."""
        rates = self.wisdom.rates if self.wisdom is not None else None
        if rates is None:
            return None
        config = self.config
        flash = "off" if config.flash_attn == "off" else "on"  # llama.cpp's auto settles on where it can
        line = rates.decode_line(setting_label(config.type_k, config.type_v, flash))
        return StepGrowth(VERIFY_DEPTH, *line) if line is not None else None


def report(settings: RunSettings, placement: Placement | None) -> dict[str, Any]:
    """The run's settings as `--json` and the history show them (each
    `{"value", "source"}`, with `"why"` for an automatic one), the placement
    among them: where the model runs and the memory budgeted for it."""
    shown = settings.as_dict()
    shown["wait"] = openmp.policy().as_setting()  # how llama.cpp's idle threads wait (localrun/openmp.py)
    if placement is not None:
        reasons = dict(placement.reasons)
        given = settings.sources.get("memory_budget", "default")
        shown["placement"] = {"value": placement.model.describe(), "source": "default", "why": reasons["model"]}
        shown["memory_budget"] = {"value": placement.budget or None, "source": given, "why": reasons["budget"]}
    return shown


def _draft_shape(draft: Path | None) -> ModelInfo | None:
    """The draft model's shape, for its share of a GPU; a draft file that
    cannot be read is left to the speculative path, which says why."""
    if draft is None:
        return None
    try:
        return describe(read_gguf(draft))
    except (LocalrunError, OSError):
        return None


def run_shape(workload: Workload, settings: RunSettings) -> RunShape | None:
    """What the run will do, for the settings chosen by their measured rates
    (`localrun.tune.apply` says which shape each kind of run gets)."""
    if isinstance(workload, OneSequence):
        if workload.prompt is not None:
            answer = workload.answer or tuned.OPEN_ANSWER
            budget = "--max-tokens" if workload.answer else "an open answer"
            return RunShape(workload.prompt, answer, what=f"the prompt estimated from its characters, {budget}")
        if workload.depth is not None:
            return RunShape(tuned.CHAT_MESSAGE, tuned.OPEN_ANSWER, workload.depth, what="a turn at the chat's middle")
        return None
    if isinstance(workload, Prompts):
        if not workload.prompts:
            return None
        answers = [a or tuned.OPEN_ANSWER for a in workload.answers] or [tuned.OPEN_ANSWER]
        prompt, answer = round(statistics.median(workload.prompts)), round(statistics.median(answers))
        return RunShape(prompt, answer, what="the batch's median line")
    half = conversation_depth(settings.n_ctx)
    return RunShape(half, tuned.OPEN_ANSWER, what="a request filling half its slot")


# auto's choice for the batch scheduler (--batch, serve's slots): sampling in
# the graph for several sequences measured slower on the CPU, not yet measured
# on a GPU (each request's chain attached and detached makes llama.cpp reserve
# its graphs again), so only `--sample-on device` asks for it there
SCHEDULER_AUTO = "the batch scheduler samples on the host unless --sample-on device asks for the graph"


def _host_loop(workload: Workload) -> str | None:
    """Why the loop that runs ``workload`` samples on the host whatever was
    asked, when it does (the batch scheduler's requests with a grammar or
    log-probabilities sample there too, each on its own: see `ContinuousBatch`)."""
    if isinstance(workload, Slots) and workload.speculative:
        drafts = "the server's slots draft by prompt lookup, checked on the host"
        return f"{drafts} (with --spec none, --sample-on device may sample on the GPU)"
    if isinstance(workload, Prompts | Slots):
        return None
    if workload.speculative:
        return "speculative decoding samples on the host (with --spec none, plain decoding may sample on the GPU)"
    if workload.constrained:
        return "a grammar masks the logits on the host"
    return None


def sample_on(settings: RunSettings, placement: Placement, workload: Workload = OneSequence()) -> RunSettings:
    """Where the run samples, settled against the loop that will run it: as
    asked, or on auto on the device when it holds the output layer (the
    logits are made there, and llama.cpp then copies one token to the host,
    not a vocabulary's row), else on the host, with the reason (the batch
    scheduler: the host, `SCHEDULER_AUTO`); and on the host wherever the
    loop that runs ``workload`` samples there (speculation, a grammar),
    whatever was asked."""
    if settings.sample_on == AUTO:
        if isinstance(workload, Prompts | Slots):
            where, why = "host", SCHEDULER_AUTO
        elif placement.model.whole:
            where, why = "device", "the output layer is on the GPU: the sampler chain runs in llama.cpp's graph there"
        else:
            where, why = "host", "the logits are made on the CPU"
        settings = replace(settings, sample_on=where, reasons={**settings.reasons, "sample_on": why})
    on_host = _host_loop(workload)
    if on_host is None or settings.sample_on == "host":
        return settings
    return replace(settings, sample_on="host", reasons={**settings.reasons, "sample_on": on_host})


# -- sizing the workload --


@dataclass(frozen=True)
class _Extent:
    """What placement plans for: each sequence's context (None: one sequence
    as the settings say), how many are wanted, and the depth decoded at."""

    seq_ctx: int | None
    wanted: int
    need: int | None
    depth: int | None


def _asked_parallel(settings: RunSettings) -> tuple[int | None, int | None]:
    """(the count asked for, which must fit; the count `localrun tune` measured, capped by what fits)."""
    if settings.sources.get("parallel") == "wisdom":
        return None, settings.parallel
    return settings.parallel, None


def _extent(shape: ModelInfo, settings: RunSettings, workload: Workload) -> _Extent:
    trained = shape.context_length or DEFAULT_CTX
    if isinstance(workload, OneSequence):
        # a context given is allocated whole: the KV type and the layers are chosen for it
        return _Extent(None, 1, max(workload.need or 0, settings.n_ctx or 0) or None, workload.depth)
    asked, tuned_count = _asked_parallel(settings)
    if isinstance(workload, Prompts):
        # --ctx sets each sequence's context; the model's default context caps a sized one
        fixed = settings.n_ctx if settings.sources.get("ctx") == "option" else None
        limit = min(trained, settings.n_ctx) if settings.n_ctx else trained
        seq_ctx = sequence_context(list(workload.needs), fixed, limit)
        wanted = asked or min(tuned_count or LLAMA_PARALLEL, max(len(workload.needs), 1))
        return _Extent(seq_ctx, wanted, seq_ctx * wanted, None)
    slot_ctx = round_up(settings.n_ctx if settings.n_ctx is not None else min(DEFAULT_CTX, trained))
    wanted = asked or tuned_count or LLAMA_PARALLEL
    return _Extent(slot_ctx, wanted, slot_ctx * wanted, conversation_depth(settings.n_ctx))


def _size(
    shape: ModelInfo, settings: RunSettings, workload: Workload, extent: _Extent, placement: Placement
) -> tuple[int, int]:
    """(the context, the sequences sharing it), in the memory ``placement`` has for it."""
    kv = (settings.type_k, settings.type_v)
    snapshots = rollback_depth(shape, settings)  # a recurrent state's copies kept per sequence
    if extent.seq_ctx is None:
        flash_attn = check_kv_config(kv, settings.flash_attn, shape)
        n_ctx = choose_context(shape, settings.n_ctx, kv, flash_attn, placement.budget, snapshots)
        if settings.n_ctx is None and placement.max_ctx is not None:  # a partial offload planned for this context
            n_ctx = min(n_ctx, placement.max_ctx)
        return n_ctx, 1
    check_kv_config(kv, settings.flash_attn, shape)
    asked, tuned_count = _asked_parallel(settings)
    batch = isinstance(workload, Prompts)
    parallel = sequences(
        shape,
        extent.seq_ctx,
        kv,
        placement.budget,
        asked=asked,
        tuned=tuned_count,
        wanted=len(workload.needs) if isinstance(workload, Prompts) else UNBOUNDED,
        unit="sequence" if batch else "slot",
        smaller="--ctx or --max-tokens" if batch else "--ctx",
        snapshots=snapshots,
    )
    if placement.max_ctx is not None and asked is None:  # a partial offload: its layers were planned for so many
        parallel = max(1, min(parallel, placement.max_ctx // extent.seq_ctx))
    return extent.seq_ctx * parallel, parallel


def assemble(
    path: Path,
    settings: RunSettings,
    *,
    workload: Workload = OneSequence(),
    verbose: bool = False,
    hint_once: bool = False,
    devices: Sequence[Device] | None = None,
    use_wisdom: bool = True,
    draft: Path | None = None,
    template: ChatTemplate | None = None,
) -> Assembled:
    """The plan of ``workload`` on the model at ``path`` with ``settings``
    (after the precedence rule of `localrun.settings.resolve`): placed on
    ``devices`` (None: this machine's, probed now) with ``draft`` (the draft
    model that will run beside it) in the same plan, its automatic values
    settled from the wisdom (``use_wisdom`` False: llama.cpp's defaults, as a
    benchmark comparing with llama.cpp's own tools needs), its context and
    sequences sized in the memory placed. ``template`` (`--template`)
    replaces the GGUF's chat template in ``info``, for every reader of it; a
    GGUF without one gets the one its architecture implies, where one does.
    The model is not loaded."""
    info = read_gguf(path)
    chosen = choose_template(info, template)
    info = with_template(info, chosen)
    shape = describe(info)
    mtp = _drafts_with_head(info, settings, workload)
    held = _held(shape, mtp)
    found_devices = devices_module.probe() if devices is None else tuple(devices)
    extent = _extent(held, settings, workload)
    placement = _place(held, settings, extent.need, found_devices, draft)
    found = (
        tuned.find(path, (settings.type_k, settings.type_v), hint_once=hint_once) if use_wisdom else tuned.Found(None)
    )
    on_cpu = use_wisdom and not placement.model.offloaded  # attention on the CPU: its mode measured here
    settings = tuned.apply(
        settings,
        held,  # the KV types chosen to fit what the run holds, the head's cache too
        found.wisdom,
        need=extent.need,
        depth=extent.depth,
        budget=placement.budget,
        kv_pairs=placement.kv_pairs,
        attention=functools.partial(attention.measured, shape, verbose=verbose) if on_cpu else None,
        run=run_shape(workload, settings),
    )
    settings = sample_on(settings, placement, workload)
    config = _config(info, held, settings, workload, extent, placement, verbose, mtp)
    gpu_hint = devices_module.unused_gpu(found_devices) if settings.gpu_layers != "0" else None
    warnings = list(found.warnings)
    kv = (settings.type_k, settings.type_v)
    if placement.model.offloaded and kv not in placement.kv_pairs:
        warnings.append(
            f"KV {kv[0]}/{kv[1]} on a GPU: llama.cpp's CUDA flash attention has kernels for matching K and V "
            "types only, and falls back to a slower path for this pair; --kv q8_0 (or f16) keeps them matched"
        )
    return Assembled(
        config, info, settings, workload, draft, found.wisdom, tuple(warnings), found.hint, gpu_hint, chosen
    )


def _drafts_with_head(info: GGUFInfo, settings: RunSettings, workload: Workload) -> bool:
    """Whether the run's MTP head may draft: one sequence's speculation (serve's
    and --batch's slots draft by lookup) as `--spec mtp` asks (a build without
    the calls it needs then says so), or auto on a build that has them."""
    asked = settings.draft == "mtp" or (settings.draft in MTP_MODES and nextn_available())
    return info.mtp_head and asked and isinstance(workload, OneSequence)


def _held(shape: ModelInfo, mtp: bool) -> ModelInfo:
    """The model's memory as the run holds it: with ``mtp`` (its MTP head
    drafts: one sequence's speculation, as `--spec mtp` or auto asks; serve's
    and --batch's slots draft by lookup), the head's KV cache beside the trunk's."""
    return shape.with_mtp_cache(MTP_UBATCH) if mtp else shape


def _place(
    shape: ModelInfo, settings: RunSettings, need: int | None, found: tuple[Device, ...], draft: Path | None
) -> Placement:
    type_k, type_v = ("f16" if t == AUTO else t for t in (settings.type_k, settings.type_v))  # f16 if any fits
    return place(
        found,
        memory_budget=settings.memory_budget,
        shape=shape,
        need=need,
        kv=(type_k, type_v),
        gpu_layers=settings.gpu_layers,
        device=settings.device,
        draft=_draft_shape(draft) if devices_module.offload_targets(found) else None,
    )


def _config(
    info: GGUFInfo,
    shape: ModelInfo,
    settings: RunSettings,
    workload: Workload,
    extent: _Extent,
    placement: Placement,
    verbose: bool,
    mtp: bool,
) -> EngineConfig:
    n_ctx, parallel = _size(shape, settings, workload, extent, placement)
    # a count given is kept; with every layer on a GPU nothing decodes on the CPU, and nothing adapts
    adaptive = settings.sources.get("threads") not in PINNED and not placement.model.whole
    return EngineConfig(
        model_path=info.path,
        placement=placement,
        n_ctx=n_ctx,
        ctx_asked=settings.n_ctx is not None,
        n_seq_max=parallel,
        n_threads=settings.threads,
        adapt_threads=adaptive,
        max_threads=cpu_count() if adaptive else None,
        n_ubatch=settings.n_ubatch or N_UBATCH,
        type_k=settings.type_k,
        type_v=settings.type_v,
        flash_attn=settings.flash_attn,
        verbose=verbose,
        sample_on=settings.sample_on,
        n_rs_seq=rollback_depth(shape, settings),
        mtp=mtp,  # its MTP head may draft (`_drafts_with_head`)
    )


def rollback_depth(shape: ModelInfo, settings: RunSettings) -> int:
    """The snapshots a recurrent memory keeps per sequence so that a
    speculative step's rejected rows can be taken back (llama.cpp keeps
    none on the architectures that cannot; `localrun.runtime.memory`);
    none for a KV cache, or where nothing speculates."""
    return ROLLBACK_DEPTH if shape.memory != ATTENTION and settings.draft != "none" else 0


def less_held(found: Sequence[Device], held: Mapping[str, int]) -> tuple[Device, ...]:
    """``found`` with ``held`` bytes (by device name) taken from each device's free memory."""
    return tuple(replace(d, free=max(d.free - held.get(d.name, 0), 0)) for d in found)


def replan(run: Assembled, found: Sequence[Device], held: Mapping[str, int]) -> Assembled:
    """``run`` placed and sized again, its settings as settled, on ``found``
    (the devices as measured before any model loaded) less ``held``: what
    the models loaded since measurably hold on each device, by name. So
    serve's second model goes where its first left room."""
    shape = _held(describe(run.info), run.config.mtp)
    settings = run.settings
    if settings.memory_budget:  # a budget the user gave: what the loaded models hold on the host comes off it
        settings = replace(settings, memory_budget=max(settings.memory_budget - held.get(HOST, 0), 1))
    extent = _extent(shape, settings, run.workload)
    placement = _place(shape, settings, extent.need, less_held(found, held), run.draft)
    settings = sample_on(settings, placement, run.workload)
    config = _config(run.info, shape, settings, run.workload, extent, placement, run.config.verbose, run.config.mtp)
    return replace(run, config=config, settings=replace(settings, memory_budget=run.settings.memory_budget))
