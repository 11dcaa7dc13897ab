"""`localrun tune` on a tiny model: it measures, keeps wisdom, and `generate`
then runs with it (visible in the --json done event's settings)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from localrun.cli.serve import _plans as serve_plans
from localrun.settings import Options
from localrun.tune.machine import this_machine
from localrun.tune.measure import MAX_ROWS, Tuner
from localrun.tune.wisdom import Attention, Decision, ModelKey, Wisdom, WisdomFile
from tests.helpers import cli

pytestmark = pytest.mark.usefixtures("quiet")  # the machine reads idle: other tests' processes do not count


def _done(stdout: str) -> dict[str, object]:
    events = [json.loads(line) for line in stdout.splitlines()]
    assert events[-1]["type"] == "done"
    done: dict[str, object] = events[-1]
    return done


@pytest.mark.slow
def test_tune_keeps_wisdom_that_generate_uses(wide_model: Path) -> None:
    tuned = cli("tune", str(wide_model), "--seconds", "6", "--json")
    assert tuned.returncode == 0, tuned.stderr
    measured = json.loads(tuned.stdout)
    assert len(measured["verify_ms"]) == MAX_ROWS and all(ms > 0 for ms in measured["verify_ms"])
    assert set(measured["flash_attn"]) == {"depths", "off_ms", "on_ms", "noise"}
    assert measured["threads"]["figures"] and measured["parallel"]["figures"]
    assert set(measured["kv_cost"]["figures"]) == {"f16/f16", "q8_0/q8_0", "q8_0/q4_0"}
    # every KV and flash-attention setting raced together, a prompt rate beside each decode rate
    rates = measured["rates"]
    kinds = {"f16/f16 fa off", "f16/f16 fa on", "q8_0/q8_0 fa on", "q8_0/q4_0 fa on"}
    assert set(rates["fill_tps"]) == set(rates["decode_ms"]) == kinds
    assert len(rates["fill_depths"]) == 2 and rates["fill_depths"][0] < rates["fill_depths"][1]
    assert all(len(v) == 2 and min(v) > 0 for v in rates["fill_tps"].values())
    assert all(len(v) == len(rates["decode_depths"]) and min(v) > 0 for v in rates["decode_ms"].values())

    shown = cli("tune", "--show", "--json", str(wide_model))
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["entries"] == [measured]
    text = cli("tune", "--show", str(wide_model))
    assert "verify batch" in text.stdout and "threads" in text.stdout

    res = cli("generate", "-m", str(wide_model), "-n", "4", "--temperature", "0", "--spec", "none", "--json", "hi")
    assert res.returncode == 0, res.stderr
    settings = _done(res.stdout)["settings"]
    assert isinstance(settings, dict)
    for name in ("threads", "n_ubatch"):
        value = measured[name]["value"]
        if value is not None:  # a decision, not a tie: the run uses it, and says so
            assert settings[name] == {"value": value, "source": "wisdom"}
        else:
            assert settings[name]["source"] == "default"
    # f16 fits; a quantized cache only where the rates predicted it faster for this run beyond the tie margin
    kv = f"{settings['type_k']['value']}/{settings['type_v']['value']}"
    assert "localrun tune's rates" in settings["type_k"]["why"], settings
    assert kv == "f16/f16" or "as fast as f16/f16" in settings["type_k"]["why"], settings


def test_generate_follows_hand_written_wisdom(wide_model: Path) -> None:
    wisdom = Wisdom(
        machine=this_machine(),
        model=ModelKey.of(wide_model),
        kv="f16/f16",
        measured_at="2026-12-03T00:00:00+00:00",
        threads=Decision(1, {"2": 30.0, "1": 10.0}, "ms/token"),
        n_ubatch=Decision(128, {"128": 1.0, "512": 2.0}, "ms/token"),
        flash_attn=Attention((32, 512), off_ms=(5.0, 6.0), on_ms=(8.0, 9.0)),
        parallel=Decision(2, {"1": 5.0, "2": 3.0}, "ms/token"),
    )
    f = WisdomFile.load()
    f.put(wisdom)
    f.save()
    res = cli("generate", "-m", str(wide_model), "-n", "4", "--temperature", "0", "--json", "hi")
    assert res.returncode == 0, res.stderr
    done = _done(res.stdout)
    settings = done["settings"]
    assert isinstance(settings, dict)
    assert settings["threads"] == {"value": 1, "source": "wisdom"}
    assert settings["n_ubatch"] == {"value": 128, "source": "wisdom"}
    assert settings["flash_attn"]["value"] == "off" and settings["flash_attn"]["source"] == "wisdom"
    assert done["threads"] == 1
    # an option wins, and is kept fixed
    pinned = cli("generate", "-m", str(wide_model), "-n", "4", "--threads", "2", "--flash-attn", "on", "--json", "hi")
    settings = _done(pinned.stdout)["settings"]
    assert isinstance(settings, dict)
    assert settings["threads"] == {"value": 2, "source": "option"}
    assert settings["flash_attn"] == {"value": "on", "source": "option"}

    # the same file from another machine decides nothing, and says why
    foreign = WisdomFile.load()
    foreign.entries = [dataclasses.replace(wisdom, machine=dataclasses.replace(this_machine(), cpu="Elsewhere"))]
    foreign.save()
    res = cli("generate", "-m", str(wide_model), "-n", "4", "--json", "hi")
    assert res.returncode == 0 and "another machine" in res.stderr and "Elsewhere" in res.stderr
    settings = _done(res.stdout)["settings"]
    assert isinstance(settings, dict) and settings["threads"]["source"] == "default"


def test_batch_takes_the_tuned_parallel_count(wide_model: Path, tmp_path: Path) -> None:
    f = WisdomFile.load()
    f.put(
        Wisdom(
            this_machine(),
            ModelKey.of(wide_model),
            "f16/f16",
            "2026-12-03T00:00:00+00:00",
            parallel=Decision(3, {"1": 5.0, "3": 2.0}, "ms/token"),
        )
    )
    f.save()
    src = tmp_path / "in.txt"
    src.write_text("".join(f"prompt {i}\n" for i in range(6)))
    res = cli("generate", "-m", str(wide_model), "--batch", str(src), "-n", "3", "--stats")
    assert res.returncode == 0, res.stderr
    assert "3 at a time" in res.stderr, res.stderr


def test_conversations_choose_flash_attention_for_their_depth(wide_model: Path) -> None:
    """Where tune measured flash attention faster shallow and slower deep, a
    short `generate` takes it on, while a chat and a server, whose
    conversations grow toward their context, take it off."""
    f = WisdomFile.load()
    curve = Attention((32, 512), off_ms=(10.0, 11.0), on_ms=(8.0, 12.0))
    f.put(Wisdom(this_machine(), ModelKey.of(wide_model), "f16/f16", "2026-12-03T00:00:00+00:00", flash_attn=curve))
    f.save()
    short = cli("generate", "-m", str(wide_model), "-n", "2", "-t", "0", "--spec", "none", "--json", "hi")
    assert short.returncode == 0, short.stderr
    settings = _done(short.stdout)["settings"]
    assert isinstance(settings, dict) and settings["flash_attn"]["value"] == "on", settings
    chat = cli("chat", "-m", str(wide_model), "-n", "2", "-t", "0", "--json", input="hi\n")
    assert chat.returncode == 0, chat.stderr
    settings = _done(chat.stdout)["settings"]
    assert isinstance(settings, dict) and settings["flash_attn"]["value"] == "off", settings
    assert "at depth 2048" in settings["flash_attn"]["why"]
    # the server's plan, and the small context it is given
    plans = serve_plans([str(wide_model)], Options(ctx="512"), offline=True, verbose=False, queue=4)
    assert plans[0].config.flash_attn == "on"  # a 512-token slot stays shallow: depth 256
    plans = serve_plans([str(wide_model)], Options(), offline=True, verbose=False, queue=4)
    assert plans[0].config.flash_attn == "off"


def test_tune_refuses_a_bad_kv_type(wide_model: Path) -> None:
    res = cli("tune", str(wide_model), "--kv", "q5_1")
    assert res.returncode == 2 and "q5_1" in res.stderr


@pytest.mark.slow
def test_tune_on_a_busy_machine_keeps_every_phase_as_not_measured(wide_model: Path) -> None:
    """Another process runnable at every reading: each phase is measured, then
    kept as not measured, and the wisdom decides nothing."""
    reads: list[int] = []

    def busy() -> int:
        reads.append(1)
        return 1

    wisdom = Tuner(wide_model, seconds=3, load=busy).run()
    assert set(wisdom.unmeasured) == {"threads", "verify", "parallel", "ubatch", "depth"}
    assert all("machine busy" in why for why in wisdom.unmeasured.values())
    assert (wisdom.threads, wisdom.parallel, wisdom.n_ubatch, wisdom.flash_attn, wisdom.kv_cost) == (None,) * 5
    assert wisdom.rates is None
    assert wisdom.verify_ms == () and len(reads) >= 10
    quiet = Tuner(wide_model, seconds=3, load=lambda: 0).run()
    assert not quiet.unmeasured and quiet.verify_ms and quiet.rates is not None


def test_a_model_on_a_gpu_is_tuned_over_a_gpus_ranges(wide_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from localrun.runtime import devices
    from localrun.runtime.placement import GPU_RESERVE
    from localrun.tune.measure import CPU_RANGES, GPU_RANGES

    cpu = devices.Device("CPU", "a CPU", "cpu", 8 * 2**30, 16 * 2**30)
    assert Tuner(wide_model).ranges == CPU_RANGES  # this build: the CPU
    monkeypatch.setattr(
        devices, "probe", lambda: (cpu, devices.Device("CUDA0", "a GPU", "gpu", 2 * GPU_RESERVE, 2**36))
    )
    on_gpu = Tuner(wide_model)
    assert on_gpu.placement.model.whole and on_gpu.ranges == GPU_RANGES and not on_gpu.ranges.threads
    assert on_gpu.ranges.max_rows == 64 and max(on_gpu.ranges.parallel) == 128 and max(on_gpu.ranges.ubatch) == 2048


def test_wisdom_is_keyed_by_the_gpus_too() -> None:
    from localrun.tune.machine import Machine

    here = this_machine()
    raw = here.as_dict()
    del raw["device"]  # wisdom written before GPUs were known
    assert Machine.from_dict(raw).device == "CPU"
    elsewhere = dataclasses.replace(here, device="CUDA0 NVIDIA H200 140 GiB")
    assert elsewhere != here and "CUDA0 NVIDIA H200" in elsewhere.describe()
