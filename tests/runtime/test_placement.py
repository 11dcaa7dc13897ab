from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from localrun.errors import UsageError
from localrun.events import DoneEvent
from localrun.gguf.info import ModelInfo, describe
from localrun.gguf.reader import GGUFInfo, read_gguf
from localrun.runtime.devices import Device
from localrun.runtime.engine import Engine
from localrun.runtime.generate import generate
from localrun.runtime.placement import GPU_RESERVE, KV_AUTO_ORDER, RESERVE, ModelPlacement, place
from localrun.runtime.sampling import SamplingParams
from tests.helpers import cli, engine_config
from tests.tinymodel import write_tiny_model

if TYPE_CHECKING:
    from localrun.assemble import Assembled


@pytest.mark.parametrize("type_k", ["f16", "q8_0", "q4_0"])
@pytest.mark.parametrize("type_v", ["f16", "q8_0", "q4_0"])
def test_kv_types_load_generate_and_match_the_prediction(wide_model: Path, type_k: str, type_v: str) -> None:
    config = engine_config(wide_model, n_ctx=512, type_k=type_k, type_v=type_v)
    with Engine(config) as engine:
        events = list(generate(engine, engine.tokenize("hello"), SamplingParams(temperature=0), max_tokens=8))
        measured = engine.kv_cache_bytes
        cells = engine.kv_cells
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.stats.generated_tokens == 8
    info = describe(read_gguf(wide_model))
    predicted = info.kv_bytes_per_token(type_k) / 2 + info.kv_bytes_per_token(type_v) / 2  # K and V halves
    assert measured is not None and cells == 512
    assert measured / cells == pytest.approx(predicted, rel=0.05)


def test_quantized_v_without_flash_attention_is_refused(wide_model: Path) -> None:
    with pytest.raises(UsageError, match="needs flash attention"):
        Engine(engine_config(wide_model, type_v="q4_0", flash_attn="off"))
    res = cli("generate", "-m", str(wide_model), "--kv", "q4_0", "--flash-attn", "off", "-n", "2", "hi")
    assert res.returncode == 2 and "--flash-attn on" in res.stderr and "Traceback" not in res.stderr


def test_quantized_v_switches_flash_attention_on(wide_model: Path) -> None:
    res = cli("generate", "-m", str(wide_model), "--kv-v", "q4_0", "-n", "4", "--stats", "hi")
    assert res.returncode == 0, res.stderr
    assert "4 tokens" in res.stderr


def test_head_size_too_small_for_quantized_cache(tiny_model: Path) -> None:
    res = cli("generate", "-m", str(tiny_model), "--kv", "q8_0", "hi")
    assert res.returncode == 2 and "multiple of 32" in res.stderr


def test_unknown_kv_type(wide_model: Path) -> None:
    res = cli("generate", "-m", str(wide_model), "--kv", "q5_1", "hi")
    assert res.returncode == 2 and "unknown KV cache type" in res.stderr


@pytest.fixture(scope="module")
def wide_long_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("kvlong")
    return write_tiny_model(folder / "wide-long.gguf", n_embd=128, n_head=4, n_head_kv=2, n_ctx_train=32768)


def planned(model: Path, budget: int, **options: Any) -> Assembled:
    """One sequence's plan for ``model`` in ``budget`` bytes, without wisdom."""
    from localrun.assemble import assemble
    from localrun.settings import Options, resolve

    devices = [Device("CPU", "fake", "cpu", 0, 0)]  # nothing known of memory but the budget
    return assemble(model, resolve(Options(memory_budget=budget, **options)), devices=devices, use_wisdom=False)


