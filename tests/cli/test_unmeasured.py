"""A tune that kept no rate, and a pull on a busy machine (issue 54):
`doctor` says what to do instead of "no rates tokens/s", and `pull` does not
spend a minute measuring what a busy machine would have discarded."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from localrun import doctor
from localrun.cli import _env, models
from localrun.runtime import load
from localrun.store.registry import Registry
from localrun.tune.machine import this_machine
from localrun.tune.wisdom import ModelKey, Wisdom, WisdomFile
from localrun.ui.doctor import describe


def test_doctor_says_a_tune_kept_no_rate(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor, "gpu_vendor", lambda: None)
    wisdom = WisdomFile.load()
    wisdom.put(Wisdom(this_machine(), ModelKey.of(tiny_model), "f16/f16", "2026-12-05T00:00:00+00:00"))
    wisdom.save()
    report = doctor.examine(Registry({}, default=str(tiny_model)))
    assert report.model.speed is None and report.model.placement is not None
    shown = describe(report)
    assert "no rates" not in shown and "speed here" not in shown
    assert "no speed kept from the tune of 2026-12-05" in shown and "on a quiet machine" in shown


@pytest.mark.parametrize(("others", "measured"), [(3, False), (0, True)])
def test_pull_measures_only_on_a_quiet_machine(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch, others: int, measured: bool
) -> None:
    import localrun.cli.tune

    monkeypatch.setattr(load, "runnable_others", lambda: others)
    tuned: list[Path] = []
    monkeypatch.setattr(localrun.cli.tune, "run_tune", tuned.append)
    err = io.StringIO()
    _env.use(_env.Environment(stdin=io.StringIO(), stdout=io.StringIO(), stderr=err))
    try:
        models._tune_once(tiny_model)
    finally:
        _env.use(None)
    assert tuned == ([tiny_model] if measured else [])
    if not measured:
        assert "not measuring tiny.gguf now (machine busy: other processes ran during 5 of its 5 readings)" in (
            err.getvalue()
        )
