"""KV types and flash attention chosen together, for the run's shape, from
the rates `localrun tune` keeps (hand-written rates through the real
planning code; no clock)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from localrun.assemble import OneSequence, Prompts, Slots, assemble, run_shape
from localrun.cli.serve import _plans as serve_plans
from localrun.gguf.info import describe
from localrun.gguf.reader import read_gguf
from localrun.settings import Options, RunSettings, resolve
from localrun.tune import apply as tuned
from localrun.tune.machine import this_machine
from localrun.tune.wisdom import (
    VERIFY_DEPTH,
    VERSION,
    Attention,
    Decision,
    ModelKey,
    Rates,
    RunShape,
    Wisdom,
    WisdomFile,
    parse_setting,
    wisdom_file,
)
from localrun.ui.tune import describe as describe_wisdom
from tests.helpers import cli

# Modelled on the 0.5B on a Xeon: flash attention on fills a prompt
# fastest, but its decode step grows with depth; off decodes flat; q8_0 (which
# needs it on) decodes like off but fills slowest.
RATES = Rates(
    fill_depths=(300, 800),
    fill_tps={"f16/f16 fa on": (200.0, 180.0), "f16/f16 fa off": (150.0, 140.0), "q8_0/q8_0 fa on": (120.0, 110.0)},
    decode_depths=(32, 560, 1088),
    decode_ms={
        "f16/f16 fa on": (40.0, 46.5, 53.0),
        "f16/f16 fa off": (40.0, 40.0, 40.0),
        "q8_0/q8_0 fa on": (39.0, 39.5, 40.0),
    },
    chunk=256,
)
LONG_PROMPT = RunShape(1800, 64)
LONG_ANSWER = RunShape(32, 512)


def _wisdom(model: Path, rates: Rates | None = RATES, **fields: Any) -> Wisdom:
    return dataclasses.replace(
        Wisdom(this_machine(), ModelKey.of(model), "f16/f16", "2026-12-07T00:00:00+00:00", rates=rates), **fields
    )


def _apply(
    model: Path, wisdom: Wisdom | None, run: RunShape | None, options: Options | None = None, **kw: Any
) -> RunSettings:
    shape = describe(read_gguf(model))
    return tuned.apply(resolve(options or Options()), shape, wisdom, need=kw.pop("need", 2000), run=run, **kw)


def test_predictions_follow_the_lines() -> None:
    # a prompt of 1,800 at the fill line's cost at depth 900, then 64 decode steps around depth 1,832
    on = 1800 * (1e3 / 200 + (1e3 / 180 - 1e3 / 200) / 500 * 600) + 64 * (40.0 + 13.0 / 1056 * (1832 - 32))
    assert RATES.seconds("f16/f16 fa on", LONG_PROMPT) == pytest.approx(on / 1e3)
    assert RATES.seconds("f16/f16 fa off", LONG_ANSWER) == pytest.approx(
        (32 * (1e3 / 150 + 0) + 512 * 40.0) / 1e3, rel=0.02
    )
    # a noisy line that falls with depth is held flat: a deeper run never predicts cheaper
    falling = dataclasses.replace(RATES, decode_ms={**RATES.decode_ms, "f16/f16 fa off": (44.0, 40.0, 42.0)})
    assert falling.seconds("f16/f16 fa off", RunShape(32, 512, start=4000)) >= falling.seconds(
        "f16/f16 fa off", RunShape(32, 512)
    )


def test_a_long_prompt_and_a_long_answer_pick_differently(wide_model: Path) -> None:
    """The same rates: a long prompt keeps llama.cpp's flash attention (its
    fill is fastest), a long answer takes it off (its decode does not grow);
    q8_0 decodes as fast but fills slowest, so neither takes it."""
    wisdom = _wisdom(wide_model)
    long_prompt = _apply(wide_model, wisdom, LONG_PROMPT)
    assert (long_prompt.type_k, long_prompt.type_v, long_prompt.flash_attn) == ("f16", "f16", "auto")
    assert long_prompt.sources.get("flash_attn", "default") == "default"
    assert "predicted fastest" in long_prompt.reasons["flash_attn"]
    assert "1,800-token prompt and 64-token answer" in long_prompt.reasons["flash_attn"]
    long_answer = _apply(wide_model, wisdom, LONG_ANSWER)
    assert (long_answer.type_k, long_answer.flash_attn) == ("f16", "off")
    assert long_answer.sources["flash_attn"] == "wisdom"
    why = long_answer.reasons["flash_attn"]
    assert why.startswith("off: predicted") and "as fast as f16/f16 fa on" in why and "localrun tune's rates" in why
    assert "q8_0/q8_0 fa on" in why  # every setting weighed is shown with its prediction
    assert long_answer.reasons["kv"].startswith("f16/f16: ")
    # the old KV race (every type with flash attention on, decode alone) would have taken q8_0 here
    assert RATES.decode_ms["q8_0/q8_0 fa on"][-1] < RATES.decode_ms["f16/f16 fa on"][-1]


def test_the_kv_type_and_flash_attention_are_one_decision(wide_model: Path) -> None:
    """Where q8_0 with flash attention on beats f16 in either mode for this
    shape, both are taken together: the KV type, and the flash attention it needs."""
    faster = dataclasses.replace(
        RATES,
        fill_tps={**RATES.fill_tps, "q8_0/q8_0 fa on": (210.0, 200.0)},
        decode_ms={**RATES.decode_ms, "q8_0/q8_0 fa on": (34.0, 35.0, 36.0)},
    )
    settled = _apply(wide_model, _wisdom(wide_model, faster), LONG_ANSWER)
    assert (settled.type_k, settled.type_v, settled.flash_attn) == ("q8_0", "q8_0", "on")
    assert settled.sources["type_k"] == "wisdom" and settled.sources["flash_attn"] == "wisdom"
    assert "q8_0/q8_0 fa on" in settled.reasons["kv"] and "fit at f16" in settled.reasons["kv"]
    # a KV type that does not fit the memory is never picked, however fast; nor is a mode the user ruled out
    shape = describe(read_gguf(wide_model))
    tight = shape.memory_needed(2000, "q8_0", "q8_0") - 1
    small = _apply(wide_model, _wisdom(wide_model, faster), LONG_ANSWER, budget=tight)
    assert (small.type_k, small.type_v) == ("q8_0", "q4_0")  # the only pair that fits: not measured, so capacity alone
    pinned = _apply(wide_model, _wisdom(wide_model), LONG_ANSWER, Options(flash_attn="on"))
    # with flash attention on, as the user said, q8_0 decodes this long answer faster than f16 does
    assert (pinned.type_k, pinned.flash_attn) == ("q8_0", "on") and pinned.sources["flash_attn"] == "option"
    assert _apply(wide_model, _wisdom(wide_model), LONG_PROMPT, Options(flash_attn="on")).type_k == "f16"
    given_kv = _apply(wide_model, _wisdom(wide_model, faster), LONG_ANSWER, Options(kv="f16"))
    assert (given_kv.type_k, given_kv.flash_attn) == ("f16", "off")  # the best of what is left


def test_a_tie_and_a_red_flag_keep_llama_cpps_defaults(wide_model: Path) -> None:
    alike = dataclasses.replace(
        RATES,
        fill_tps=dict.fromkeys(RATES.fill_tps, (200.0, 180.0)),
        decode_ms=dict.fromkeys(RATES.decode_ms, (40.0, 40.5, 41.0)),
    )
    settled = _apply(wide_model, _wisdom(wide_model, alike), LONG_ANSWER)
    assert (settled.type_k, settled.flash_attn) == ("f16", "auto") and "alike" in settled.reasons["flash_attn"]
    assert "wisdom" not in (settled.sources.get("type_k"), settled.sources.get("flash_attn"))
    busy = dataclasses.replace(RATES, decode_ms={**RATES.decode_ms, "f16/f16 fa on": (400.0, 460.0, 530.0)})
    flagged = _apply(wide_model, _wisdom(wide_model, busy), LONG_ANSWER)
    assert flagged.flash_attn == "auto" and "more than a setting gives" in flagged.reasons["flash_attn"]
    # rates of other KV types alone (`localrun tune --kv q8_0`) have nothing to weigh f16 against: f16 stands
    only_q8 = Rates(
        RATES.fill_depths,
        {"q8_0/q8_0 fa on": (400.0, 390.0)},
        RATES.decode_depths,
        {"q8_0/q8_0 fa on": (10.0, 10.0, 10.0)},
    )
    assert _apply(wide_model, _wisdom(wide_model, only_q8, kv="q8_0/q8_0"), LONG_ANSWER).type_k == "f16"
    # 5% apart decides on quiet rates, and is a tie on rates whose samples spread 8%
    apart = RATES.pick(LONG_ANSWER, "f16/f16 fa on")
    assert apart.label == "f16/f16 fa off"
    assert dataclasses.replace(RATES, noise=0.2).pick(LONG_ANSWER, "f16/f16 fa on").label is None


def test_without_rates_the_defaults_and_the_old_rules_hold(wide_model: Path) -> None:
    """No wisdom: llama.cpp's defaults. Wisdom from before the rates: flash
    attention from its curve at the run's depth, the KV type for capacity
    alone (its KV race ran flash attention on for every type), with a note
    to tune again."""
    plain = _apply(wide_model, None, LONG_ANSWER)
    assert (plain.type_k, plain.type_v, plain.flash_attn) == ("f16", "f16", "auto")
    old = _wisdom(
        wide_model,
        None,
        flash_attn=Attention((32, 1024), off_ms=(10.0, 11.0), on_ms=(8.0, 14.0)),
        kv_cost=Decision("q8_0/q8_0", {"f16/f16": 53.2, "q8_0/q8_0": 41.3}, "ms/token"),
        kv_depth=1088,
    )
    settled = _apply(wide_model, old, LONG_ANSWER, depth=1000)
    assert (settled.type_k, settled.type_v) == ("f16", "f16") and settled.sources.get("type_k") != "wisdom"
    assert "localrun tune` measures the model again" in settled.reasons["kv"]
    assert settled.flash_attn == "off"  # the curve at depth 1,000
    assert "`localrun tune` again" in describe_wisdom(old)
    assert _apply(wide_model, old, LONG_ANSWER, depth=40).flash_attn == "on"


def test_an_old_wisdom_file_loads_and_is_written_back_with_rates(wide_model: Path) -> None:
    old = _wisdom(wide_model, None, threads=Decision(1, {"2": 40.0, "1": 20.0}, "ms/token"))
    raw = old.as_dict()
    del raw["rates"]  # version 1 had no such field
    path = wisdom_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": 1, "entries": [raw], "hinted": []}))
    found = WisdomFile.load()
    assert found.problems == [] and found.entries == [old] and found.entries[0].rates is None
    found.put(_wisdom(wide_model))
    found.save()
    again = json.loads(path.read_text())
    assert again["version"] == VERSION == 2
    assert WisdomFile.load().find(ModelKey.of(wide_model)) == _wisdom(wide_model)


def test_rates_round_trip_and_bad_rates_are_refused(wide_model: Path) -> None:
    assert Rates.from_dict(RATES.as_dict()) == RATES
    assert parse_setting("q8_0/q4_0 fa on") == ("q8_0", "q4_0", "on")
    bad = RATES.as_dict() | {"fill_tps": {"f16/f16 fa on": [200.0]}}  # one figure for two depths
    with pytest.raises(ValueError, match="do not match"):
        Rates.from_dict(bad)
    with pytest.raises(ValueError, match="not a KV and flash-attention setting"):
        parse_setting("f16 fa maybe")
    entry = _wisdom(wide_model).as_dict()
    path = wisdom_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": 2, "entries": [entry | {"rates": bad}, entry]}))
    found = WisdomFile.load()
    assert len(found.entries) == 1 and "entry 1" in found.problems[0]


def test_each_kind_of_run_has_its_shape() -> None:
    settings = resolve(Options())
    generate = run_shape(OneSequence(need=2000, depth=1900, prompt=1800, answer=64), settings)
    assert generate == RunShape(1800, 64, what="the prompt estimated from its characters, --max-tokens")
    open_answer = run_shape(OneSequence(prompt=40), settings)
    assert open_answer is not None and open_answer.answer == tuned.OPEN_ANSWER
    chat = run_shape(OneSequence(depth=2048), settings)
    assert chat == RunShape(tuned.CHAT_MESSAGE, tuned.OPEN_ANSWER, 2048, what="a turn at the chat's middle")
    batch = run_shape(Prompts((600, 700, 900), prompts=(100, 200, 400), answers=(500, 500, 0)), settings)
    assert batch is not None and (batch.prompt, batch.answer) == (200, 500)
    assert run_shape(Prompts((600,)), settings) is None  # prompts not counted: no shape
    serve = run_shape(Slots(), resolve(Options(ctx="8192")))
    assert serve is not None and (serve.prompt, serve.answer, serve.start) == (4096, tuned.OPEN_ANSWER, 0)


def test_a_runs_plan_carries_how_its_step_grows_with_the_context(wide_model: Path) -> None:
    """For the verify curve at depth (`StepGrowth`): the decode line of the
    setting the run settled on, from the curve's depth; none without rates."""
    f = WisdomFile.load()
    f.put(_wisdom(wide_model))
    f.save()
    on = assemble(wide_model, resolve(Options()), workload=OneSequence(prompt=1800, answer=64), devices=[])
    assert on.config.flash_attn == "auto"  # llama.cpp's: on, as the rates name it
    slope = 13.0 / 1056
    growth = on.step_growth
    assert growth is not None and growth.depth == VERIFY_DEPTH
    assert growth.base_ms == pytest.approx(40.0 - 32 * slope) and growth.per_token_ms == pytest.approx(slope)
    assert growth.at(1088) == pytest.approx(53.0 / 40.0)
    off = assemble(wide_model, resolve(Options()), workload=OneSequence(prompt=32, answer=512), devices=[])
    assert off.config.flash_attn == "off" and off.step_growth is not None
    assert off.step_growth.at(4000) == 1.0  # its line is flat
    assert assemble(wide_model, resolve(Options()), devices=[], use_wisdom=False).step_growth is None


