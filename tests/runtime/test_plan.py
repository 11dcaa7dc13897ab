"""One plan for the whole workload, on a fake GPU: the draft model, a batch,
several served models and where sampling runs, each planned before anything
loads, as the commands run them.

`FakeGpu` is the device seam of `test_placement.py` taken to the commands:
placement sees the GPU through `devices.probe`; a load placed on it loads on
the CPU, and llama.cpp's log then says what the GPU would hold (the layers
placed there, their share of each context's KV cache, the compute buffer),
as a real GPU's load logs it. Each test asks whether what was placed on the
GPU fits it."""

from __future__ import annotations

import ctypes
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
import pytest

from localrun.gguf.info import ModelInfo, describe
from localrun.gguf.reader import GGUFInfo, read_gguf
from localrun.runtime import devices, llama_log
from localrun.runtime import engine as engine_module
from localrun.runtime.devices import Device
from localrun.runtime.placement import GPU_RESERVE, ModelPlacement
from tests.helpers import cli
from tests.tinymodel import write_tiny_model

HOST = Device("CPU", "a CPU", "cpu", 8 * 2**30, 16 * 2**30)
MIB = 1024 * 1024


@dataclass(frozen=True)
class OnGpu:
    """One context as the fake GPU holds it: its model, the model's placement, and the bytes there."""

    path: Path
    placed: ModelPlacement
    n_ctx: int
    weights: int
    kv: int
    compute: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute


def _key(handle: Any) -> int | None:
    return ctypes.cast(handle, ctypes.c_void_p).value


class FakeGpu:
    """A GPU with ``room`` bytes free beyond placement's reserve, that is not there."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, room: int) -> None:
        self.room = room
        self.device = Device("CUDA0", "a fake GPU", "gpu", GPU_RESERVE + room, GPU_RESERVE + room + 2**30)
        self.loads: list[tuple[Path, ModelPlacement]] = []
        self.contexts: list[OnGpu] = []
        self._models: dict[int | None, tuple[ModelInfo, ModelPlacement]] = {}
        real_load = engine_module._load_model
        real_context = llama_cpp.llama_init_from_model

        def load(info: GGUFInfo, placed: ModelPlacement, *, mtp: bool = False) -> object:
            self.loads.append((info.path, placed))
            handle = real_load(info, ModelPlacement(repack=placed.repack, layers=placed.layers), mtp=mtp)  # on the CPU
            shape = describe(info)
            self._models[_key(handle)] = (shape, placed)
            if placed.offloaded:
                self._log(
                    f"load_tensors:        CUDA0 model buffer size = {self._weights(shape, placed) / MIB:.2f} MiB"
                )
            return handle

        def context(model: Any, cparams: Any) -> Any:
            ctx = real_context(model, cparams)
            shape, placed = self._models[_key(model)]
            if placed.offloaded and ctx:
                on_gpu = min(placed.n_gpu_layers, shape.layers)
                kv = cparams.n_ctx * shape.kv_bytes_per_token("f16") * on_gpu // shape.layers
                held = OnGpu(shape.path, placed, cparams.n_ctx, self._weights(shape, placed), kv, shape.compute_bytes())
                self.contexts.append(held)
                self._log(f"llama_kv_cache:      CUDA0 KV buffer size = {held.kv / MIB:.2f} MiB")
                self._log(f"sched_reserve:      CUDA0 compute buffer size = {held.compute / MIB:.2f} MiB")
            return ctx

        monkeypatch.setattr(engine_module, "_load_model", load)
        monkeypatch.setattr(llama_cpp, "llama_init_from_model", context)
        monkeypatch.setattr(devices, "probe", lambda: (HOST, self.device))

    @staticmethod
    def _weights(shape: ModelInfo, placed: ModelPlacement) -> int:
        layers = min(placed.n_gpu_layers, shape.layers)
        return layers * shape.layer_bytes + (shape.output_bytes if placed.n_gpu_layers > shape.layers else 0)

    @staticmethod
    def _log(line: str) -> None:
        llama_log._on_log(2, (line + "\n").encode(), ctypes.c_void_p(0))

    def placed(self, path: Path) -> ModelPlacement:
        """How the last load of ``path`` was placed."""
        return next(placed for loaded, placed in reversed(self.loads) if loaded == path)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A target and a draft model with one tokenizer."""
    folder = tmp_path_factory.mktemp("pair")
    return write_tiny_model(folder / "target.gguf"), write_tiny_model(folder / "draft.gguf")


