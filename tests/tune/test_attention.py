"""Flash attention measured on a model's attention shape, where tune has not
measured the model: the probe runs on llama.cpp, its outcome is kept per
machine, shape and thread count, a busy machine's is not trusted, and the
run's settings take the mode measured faster."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from localrun.assemble import assemble
from localrun.gguf.info import describe
from localrun.gguf.reader import read_gguf
from localrun.settings import Options, resolve
from localrun.tune import apply as tuned
from localrun.tune import attention
from localrun.tune.attention import AttentionShape, Probed, load_probed, measured, probe, save_probed
from localrun.tune.machine import this_machine
from localrun.tune.wisdom import Attention

OFF_FASTER = Attention((256, 1024), off_ms=(0.2, 0.4), on_ms=(0.5, 1.2))  # 2.5-3x: attention alone
ON_FASTER = Attention((256, 1024), off_ms=(0.5, 0.9), on_ms=(0.3, 0.5))


@pytest.fixture(autouse=True)
def probing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(attention.ENV, "1")


class Counted:
    def __init__(self, curve: Attention | None) -> None:
        self.curve, self.calls = curve, 0
        self.told: list[bool] = []  # each call's verbose

    def __call__(self, shape: AttentionShape, threads: int, verbose: bool = False) -> Attention | None:
        self.calls += 1
        self.told.append(verbose)
        return self.curve


def test_the_probe_runs_on_llama_cpp_and_times_both_modes() -> None:
    """Heads whose size is not the stream's width over their count, as Qwen3's and Gemma's are."""
    shape = AttentionShape(heads=4, kv_heads=2, key_length=32, value_length=32)
    curve = probe(shape, 1, load=lambda: 0)
    assert curve is not None and curve.depths == attention.DEPTHS
    assert all(ms > 0 for ms in (*curve.off_ms, *curve.on_ms))
    assert curve.choice(512, max_gain=None) in ("off", "on", None)


def test_the_probe_runs_in_a_process_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """What `measured` runs by default: the probe's model never loads in the
    caller (a server), and its curve comes back whole (None only where the
    child found the machine busy, as the CI's other worker may make it)."""

    def not_here(*args: object, **kwargs: object) -> None:
        raise AssertionError("the probe's model loaded in the caller")

    monkeypatch.setattr(attention, "Weights", not_here)
    shape = AttentionShape(heads=4, kv_heads=2, key_length=32, value_length=32)
    curve = next((c for c in (attention.probe_apart(shape, 1) for _ in range(3)) if c is not None), None)
    assert curve is None or (curve.depths == attention.DEPTHS and all(ms > 0 for ms in (*curve.off_ms, *curve.on_ms)))


@pytest.mark.parametrize("verbose", [False, True])
def test_a_failed_probes_stderr_shows_only_under_verbose(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], verbose: bool
) -> None:
    """A child that fails (here: handed a shape it cannot read) costs the curve;
    what it wrote on stderr reaches the user's only with --verbose."""
    monkeypatch.setattr(attention, "_shape_list", lambda shape: [4, 2, 32])
    shape = AttentionShape(heads=4, kv_heads=2, key_length=32, value_length=32)
    assert attention.probe_apart(shape, 1, verbose) is None
    said = capfd.readouterr().err
    assert ("ValueError: not enough values to unpack" in said) is verbose


