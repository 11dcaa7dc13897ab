"""`localrun doctor` on the real CPU build, and on faked devices and GPUs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localrun import doctor
from localrun.runtime import devices
from localrun.runtime.devices import Device
from localrun.store.registry import Registry
from localrun.tune.machine import this_machine
from localrun.tune.wisdom import Decision, ModelKey, Wisdom, WisdomFile
from tests.helpers import cli

GIB = 2**30
CPU = Device("CPU", "Test CPU", "cpu", 8 * GIB, 16 * GIB)
H200 = Device("CUDA0", "NVIDIA H200", "gpu", 139 * GIB, 140 * GIB)


@pytest.fixture
def no_gpu_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor, "gpu_vendor", lambda: None)


def test_doctor_reports_the_cpu_build_as_json(no_gpu_here: None) -> None:
    res = cli("doctor", "--json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert set(report) == {"llama_cpp_python", "backends", "gpu_build", "devices", "default_model", "hint"}
    assert "CPU" in [b["name"] for b in report["backends"]]
    assert report["gpu_build"] is False and report["hint"] is None
    (cpu,) = report["devices"]
    assert cpu["name"] == "CPU" and cpu["kind"] == "cpu" and 0 < cpu["free_bytes"] <= cpu["total_bytes"]
    model = report["default_model"]
    assert model["path"] is None and model["placement"] is None  # nothing is pulled
    assert f"localrun pull {model['name']}" in model["note"]


def test_doctor_as_text(no_gpu_here: None) -> None:
    res = cli("doctor")
    assert res.returncode == 0, res.stderr
    assert "CPU build" in res.stdout and "not downloaded" in res.stdout and "hint" not in res.stdout


def test_the_default_model_is_placed_and_its_measured_speed_shown(tiny_model: Path, no_gpu_here: None) -> None:
    registry = Registry({}, default=str(tiny_model))
    unmeasured = doctor.examine(registry).model
    assert unmeasured.path == tiny_model and unmeasured.placement is not None and unmeasured.speed is None
    assert "localrun tune" in unmeasured.note
    wisdom = WisdomFile.load()
    wisdom.put(
        Wisdom(
            this_machine(),
            ModelKey.of(tiny_model),
            "f16/f16",
            "2026-12-05T00:00:00+00:00",
            threads=Decision(2, {"1": 4.0, "2": 2.0}, "ms/token"),
            n_ubatch=Decision(None, {"512": 0.5}, "ms/token"),
        )
    )
    wisdom.save()
    report = doctor.examine(registry)
    assert report.model.speed is not None
    assert report.model.speed.decode == pytest.approx(500.0) and report.model.speed.prompt == pytest.approx(2000.0)
    assert report.model.speed.batch is None
    shown = report.to_json()["default_model"]
    assert shown["placement"]["model"] == "CPU" and shown["speed"]["decode_tokens_per_s"] == pytest.approx(500.0)
    from localrun.ui.doctor import describe

    assert "decode 500.0, prompt 2000.0 tokens/s" in describe(report)
    runs_on = next(line for line in describe(report).splitlines() if "runs on" in line)
    assert runs_on.split() == ["runs", "on", "CPU:", "no", "GPU", "in", "this", "build", "or", "machine"]


def test_a_faked_gpu_is_listed_and_needs_no_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "probe", lambda: (CPU, H200))
    monkeypatch.setattr(doctor, "gpu_vendor", lambda: "nvidia")
    res = cli("doctor", "--json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert [d["name"] for d in report["devices"]] == ["CPU", "CUDA0"]
    assert report["devices"][1]["free_bytes"] == 139 * GIB
    assert report["gpu_build"] is True and report["hint"] is None
    text = cli("doctor").stdout
    assert "GPU build" in text and "CUDA0" in text and "NVIDIA H200" in text


@pytest.mark.parametrize(("vendor", "backend"), [("nvidia", "cuda"), ("amd", "rocm"), ("apple", "metal")])
def test_a_gpu_with_a_cpu_build_gets_one_hint(monkeypatch: pytest.MonkeyPatch, vendor: str, backend: str) -> None:
    monkeypatch.setattr(devices, "probe", lambda: (CPU,))
    monkeypatch.setattr(doctor, "gpu_vendor", lambda: vendor)
    report = json.loads(cli("doctor", "--json").stdout)
    assert f"LOCALRUN_BACKEND={backend} scripts/setup" in report["hint"]
    hints = [line for line in cli("doctor").stdout.splitlines() if line.startswith("hint:")]
    assert len(hints) == 1 and f"LOCALRUN_BACKEND={backend} scripts/setup" in hints[0]


def test_gpu_vendor_from_device_nodes_and_nvidia_smi(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    assert devices.gpu_vendor(root=tmp_path, run_smi=lambda: False) in (None, "apple")
    assert devices.gpu_vendor(root=tmp_path, run_smi=lambda: True) == "nvidia"
    (tmp_path / "dev" / "kfd").touch()
    assert devices.gpu_vendor(root=tmp_path, run_smi=lambda: False) == "amd"
    (tmp_path / "dev" / "nvidia0").touch()
    assert devices.gpu_vendor(root=tmp_path, run_smi=lambda: False) == "nvidia"


def test_system_info_names_each_backend_with_its_flags() -> None:
    text = "CUDA : ARCHS = 900 | USE_GRAPHS = 1 | PEER_MAX_BATCH_SIZE = 128 | CPU : SSE3 = 1 | AVX2 = 1 | "
    cuda, cpu = doctor.parse_system_info(text)
    assert cuda == doctor.Backend("CUDA", (("ARCHS", "900"), ("USE_GRAPHS", "1"), ("PEER_MAX_BATCH_SIZE", "128")))
    assert cpu == doctor.Backend("CPU", (("SSE3", "1"), ("AVX2", "1")))


def test_no_hint_when_the_build_has_a_gpu_backend_that_found_no_device() -> None:
    cuda = doctor.Backend("CUDA", (("ARCHS", "900"),))
    assert doctor.setup_hint("nvidia", (), (cuda, doctor.Backend("CPU"))) is None  # a driver problem, not the build
    assert doctor.setup_hint("nvidia", (), (doctor.Backend("CPU"),)) is not None
    assert doctor.setup_hint(None, (), ()) is None