def whole(shape: ModelInfo, tokens: int) -> int:
    """What every layer of ``shape`` and ``tokens`` of f16 KV take on a GPU, with the compute buffer."""
    return shape.weights_bytes + tokens * shape.kv_bytes_per_token("f16") + shape.compute_bytes()


def test_a_draft_model_named_on_the_command_line_is_placed_beside_its_target(
    pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--draft-model: the draft goes on the GPU with its target, not on the CPU beside it."""
    target, draft = pair
    gpu = FakeGpu(monkeypatch, 2**30)
    res = cli("generate", "-m", str(target), "--draft-model", str(draft), "-n", "4", "--json", "hi")
    assert res.returncode == 0, res.stderr
    assert gpu.placed(target).whole
    assert gpu.placed(draft).whole and gpu.placed(draft).devices == ("CUDA0",)
    done = json.loads(res.stdout.splitlines()[-1])
    assert "CUDA0" in done["settings"]["placement"]["value"]


def test_a_matched_draft_pulled_by_draft_is_placed_beside_its_target(
    pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--draft with the matched draft not on disk yet: it is fetched before
    the run is planned, and placed on the GPU with its target."""
    from localrun import speculative, store

    target, draft = pair
    gpu = FakeGpu(monkeypatch, 2**30)
    monkeypatch.setattr(store, "matched_draft", lambda found, registry: None)  # not downloaded yet
    monkeypatch.setattr(store, "draft_target", lambda found, registry: store.parse(str(draft), registry))
    opened: list[tuple[Path | None, ModelPlacement]] = []
    real = speculative.open_speculation

    def spy(engine: Any, choice: str, path: Path | None = None, **kw: Any) -> Any:
        opened.append((path, engine.placement.draft))  # the draft's share of the plan its drafter loads on
        return real(engine, choice, path, **kw)

    monkeypatch.setattr(speculative, "open_speculation", spy)
    res = cli("generate", "-m", str(target), "--draft", "-n", "4", "hi")
    assert res.returncode == 0, res.stderr
    assert gpu.placed(target).whole
    [(path, placed)] = opened
    assert path == draft and placed.whole and placed.devices == ("CUDA0",)


def test_a_batch_on_a_partial_offload_fits_the_layers_planned_for_it(
    long_model: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """--batch: the layers are placed for the batch's sequences, not for a
    default context that the sequences then outgrow on the GPU."""
    shape = describe(read_gguf(long_model))
    per_layer = shape.layer_bytes + 4096 * shape.kv_bytes_per_token("f16") // shape.layers
    room = shape.compute_bytes() + per_layer * 3 // 2  # one layer, for a default context of 4096 tokens
    gpu = FakeGpu(monkeypatch, room)
    lines = tmp_path / "prompts.txt"
    lines.write_text("".join("a" * 2100 + f" {i}\n" for i in range(4)))  # four sequences of over 2,048 tokens
    res = cli("generate", "-m", str(long_model), "--batch", str(lines), "-n", "2", "--temperature", "0")
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.splitlines()) == 4
    assert gpu.contexts or not gpu.placed(long_model).offloaded
    for held in gpu.contexts:  # the batch's context, on the layers placed for it
        assert held.total <= room, f"{held.n_ctx} tokens on {held.placed.n_gpu_layers} layers overflow the GPU"


def test_served_models_share_the_gpu(pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """serve with two models: the second is placed in what the first left of
    the GPU (as llama.cpp logs what the first holds), not on an empty GPU."""
    from localrun.cli.serve import _plans
    from localrun.serve.served import load_models
    from localrun.settings import Options

    target, other = pair
    shape = describe(read_gguf(target))
    room = whole(shape, 4 * 512) * 3 // 2  # one model with four slots of 512 tokens, not two
    gpu = FakeGpu(monkeypatch, room)
    plans = _plans([str(target), str(other)], Options(draft="none"), offline=True, verbose=False, queue=1)
    models = load_models(plans)
    try:
        assert len(models) == 2 and sum(held.total for held in gpu.contexts) <= room  # both at once
        assert gpu.placed(target).whole and not gpu.placed(other).whole  # the first holds most of the GPU
    finally:
        for model in models:
            model.close()


def test_sampling_is_reported_where_the_loop_samples(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A default generate runs the speculative loop, which samples on the
    host: the run says host, not the device that holds the output layer;
    with --spec none, plain decoding samples on the device, and says so."""
    FakeGpu(monkeypatch, 2**30)

    def sample_on(*args: str) -> dict[str, str]:
        res = cli("generate", "-m", str(tiny_model), "-n", "2", "--json", *args, "hi")
        assert res.returncode in (0, 9), res.stderr  # 9: two tokens do not finish a schema's JSON
        return dict(json.loads(res.stdout.splitlines()[-1])["settings"]["sample_on"])

    default = sample_on()
    assert default["value"] == "host" and "speculative" in default["why"]
    assert sample_on("--spec", "none")["value"] == "device"
    assert sample_on("--spec", "none", "--schema", "name")["value"] == "host"  # a grammar masks on the host
    assert sample_on("--sample-on", "device")["value"] == "host"  # asked, but the speculative loop samples there


@pytest.mark.parametrize(
    ("workload", "asked", "where"),
    [
        ("plain", "auto", "device"),
        ("plain", "host", "host"),
        ("speculative", "auto", "host"),
        ("speculative", "device", "host"),
        ("constrained", "auto", "host"),
        ("batch", "auto", "host"),
        ("batch", "device", "device"),
        ("slots", "auto", "host"),
        ("slots", "device", "device"),
        ("drafting slots", "device", "host"),
    ],
)
def test_every_loop_says_where_it_samples(tiny_model: Path, workload: str, asked: str, where: str) -> None:
    """With the whole model on a GPU, plain decoding samples on the device on
    auto; the batch scheduler (--batch, serve --spec none) only where asked;
    a loop that reads the logits on the host (speculation, a grammar) samples
    there whatever was asked, and the plan says why."""
    from localrun.assemble import OneSequence, Prompts, Slots, Workload, assemble
    from localrun.settings import Options, resolve

    shapes: dict[str, Workload] = {
        "plain": OneSequence(),
        "speculative": OneSequence(speculative=True),
        "constrained": OneSequence(constrained=True),
        "batch": Prompts((300, 300)),
        "slots": Slots(),
        "drafting slots": Slots(speculative=True),
    }
    on_gpu = (HOST, Device("CUDA0", "a GPU", "gpu", GPU_RESERVE + 2**30, GPU_RESERVE + 2**31))
    run = assemble(
        tiny_model, resolve(Options(sample_on=asked)), workload=shapes[workload], devices=on_gpu, use_wisdom=False
    )
    assert run.placement.model.whole
    assert run.config.sample_on == run.settings.sample_on == where
    if where != asked:
        assert run.settings.reasons["sample_on"]


def test_a_server_samples_on_the_gpu_only_where_asked_and_its_slots_do_not_draft(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """serve's slots draft by prompt lookup by default, checked on the host,
    so they sample there even where --sample-on device asks; with --spec
    none they sample in llama.cpp's graph where asked, and on the host on auto."""
    from localrun.cli.serve import _plans
    from localrun.settings import Options

    FakeGpu(monkeypatch, 2**30)
    where = {}
    for spec, asked in (("lookup", "device"), ("none", "device"), ("none", None)):
        options = Options(draft="none", sample_on=asked)
        [plan] = _plans([str(tiny_model)], options, offline=True, verbose=False, queue=1, spec=spec)
        assert plan.run.placement.model.whole
        where[spec, asked] = (plan.run.config.sample_on, plan.run.settings.reasons.get("sample_on", ""))
    assert where["lookup", "device"][0] == "host" and "lookup" in where["lookup", "device"][1]
    assert where["none", "device"][0] == "device"
    assert where["none", None][0] == "host" and "--sample-on device" in where["none", None][1]


def test_a_bench_batching_row_on_a_partial_offload_fits_the_layers_planned_for_it(
    long_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`localrun bench`'s batching rows are planned as --batch is: the layers
    placed for the sequences the row runs, not for the bench's own context."""
    from localrun.bench.harness import Bench, Plan

    shape = describe(read_gguf(long_model))
    per_layer = shape.layer_bytes + 4096 * shape.kv_bytes_per_token("f16") // shape.layers
    room = shape.compute_bytes() + per_layer * 3 // 2  # one layer, for a context of 4096 tokens
    gpu = FakeGpu(monkeypatch, room)
    plan = Plan.make(True, prompts=("a" * 2100,), max_tokens=2, warmup_tokens=1)
    bench = Bench(long_model, plan)
    try:
        measured = bench.batched(4)  # four sequences of over 2,048 tokens each
    finally:
        bench.close()
    assert measured.decode_tokens_per_s > 0
    batches = [held for held in gpu.contexts if held.n_ctx >= 4 * 2100]
    assert batches or not gpu.placed(long_model).offloaded
    for held in batches:  # the batch's context, on the layers placed for it
        assert held.total <= room, f"{held.n_ctx} tokens on {held.placed.n_gpu_layers} layers overflow the GPU"


def test_a_chat_turn_says_where_the_loop_it_runs_samples(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """chat planned for plain decoding on a GPU samples there; a turn that
    /draft or /schema moves to another loop samples on the host, and its
    record says so, not what the plan said for the first turn."""
    import io

    from rich.console import Console

    from localrun.assemble import assemble, report
    from localrun.cli.chat import turn_report
    from localrun.cli.repl import Repl
    from localrun.history.record import Recorder, RunContext
    from localrun.runtime.chat import ChatSession
    from localrun.runtime.engine import Engine
    from localrun.runtime.sampling import SamplingParams
    from localrun.settings import Options, resolve
    from localrun.speculative import open_speculation
    from tests.tinymodel import CHATML

    FakeGpu(monkeypatch, 2**30)
    run = assemble(tiny_model, resolve(Options(draft="none")), use_wisdom=False)  # chat --spec none
    assert run.placement.model.whole and run.settings.sample_on == "device"
    recorder = Recorder(RunContext("chat", settings=report(run.settings, run.placement)), warn=lambda _: None)
    monkeypatch.setattr(recorder, "flush", lambda exit_status=None: None)  # the records stay pending here
    with Engine(run.config) as engine:
        session = ChatSession(engine, CHATML, SamplingParams(temperature=0.0), max_tokens=2)
        session.speculation = open_speculation(engine, "lookup")
        session.use_draft = False
        repl = Repl(
            session,
            Console(file=io.StringIO(), width=200),
            history=tmp_path / "h",
            recorder=recorder,
            report=lambda: turn_report(run.settings, run.placement, session),
        )
        for command in ("", "/draft on", "/draft off", "/schema name", "/schema off"):
            if command:
                assert repl._command(command) is True
            repl._turn("hi")
        assert session.speculation is not None
        session.speculation.close()
    where = [json.loads(row["settings"])["sample_on"]["value"] for row in recorder.pending]
    assert where == ["device", "host", "device", "host", "device"]