def test_auto_context_fits_the_budget(wide_long_model: Path) -> None:
    long_model = wide_long_model
    shape = describe(read_gguf(long_model))
    per_token = shape.context_bytes_per_token("f16", flash_attn="off")  # KV, and attention scores when unfused
    assert per_token > shape.kv_bytes_per_token("f16")
    budget = shape.weights_bytes + shape.compute_bytes() + 3000 * per_token
    run = planned(long_model, budget, flash_attn="off", kv="f16")
    assert run.config.n_ctx == 2816 and not run.config.ctx_asked  # 3000 tokens of room, in steps of 256
    with Engine(run.config) as engine:
        assert engine.n_ctx == 2816  # the engine carries the plan out
    f16 = shape.kv_bytes_per_token("f16")
    budget = shape.weights_bytes + shape.compute_bytes() + 3000 * f16
    quantized = planned(long_model, budget, kv="q8_0").config
    # the longest context that fits: one more step of 256 would not
    assert shape.memory_needed(quantized.n_ctx, "q8_0", "q8_0", "on") <= budget
    assert shape.memory_needed(quantized.n_ctx + 256, "q8_0", "q8_0", "on") > budget
    with Engine(quantized) as engine:
        assert engine.flash_attn == "on"  # a quantized V: no scores buffer


def test_auto_context_stops_at_the_trained_context(tiny_model: Path) -> None:
    assert planned(tiny_model, 10**10).config.n_ctx == 512


def test_context_that_does_not_fit_is_refused_with_numbers(long_model: Path) -> None:
    shape = describe(read_gguf(long_model))
    budget = shape.weights_bytes + shape.compute_bytes() + 1000 * shape.context_bytes_per_token("f16")
    with pytest.raises(UsageError, match=r"--ctx 8192 needs .* GiB .*memory budget") as info:
        planned(long_model, budget, ctx="8192", kv="f16")
    assert info.value.hint is not None and "--ctx auto fits 768" in info.value.hint
    with pytest.raises(UsageError, match="does not fit"):
        planned(long_model, shape.weights_bytes, kv="f16")


def test_ctx_option(tiny_model: Path) -> None:
    assert cli("generate", "-m", str(tiny_model), "--ctx", "auto", "-n", "2", "hi").returncode == 0
    bad = cli("generate", "-m", str(tiny_model), "--ctx", "lots", "hi")
    assert bad.returncode == 2 and "--ctx auto" in bad.stderr


def test_auto_flash_attention_is_llama_cpps_unless_v_is_quantized(wide_model: Path, tmp_path: Path) -> None:
    """Without wisdom nothing is assumed about which mode is faster (localrun
    tune measures it): llama.cpp's own auto, and on for a quantized V."""
    big_heads = write_tiny_model(tmp_path / "big-heads.gguf", n_embd=256, n_head=2, n_head_kv=1)
    cases = [
        (wide_model, "f16", "auto"),
        (wide_model, "q8_0", "on"),  # a quantized V cache needs flash attention
        (big_heads, "f16", "auto"),
    ]
    for path, type_v, expected in cases:
        with Engine(engine_config(path, n_ctx=512, type_v=type_v)) as engine:
            assert engine.flash_attn == expected, (path.name, type_v)
            events = list(generate(engine, engine.tokenize("hello"), SamplingParams(temperature=0), max_tokens=4))
            assert isinstance(events[-1], DoneEvent) and events[-1].stats.generated_tokens == 4


def test_unfused_attention_scores_are_counted_in_the_memory_estimate(wide_long_model: Path) -> None:
    """Without flash attention llama.cpp's compute buffer holds a ubatch's
    scores over the whole context; the estimate bounds what it allocates."""
    n_ctx = 8192
    buffers: dict[str, int] = {}
    for mode in ("off", "on"):
        with Engine(engine_config(wide_long_model, n_ctx=n_ctx, flash_attn=mode)) as engine:
            assert engine.compute_buffer_bytes is not None
            buffers[mode] = engine.compute_buffer_bytes
    info = describe(read_gguf(wide_long_model))
    predicted = n_ctx * (info.context_bytes_per_token("f16", flash_attn="off") - info.kv_bytes_per_token("f16"))
    grown = buffers["off"] - buffers["on"]
    assert predicted > 0 and predicted / 4 <= grown <= predicted