@pytest.mark.usefixtures("quiet")
def test_generate_and_show_say_why(wide_model: Path) -> None:
    f = WisdomFile.load()
    f.put(_wisdom(wide_model))
    f.save()
    res = cli("generate", "-m", str(wide_model), "-n", "300", "-t", "0", "--spec", "none", "--json", "hi")
    assert res.returncode == 0, res.stderr
    settings = json.loads(res.stdout.splitlines()[-1])["settings"]
    assert settings["flash_attn"]["value"] == "off" and settings["flash_attn"]["source"] == "wisdom", settings
    assert (
        "300-token answer" in settings["flash_attn"]["why"] and "localrun tune's rates" in settings["flash_attn"]["why"]
    )
    chat = cli("chat", "-m", str(wide_model), "-n", "2", "-t", "0", "--json", input="hi\n")
    assert chat.returncode == 0, chat.stderr
    settings = json.loads(chat.stdout.splitlines()[-1])["settings"]
    assert settings["flash_attn"]["value"] == "off" and "a turn at the chat's middle" in settings["flash_attn"]["why"]
    # serve: a request filling half its slot, and an open answer
    plans = serve_plans([str(wide_model)], Options(), offline=True, verbose=False, queue=4)
    assert RATES.pick(RunShape(2048, tuned.OPEN_ANSWER), "f16/f16 fa on").label == "f16/f16 fa off"
    assert plans[0].config.flash_attn == "off"
    shown = cli("show", str(wide_model), "--json")
    assert shown.returncode == 0, shown.stderr
    record = json.loads(shown.stdout)
    assert record["flash_attn_auto"] == "by shape"
    picks = {row["shape"]["what"]: row for row in record["kv_flash_attn_by_shape"]}
    assert picks["a long prompt, a short answer"]["setting"] == "f16/f16 fa on"
    assert picks["a long prompt, a short answer"]["source"] == "default"
    assert picks["a short prompt, a long answer"]["setting"] == "f16/f16 fa off"
    assert picks["a short prompt, a long answer"]["source"] == "wisdom"
    text = cli("show", str(wide_model))
    assert "a short prompt, a long answer): f16/f16 fa off" in text.stdout, text.stdout
    tuned_text = cli("tune", "--show", str(wide_model))
    assert "f16/f16 fa off" in tuned_text.stdout and "prompt tok/s at depth 300 / 800" in tuned_text.stdout
