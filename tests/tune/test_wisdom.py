"""Wisdom: kept, read back, ignored when it is not this machine's, and the
decisions it makes (hand-written figures, no clock)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from localrun.gguf.info import describe
from localrun.gguf.reader import read_gguf
from localrun.runtime.placement import choose_kv
from localrun.settings import Options, resolve
from localrun.system import physical_cores
from localrun.tune import apply as tuned
from localrun.tune.machine import Machine, this_machine
from localrun.tune.measure import _decision
from localrun.tune.race import Race, separated, settled_tie
from localrun.tune.wisdom import MAX_GAIN, TIE_MARGIN, Attention, Decision, ModelKey, Wisdom, WisdomFile, wisdom_file
from localrun.ui.tune import describe as describe_wisdom


def _wisdom(model: Path, machine: Machine | None = None, kv: str = "f16/f16") -> Wisdom:
    return Wisdom(
        machine=machine or this_machine(),
        model=ModelKey.of(model),
        kv=kv,
        measured_at="2026-12-03T00:00:00+00:00",
        seconds=12.0,
        threads=Decision(1, {"2": 40.0, "1": 20.0}, "ms/token"),
        n_ubatch=Decision(None, {"64": 1.0, "128": 0.99}, "ms/token", note="tie: 64, 128"),
        flash_attn=Attention((32, 1024), off_ms=(10.0, 20.0), on_ms=(11.0, 13.0)),
        verify_ms=(10.0, 16.0, 21.0, 27.0, 34.0, 42.0, 50.0, 59.0, 60.0),
        parallel=Decision(8, {"1": 10.0, "4": 5.0, "8": 3.0}, "ms/token"),
        kv_cost=Decision(None, {"f16/f16": 13.0, "q8_0/q8_0": 13.1, "q8_0/q4_0": 15.0}, "ms/token"),
        kv_depth=1024,
    )


def test_round_trip(tiny_model: Path) -> None:
    w = _wisdom(tiny_model)
    f = WisdomFile.load()
    f.put(w)
    f.put(w)  # the same key replaces, never duplicates
    path = f.save()
    assert path == wisdom_file()
    again = WisdomFile.load()
    assert again.problems == []
    assert again.entries == [w]
    assert again.find(ModelKey.of(tiny_model)) == w
    assert again.find(ModelKey.of(tiny_model), "q8_0/q8_0") is None
    assert w.verify_curve is not None and w.verify_curve[0] == 1.0 and w.verify_curve[7] == pytest.approx(5.9)


@pytest.mark.parametrize("content", ["{not json", '{"version": 99, "entries": []}', "[1, 2]", "\udcff"])
def test_a_corrupt_file_is_ignored_with_a_warning(content: str) -> None:
    path = wisdom_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode("utf-8", "surrogateescape"))
    found = WisdomFile.load()
    assert found.entries == [] and len(found.problems) == 1


def test_a_bad_entry_is_skipped_and_the_rest_kept(tiny_model: Path) -> None:
    good = _wisdom(tiny_model).as_dict()
    path = wisdom_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": 1, "entries": [{"model": 3}, good]}))
    found = WisdomFile.load()
    assert len(found.entries) == 1 and "entry 1" in found.problems[0]


def test_another_machines_wisdom_is_ignored_with_a_warning(tiny_model: Path) -> None:
    other = dataclasses.replace(this_machine(), cpu="Some Other CPU", flags="0" * 16)
    f = WisdomFile.load()
    f.put(_wisdom(tiny_model, machine=other))
    f.save()
    found = tuned.find(tiny_model)
    assert found.wisdom is None
    assert any("another machine" in w and "Some Other CPU" in w for w in found.warnings)


def test_the_hint_to_tune_is_given_once_per_model(tiny_model: Path) -> None:
    first = tuned.find(tiny_model)
    assert first.wisdom is None and first.hint is not None and "localrun tune" in first.hint
    assert tuned.find(tiny_model).hint is None


def test_decisions_from_hand_written_wisdom(tiny_model: Path) -> None:
    w = _wisdom(tiny_model)
    shape = describe(read_gguf(tiny_model))
    base = resolve(Options())
    assert base.type_k == "auto" and base.threads is None
    settled = tuned.apply(base, shape, w, need=300, depth=40)
    assert (settled.threads, settled.parallel, settled.n_ubatch) == (1, 8, None)
    assert settled.sources["threads"] == "wisdom" and settled.sources["parallel"] == "wisdom"
    assert settled.flash_attn == "off"  # at depth 40 the unfused line is below
    assert tuned.apply(base, shape, w, need=300, depth=1000).flash_attn == "on"  # and beyond the crossover not
    assert w.flash_attn is not None and w.flash_attn.crossover is not None and 32 < w.flash_attn.crossover < 1024
    assert (settled.type_k, settled.type_v) == ("f16", "f16") and "fit at f16" in settled.reasons["kv"]
    # what the user says wins over the wisdom
    pinned = tuned.apply(resolve(Options(threads=2, flash_attn="on", parallel=3)), shape, w, need=300)
    assert (pinned.threads, pinned.flash_attn, pinned.parallel) == (2, "on", 3)
    assert pinned.sources["threads"] == "option"


def test_without_wisdom_llama_cpps_defaults_stay(tiny_model: Path) -> None:
    shape = describe(read_gguf(tiny_model))
    settled = tuned.apply(resolve(Options()), shape, None, need=300, depth=40)
    assert (settled.parallel, settled.n_ubatch, settled.flash_attn) == (None, None, "auto")
    assert settled.threads == physical_cores() and settled.sources["threads"] == "default"
    assert "wisdom" not in settled.sources.values()


def test_a_tie_keeps_the_default(tiny_model: Path) -> None:
    w = dataclasses.replace(
        _wisdom(tiny_model),
        threads=Decision(None, {"2": 20.0, "1": 20.1}, "ms/token", note="tie"),
        flash_attn=Attention((32, 1024), off_ms=(10.0, 12.0), on_ms=(10.1, 12.1)),
    )
    settled = tuned.apply(resolve(Options()), describe(read_gguf(tiny_model)), w, need=300, depth=500)
    assert settled.threads == physical_cores() and settled.flash_attn == "auto"
    assert "alike" in settled.reasons["flash_attn"]
    # 5% apart decides when the measurements spread less, and is a tie when they spread more
    apart = Attention((32, 1024), off_ms=(10.0, 10.5), on_ms=(10.5, 11.0))
    assert apart.choice(500) == "off" and dataclasses.replace(apart, noise=0.08).choice(500) is None


def test_kv_auto_quantizes_only_when_f16_does_not_fit(wide_model: Path) -> None:
    shape = describe(read_gguf(wide_model))
    need = 4096
    at = {kv: shape.memory_needed(need, *kv) for kv in (("f16", "f16"), ("q8_0", "q8_0"), ("q8_0", "q4_0"))}
    assert choose_kv(shape, need, at["f16", "f16"] + 1).type_k == "f16"
    q8 = choose_kv(shape, need, at["q8_0", "q8_0"] + 1)
    assert (q8.type_k, q8.type_v) == ("q8_0", "q8_0") and "do not fit at f16" in q8.reason
    assert (choose_kv(shape, need, at["q8_0", "q4_0"] + 1).type_v) == "q4_0"
    # a quantized cache measured faster here is taken where it fits too; a tie is not
    faster = choose_kv(shape, need, 0, {"f16/f16": 20.0, "q8_0/q8_0": 15.0}, TIE_MARGIN)
    assert faster.type_k == "q8_0" and "localrun tune" in faster.reason
    assert choose_kv(shape, need, 0, {"f16/f16": 20.0, "q8_0/q8_0": 19.9}, TIE_MARGIN).type_k == "f16"


def test_the_race_separates_beyond_noise_and_calls_a_tie() -> None:
    assert separated([1.0, 1.01, 0.99, 1.0], [1.2, 1.21, 1.19, 1.2])
    assert not separated([1.0, 1.01, 0.99, 1.0], [1.01, 1.0, 0.99, 1.02])
    assert not separated([1.0, 1.3, 0.8, 1.0], [1.2, 0.9, 1.4, 1.1])  # noisy: medians differ, quartiles overlap
    assert settled_tie([1.0, 1.001, 0.999], [1.002, 1.0, 1.001])
    figures = {"a": [1.0, 1.0, 1.01, 1.0], "b": [1.5, 1.52, 1.49, 1.5], "c": [1.0, 1.01, 1.0, 1.0]}
    calls: list[str] = []

    def sample(name: str) -> float:
        calls.append(name)
        return figures[name][sum(1 for c in calls if c == name) - 1]

    race = Race(["a", "b", "c"]).run(sample, min_rounds=3, max_rounds=4)
    assert race.best in ("a", "c") and set(race.tied()) == {"a", "c"}
    assert race.choice("c") == "c" and race.choice("b") in ("a", "c")
    assert calls[:3] == ["a", "b", "c"] and calls[3:6] == ["b", "c", "a"]  # rotating order


# -- nothing learnt from noise --


def _race(samples: dict[int, list[float]]) -> Race[int]:
    return Race(list(samples), {k: list(v) for k, v in samples.items()})


def test_samples_that_scatter_too_far_decide_nothing() -> None:
    """Hand-written samples of a loaded machine: the medians differ 2x, but each
    candidate's samples scatter over a range wider than the difference."""
    noisy = _race({2: [40.0, 9.0, 120.0, 35.0, 60.0], 1: [20.0, 70.0, 12.0, 25.0, 18.0]})
    decision = _decision(noisy, 2, "ms/token")
    assert decision.value is None and "too noisy" in decision.note
    calm = _race({2: [40.0, 41.0, 40.5, 39.8, 40.2], 1: [20.0, 20.5, 19.9, 20.2, 20.1]})
    assert _decision(calm, 2, "ms/token").value == 1  # the same medians, measured quietly: a decision