def test_a_context_that_does_not_fit_is_refused_before_the_load(
    wide_long_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from localrun.runtime import engine as engine_module

    loads: list[object] = []
    monkeypatch.setattr(engine_module, "_load_model", lambda info, placed, mtp=False: loads.append(info))
    shape = describe(read_gguf(wide_long_model))
    with pytest.raises(UsageError, match="--ctx 8192 needs"):
        planned(wide_long_model, shape.weights_bytes, ctx="8192")
    assert loads == []


# -- memory measured once, before anything loads --


class ShrinkingMemory:
    """A fake host whose available memory drops by a model's weights once
    llama.cpp has loaded them, as the OS reports it after a real load."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, free: int) -> None:
        from localrun.runtime import devices
        from localrun.runtime import engine as engine_module

        self.free = free
        self.reads = 0
        real_load = engine_module._load_model

        def load(info: GGUFInfo, placed: ModelPlacement, *, mtp: bool = False) -> object:
            handle = real_load(info, placed, mtp=mtp)
            self.free -= describe(info).weights_bytes
            return handle

        def probe() -> tuple[Device, ...]:
            self.reads += 1
            return (Device("CPU", "fake", "cpu", self.free, 2 * free),)

        monkeypatch.setattr(engine_module, "_load_model", load)
        monkeypatch.setattr(devices, "probe", probe)


def test_a_batch_is_sized_in_the_memory_measured_before_its_weights_loaded(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from localrun.assemble import Prompts, assemble
    from localrun.runtime.batch.input import read_lines
    from localrun.runtime.batch.plan import BatchSettings, batch_plan, jobs_for, tokenize_jobs
    from localrun.runtime.engine import Vocabulary, Weights
    from localrun.settings import Options, resolve

    shape = describe(read_gguf(tiny_model))
    per_sequence = 512 * shape.kv_bytes_per_token("f16", "f16")
    assert shape.weights_bytes > per_sequence  # counting the weights twice would cost at least one sequence
    room = shape.weights_bytes + shape.compute_bytes() + 4 * per_sequence + per_sequence // 2  # four fit
    memory = ShrinkingMemory(monkeypatch, RESERVE + room)
    jobs = jobs_for(read_lines([f"prompt {i}\n" for i in range(4)]))
    with Vocabulary(tiny_model) as vocabulary:  # the prompts counted before the run is placed
        needs = tokenize_jobs(jobs, BatchSettings(max_tokens=300), vocabulary)
    run = assemble(tiny_model, resolve(Options(kv="f16")), workload=Prompts(needs), use_wisdom=False)
    with Weights(tiny_model, run.placement) as weights:
        batch = batch_plan(jobs, run.config)
        assert weights.handle
    assert memory.free < RESERVE + room  # the fake did see the load
    assert batch.seq_ctx == 512 and batch.parallel == 4 and run.config.n_seq_max == 4
    assert memory.reads == 1


def test_served_models_share_one_measurement(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second model gets what the first left of the memory measured
    before either loaded, less what the first measurably holds, not that
    less the first's weights again."""
    from localrun.assemble import Slots, assemble
    from localrun.runtime import devices
    from localrun.runtime.placement import parallel_that_fits
    from localrun.serve.served import ModelPlan, load_models
    from localrun.settings import Options, resolve

    shape = describe(read_gguf(tiny_model))
    per_slot = shape.memory_needed(2 * 512, "f16", "f16") - shape.memory_needed(512, "f16", "f16")
    room = shape.memory_needed(4 * 512, "f16", "f16") + shape.memory_needed(2 * 512, "f16", "f16") + per_slot // 2
    memory = ShrinkingMemory(monkeypatch, RESERVE + room)
    found = devices.probe()
    settings = resolve(Options(threads=1, kv="f16"))
    plans = [
        ModelPlan(name, frozenset(), assemble(tiny_model, settings, workload=Slots(), devices=found, use_wisdom=False))
        for name in ("a", "b")
    ]
    models = load_models(plans)
    try:
        left = room - sum(models[0].held.values())
        assert [m.worker.parallel for m in models] == [4, min(4, parallel_that_fits(shape, 512, "f16", "f16", left))]
    finally:
        for model in models:
            model.close()
    assert memory.reads == 1


def test_placement_on_a_cpu_only_machine_and_beside_a_gpu() -> None:
    cpu = Device("CPU", "a CPU", "cpu", 8 * 2**30, 16 * 2**30)
    alone = place([cpu])
    assert alone.budget == 8 * 2**30 - RESERVE and alone.model.n_gpu_layers == 0 and alone.model.repack
    assert "no GPU" in dict(alone.reasons)["model"]
    gpu = Device("CUDA0", "a GPU", "gpu", 70 * 2**30, 80 * 2**30)
    beside = place([cpu, gpu], memory_budget=2**30)
    assert beside.budget == 2**30 and beside.model.describe() == "CPU"  # no GPU placement yet: the CPU's plan
    assert "shape is unknown" in dict(beside.reasons)["model"]  # nothing to weigh against the GPU's memory
    assert place([]).budget == 0
    shown = beside.to_json()
    assert shown["devices"][1] == {
        "name": "CUDA0",
        "kind": "gpu",
        "description": "a GPU",
        "free": gpu.free,
        "total": gpu.total,
    }
    assert shown["budget_bytes"] == 2**30 and shown["device_budget_bytes"] == {"CPU": 2**30}


def test_the_real_probe_finds_the_host_first() -> None:
    from localrun.runtime import devices

    found = devices.probe()
    assert found[0].name == "CPU" and found[0].kind == "cpu" and found[0].free > 0
    assert found[0].total >= found[0].free
    assert all(d.kind != "cpu" for d in found[1:])


# -- GPUs, on fake devices --

CPU = Device("CPU", "a CPU", "cpu", 8 * 2**30, 16 * 2**30)


def gpu(name: str, free: int) -> Device:
    return Device(name, "a GPU", "gpu", GPU_RESERVE + free, GPU_RESERVE + free + 2**30)


@pytest.fixture(scope="module")
def tiny_shape(tmp_path_factory: pytest.TempPathFactory) -> ModelInfo:
    return describe(read_gguf(write_tiny_model(tmp_path_factory.mktemp("gpu") / "tiny.gguf")))


def per_layer(shape: ModelInfo, tokens: int = 512) -> int:
    return shape.layer_bytes + tokens * shape.kv_bytes_per_token("f16") // shape.layers


def whole(shape: ModelInfo, tokens: int = 512) -> int:
    return shape.layers * per_layer(shape, tokens) + shape.output_bytes + shape.compute_bytes()


def test_every_layer_goes_on_a_gpu_that_holds_the_model(tiny_shape: ModelInfo) -> None:
    plan = place([CPU, gpu("CUDA0", 2**30)], shape=tiny_shape, need=512)
    assert plan.model.whole and plan.model.devices == ("CUDA0",) and plan.model.n_gpu_layers == tiny_shape.layers + 1
    assert plan.budget == 2**30 and plan.max_ctx is None and plan.retry  # the context is sized in the GPU
    assert dict(plan.budgets) == {"CPU": CPU.free - RESERVE, "CUDA0": 2**30}
    assert "all 2 layers" in dict(plan.reasons)["model"] and "1024 MiB reserve" in dict(plan.reasons)["model"]
    assert plan.kv_pairs == (("f16", "f16"), ("q8_0", "q8_0"))  # matched pairs only: CUDA's flash attention kernels


def test_the_most_layers_that_fit_the_rest_on_the_cpu(tiny_shape: ModelInfo) -> None:
    room = tiny_shape.compute_bytes() + per_layer(tiny_shape) * 3 // 2  # one layer and a half
    assert room < whole(tiny_shape)
    plan = place([CPU, gpu("CUDA0", room)], shape=tiny_shape, need=512)
    assert plan.model.n_gpu_layers == 1 and not plan.model.whole
    assert plan.max_ctx == 512 and plan.budget == CPU.free - RESERVE + room
    assert "1 of 2 layers (the rest on the CPU)" in dict(plan.reasons)["model"]


def test_nothing_fits_and_the_reserve_is_kept(tiny_shape: ModelInfo) -> None:
    plan = place([CPU, gpu("CUDA0", tiny_shape.compute_bytes())], shape=tiny_shape, need=512)
    assert not plan.model.offloaded and plan.budget == CPU.free - RESERVE and plan.kv_pairs == KV_AUTO_ORDER
    assert "not one layer fits" in dict(plan.reasons)["model"]
    # a GPU with less free than the reserve holds nothing, however small the model
    small = Device("CUDA0", "a GPU", "gpu", GPU_RESERVE // 2, 2 * GPU_RESERVE)
    assert not place([CPU, small], shape=tiny_shape, need=512).model.offloaded


def test_two_gpus_share_the_layers(tiny_shape: ModelInfo) -> None:
    half = whole(tiny_shape) - per_layer(tiny_shape) // 2  # one alone holds all but a part; two hold it all
    plan = place([CPU, gpu("CUDA0", half), gpu("CUDA1", half)], shape=tiny_shape, need=512)
    assert plan.model.whole and plan.model.devices == ("CUDA0", "CUDA1")
    assert dict(plan.budgets) == {"CPU": CPU.free - RESERVE, "CUDA0": half, "CUDA1": half}
    one = place([CPU, gpu("CUDA0", half), gpu("CUDA1", half)], shape=tiny_shape, need=512, device="cuda1")
    assert one.model.devices == ("CUDA1",) and not one.model.whole


def test_a_draft_that_tips_the_balance(tiny_shape: ModelInfo) -> None:
    target = dataclasses.replace(tiny_shape, layers=20, block_bytes=20 * 2**26, output_bytes=2**25)
    draft_bytes = tiny_shape.memory_needed(512, "f16")
    room = whole(target) + draft_bytes // 2  # the target fits alone, not beside its draft
    alone = place([CPU, gpu("CUDA0", room)], shape=target, need=512)
    beside = place([CPU, gpu("CUDA0", room)], shape=target, need=512, draft=tiny_shape)
    assert alone.model.whole and not alone.draft.offloaded
    assert beside.draft.whole and 0 < beside.model.n_gpu_layers < alone.model.n_gpu_layers  # the draft came first
    assert "with its KV cache" in dict(beside.reasons)["draft"]
    assert beside.for_draft().model == beside.draft and beside.for_draft().budget == beside.budget
    crowded = place([CPU, gpu("CUDA0", 3 * draft_bytes)], shape=tiny_shape, need=512, draft=tiny_shape)
    assert not crowded.draft.offloaded  # a draft takes a small share of a GPU, or stays on the CPU


def test_what_the_user_gave_is_kept(tiny_shape: ModelInfo) -> None:
    nothing_fits = [CPU, gpu("CUDA0", 0)]
    assert place(nothing_fits, shape=tiny_shape, gpu_layers="2").model.n_gpu_layers == 2  # as asked: no fit
    assert place(nothing_fits, shape=tiny_shape, gpu_layers="all").model.whole
    assert not place(nothing_fits, shape=tiny_shape, gpu_layers="2").retry  # a count given is never lowered
    on_cpu = place([CPU, gpu("CUDA0", 2**30)], shape=tiny_shape, gpu_layers="0")
    assert not on_cpu.model.offloaded and dict(on_cpu.reasons)["model"] == "CPU: --gpu-layers 0"
    assert not place([CPU, gpu("CUDA0", 2**30)], shape=tiny_shape, device="CPU").model.offloaded
    with pytest.raises(UsageError, match="needs a GPU"):
        place([CPU], shape=tiny_shape, gpu_layers="all")
    with pytest.raises(UsageError, match="no device 'CUDA7'") as err:
        place([CPU, gpu("CUDA0", 2**30)], shape=tiny_shape, device="CUDA7")
    assert err.value.hint is not None and "CUDA0" in err.value.hint
    with pytest.raises(UsageError, match="not a count"):
        place([CPU], shape=tiny_shape, gpu_layers="most")


def test_a_longer_context_moves_layers_off_the_gpu(tiny_shape: ModelInfo) -> None:
    room = whole(tiny_shape, 512)
    assert place([CPU, gpu("CUDA0", room)], shape=tiny_shape, need=512).model.whole
    assert not place([CPU, gpu("CUDA0", room)], shape=tiny_shape, need=4096).model.whole


def test_a_device_out_of_memory_costs_one_retry_with_fewer_layers(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from localrun.errors import BadModelError
    from localrun.runtime import engine as engine_module

    real = engine_module._load_model
    tried: list[int] = []

    def load(info: GGUFInfo, placed: ModelPlacement, *, mtp: bool = False) -> object:
        tried.append(placed.n_gpu_layers)
        if placed.n_gpu_layers > 2:  # the device holds two layers at most
            raise BadModelError("out of memory")
        return real(info, placed, mtp=mtp)

    monkeypatch.setattr(engine_module, "_load_model", load)
    shape = describe(read_gguf(tiny_model))
    plan = place([CPU, gpu("CUDA0", 2**30)], shape=shape, need=512)
    with Engine(engine_config(tiny_model, n_ctx=512, placement=plan)) as engine:
        assert tried == [shape.layers + 1, (shape.layers) // 2] and engine.placement.model.n_gpu_layers == 1
        assert len(engine.notices) == 1 and "retried with CUDA0, 1 of 2 layers" in engine.notices[0]
    tried.clear()
    given = place([CPU, gpu("CUDA0", 2**30)], shape=shape, gpu_layers="3")
    with pytest.raises(BadModelError):  # a count the user gave is not lowered behind their back
        Engine(engine_config(tiny_model, n_ctx=512, placement=given))
    assert tried == [3]


def test_assembling_a_run_on_a_gpu(tiny_model: Path) -> None:
    from localrun.assemble import assemble
    from localrun.settings import Options, resolve

    run = assemble(tiny_model, resolve(Options()), devices=[CPU, gpu("CUDA0", 2**30)], use_wisdom=False)
    assert run.placement.model.whole and not run.config.adapt_threads  # nothing decodes on the CPU
    assert run.settings.type_k == "f16" and run.settings.sources["gpu_layers"] == "default"
    cpu = assemble(tiny_model, resolve(Options(gpu_layers="0")), devices=[CPU, gpu("CUDA0", 2**30)], use_wisdom=False)
    assert not cpu.placement.model.offloaded and cpu.config.adapt_threads


def test_sampling_moves_to_the_device_only_with_the_whole_model(tiny_model: Path) -> None:
    from localrun.assemble import assemble
    from localrun.settings import Options, resolve

    on_gpu = [CPU, gpu("CUDA0", 2**30)]
    whole = assemble(tiny_model, resolve(Options()), devices=on_gpu, use_wisdom=False)
    assert whole.config.sample_on == "device" and "output layer" in whole.settings.reasons["sample_on"]
    assert assemble(tiny_model, resolve(Options()), devices=[CPU], use_wisdom=False).config.sample_on == "host"
    layers = whole.placement.model.layers  # every repeating layer, the output layer left on the CPU
    part = assemble(tiny_model, resolve(Options(gpu_layers=str(layers))), devices=on_gpu, use_wisdom=False)
    assert not part.placement.model.whole and part.config.sample_on == "host"
    asked = assemble(tiny_model, resolve(Options(sample_on="host")), devices=on_gpu, use_wisdom=False)
    assert asked.config.sample_on == "host" and asked.settings.sources["sample_on"] == "option"
    assert assemble(tiny_model, resolve(Options(sample_on="device")), devices=[CPU]).config.sample_on == "device"


def test_a_gpu_the_build_cannot_use_gets_a_hint(
    tiny_model: Path, wide_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from localrun.assemble import assemble
    from localrun.runtime import devices
    from localrun.settings import Options, resolve

    real = devices.gpu_vendor
    monkeypatch.setattr(devices, "gpu_vendor", lambda **kw: real(root=tmp_path, **kw))
    assert assemble(tiny_model, resolve(Options()), devices=[CPU], use_wisdom=False).gpu_hint is None
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").touch()  # a driver's device node, and a CPU-only build
    hint = assemble(tiny_model, resolve(Options()), devices=[CPU], use_wisdom=False).gpu_hint
    assert hint is not None and "LOCALRUN_BACKEND=cuda scripts/setup" in hint
    assert (
        assemble(tiny_model, resolve(Options()), devices=[CPU, gpu("CUDA0", 2**30)], use_wisdom=False).gpu_hint is None
    )
    unmatched = assemble(
        wide_model, resolve(Options(kv_k="q8_0", kv_v="q4_0")), devices=[CPU, gpu("CUDA0", 2**30)], use_wisdom=False
    )
    assert any("matching K and V" in w for w in unmatched.warnings)


@pytest.fixture(scope="module")
def hybrid_shape(tmp_path_factory: pytest.TempPathFactory) -> ModelInfo:
    from tests.hybridmodels import BY_NAME, write_hybrid_model

    return describe(read_gguf(write_hybrid_model(BY_NAME["qwen35"], tmp_path_factory.mktemp("hybrid") / "q.gguf")))


def test_each_sequence_holds_its_recurrent_state(hybrid_shape: ModelInfo) -> None:
    """A hybrid's sequence costs its attention layers' KV cache and its
    recurrent state (with the snapshots a context keeps); a transformer's
    its KV cache alone, as before."""
    from localrun.runtime.placement import choose_context, parallel_that_fits

    shape = hybrid_shape
    assert shape.memory == "hybrid" and shape.recurrent_bytes() > 0
    one = 512 * shape.kv_bytes_per_token("f16") + shape.recurrent_bytes()
    base = shape.weights_bytes + shape.compute_bytes()
    assert parallel_that_fits(shape, 512, "f16", "f16", base + 3 * one) == 3
    assert parallel_that_fits(shape, 512, "f16", "f16", base + 3 * one - 1) == 2
    with_snapshots = one + shape.recurrent_bytes(snapshots=4) - shape.recurrent_bytes()
    assert parallel_that_fits(shape, 512, "f16", "f16", base + 3 * one, snapshots=4) == 3 * one // with_snapshots
    budget = shape.memory_needed(512, "f16", flash_attn="on")
    assert choose_context(shape, None, ("f16", "f16"), "on", budget) == 512
    with pytest.raises(UsageError, match="recurrent state"):
        choose_context(shape, 1024, ("f16", "f16"), "on", budget)


def test_a_hybrid_offloads_its_state_with_its_layers(hybrid_shape: ModelInfo) -> None:
    """The GPU room a layer takes counts its share of the recurrent state."""
    state = hybrid_shape.recurrent_bytes()
    layer = hybrid_shape.layer_bytes + (512 * hybrid_shape.kv_bytes_per_token("f16") + state) // hybrid_shape.layers
    total = hybrid_shape.layers * layer + hybrid_shape.output_bytes + hybrid_shape.compute_bytes()
    assert place([CPU, gpu("CUDA0", total)], shape=hybrid_shape, need=512).model.whole
    short = place([CPU, gpu("CUDA0", total - state // 2)], shape=hybrid_shape, need=512).model
    assert not short.whole and short.n_gpu_layers < hybrid_shape.layers + 1