def test_the_probes_process_logs_llama_cpp_only_when_told() -> None:
    import subprocess
    import sys

    logs = []
    for extra in ([], ["-v"]):
        done = subprocess.run(
            [sys.executable, "-m", "localrun.tune.attention", "[4, 2, 32, 32]", "1", *extra],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        logs.append(done.stderr)
    quiet, told = logs
    assert "llama_context" not in quiet and "llama_context" in told  # llama.cpp's own lines, as a load logs them


def test_the_probes_process_answers_in_json() -> None:
    """`probe_apart`'s child, run as it runs it: a curve, or null where it found the machine busy."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "localrun.tune.attention", "[4, 2, 32, 32]", "1"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found is None or Attention.from_dict(found).depths == attention.DEPTHS


def test_a_busy_machine_decides_nothing() -> None:
    shape = AttentionShape(heads=4, kv_heads=2, key_length=32, value_length=32)
    waits: list[int] = []

    def busy() -> int:
        waits.append(1)
        return 3

    assert probe(shape, 1, load=busy) is None
    assert len(waits) == attention.WAIT_TRIES  # it waited for the others to pass, then gave up at once


def test_kept_per_machine_shape_and_threads(tiny_model: Path) -> None:
    shape = describe(read_gguf(tiny_model))
    run = Counted(OFF_FASTER)
    assert measured(shape, 2, run_probe=run) == OFF_FASTER and run.calls == 1
    assert measured(shape, 2, run_probe=run) == OFF_FASTER and run.calls == 1  # kept
    assert measured(shape, 1, run_probe=run) == OFF_FASTER and run.calls == 2  # another thread count
    kept = load_probed()
    assert sorted(p.threads for p in kept) == [1, 2] and kept[0].shape == AttentionShape.of(shape)


def test_a_spoilt_probe_is_not_tried_again_at_once(tiny_model: Path) -> None:
    shape = describe(read_gguf(tiny_model))
    busy = Counted(None)
    assert measured(shape, 2, run_probe=busy) is None and measured(shape, 2, run_probe=busy) is None
    assert busy.calls == 1
    [entry] = load_probed()
    save_probed([dataclasses.replace(entry, measured_at="2026-01-01T00:00:00+00:00")])  # long ago
    quiet = Counted(ON_FASTER)
    assert measured(shape, 2, run_probe=quiet) == ON_FASTER and quiet.calls == 1
    assert [p.curve for p in load_probed()] == [ON_FASTER]  # replaced, not added


def test_switched_off_or_a_damaged_file(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shape = describe(read_gguf(tiny_model))
    run = Counted(OFF_FASTER)
    attention.attention_file().parent.mkdir(parents=True, exist_ok=True)
    attention.attention_file().write_text("{not json")
    assert measured(shape, 2, run_probe=run) == OFF_FASTER  # a damaged file is none, and rewritten
    assert json.loads(attention.attention_file().read_text())["version"] == attention.VERSION
    monkeypatch.setenv(attention.ENV, "0")
    assert measured(shape, 4, run_probe=run) is None and run.calls == 1


def test_k_and_v_heads_of_two_sizes_are_not_probed() -> None:
    assert not AttentionShape(heads=16, kv_heads=1, key_length=192, value_length=128).probed
    assert AttentionShape(heads=9, kv_heads=3, key_length=64, value_length=64).probed


def test_the_run_takes_the_mode_measured_faster(tiny_model: Path) -> None:
    shape = describe(read_gguf(tiny_model))
    asked: list[int] = []

    def probed(threads: int) -> Attention:
        asked.append(threads)
        return OFF_FASTER

    settled = tuned.apply(resolve(Options()), shape, None, need=300, depth=500, attention=probed)
    assert settled.flash_attn == "off" and settled.sources["flash_attn"] == "wisdom"
    assert "attention shape" in settled.reasons["flash_attn"] and asked == [settled.threads]
    on = tuned.apply(resolve(Options()), shape, None, need=300, depth=500, attention=lambda _: ON_FASTER)
    assert on.flash_attn == "on"
    alike = Attention((256, 1024), off_ms=(0.5, 1.0), on_ms=(0.505, 1.01))
    tie = tuned.apply(resolve(Options()), shape, None, need=300, depth=500, attention=lambda _: alike)
    assert tie.flash_attn == "auto" and "alike" in tie.reasons["flash_attn"]


def test_what_the_user_says_and_a_quantized_v_are_never_probed(tiny_model: Path) -> None:
    shape = describe(read_gguf(tiny_model))

    def never(threads: int) -> Attention:
        raise AssertionError("probed")

    assert tuned.apply(resolve(Options(flash_attn="on")), shape, None, depth=500, attention=never).flash_attn == "on"
    quantized = tuned.apply(resolve(Options(kv="q8_0")), shape, None, depth=500, attention=never)
    assert quantized.flash_attn == "auto"


def test_assemble_probes_once_and_the_plan_carries_it(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = Counted(OFF_FASTER)
    monkeypatch.setattr(attention, "probe_apart", run)
    plan = assemble(tiny_model, resolve(Options()), verbose=True)
    assert plan.config.flash_attn == "off" and plan.settings.sources["flash_attn"] == "wisdom"
    assert run.told == [True]  # --verbose reaches the probe's process
    assert assemble(tiny_model, resolve(Options())).config.flash_attn == "off" and run.calls == 1
    benchmark = assemble(tiny_model, resolve(Options()), use_wisdom=False)  # llama.cpp's defaults, as asked
    assert benchmark.config.flash_attn == "auto" and run.calls == 1


def test_kept_outcomes_read_back() -> None:
    shape = AttentionShape(heads=4, kv_heads=2, key_length=32, value_length=32)
    entry = Probed(this_machine(), shape, 2, "2026-12-06T00:00:00+00:00", OFF_FASTER)
    save_probed([entry])
    assert load_probed() == [entry]