def test_a_gain_no_setting_gives_is_a_red_flag() -> None:
    """The KV cache 5x faster quantized (the default's samples were taken while
    another process ran): not taken. Where a gain that large is plausible (no
    max_gain: sequences decoded together), it stands."""
    five_x = _race({0: [391.0, 392.0, 390.0, 391.5], 1: [72.0, 72.5, 71.8, 72.1]})
    decision = _decision(five_x, 0, "ms/token", max_gain=MAX_GAIN)
    assert decision.value is None and "5.4x" in decision.note
    assert _decision(five_x, 0, "ms/token").value == 1


def test_a_busy_run_changes_no_default_and_keeps_the_idle_figures(tiny_model: Path) -> None:
    idle = _wisdom(tiny_model)
    busy = dataclasses.replace(
        idle,
        measured_at="2026-12-04T00:00:00+00:00",
        threads=None,
        flash_attn=None,
        kv_cost=None,
        kv_depth=0,
        verify_ms=(10.0, 130.0),
        unmeasured={"threads": "machine busy", "depth": "machine busy"},
    )
    wisdom = WisdomFile(wisdom_file())
    wisdom.put(idle)
    kept = wisdom.put(busy)
    assert kept.threads == idle.threads and kept.flash_attn == idle.flash_attn and kept.kv_depth == 1024
    assert kept.verify_ms == busy.verify_ms  # a phase the busy run measured quietly is taken
    assert not kept.unmeasured and wisdom.entries == [kept]
    wisdom.save()
    assert WisdomFile.load().find(idle.model) == kept  # and kept across a save
    # without an earlier run, the busy phases stay unmeasured: llama.cpp's defaults
    alone = WisdomFile(wisdom_file()).put(busy)
    assert alone.threads is None and set(alone.unmeasured) == {"threads", "depth"}
    assert "not measured (machine busy)" in describe_wisdom(alone)
